// A probe for compute-sanitizer initcheck, not a test of Tessera's code: run4 of 2026-11-26
// (docs/gpu_results/2026-11-26-fifth) saw initcheck report "uninitialized __global__ memory read"
// in linear_cross_entropy's row_kernel on the logits scratch that a cuBLAS GEMM had just written.
// This test does exactly that and nothing else: a never-initialized buffer, the logits GEMM with
// the arguments LCE uses (w as [V, H], transposed; f32; our counted workspace), then the row
// kernel's 16-byte loads. Under plain runs it checks the values; under initcheck, a report here
// means the tool does not see cuBLAS's stores (so LCE's reports are the tool's), no report means
// LCE's are real. gpu_check.sh's sanitize stage runs it first and alone.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cuda_util.h"

namespace tessera::testing {
void launch_row_sums(const float* m, int64_t rows, int64_t cols, int64_t ld, float* sums, cudaStream_t stream);
}

namespace tessera::cuda {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <class T>
T* device_copy(const std::vector<T>& host) {
  void* p = nullptr;
  check(cudaMalloc(&p, host.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return static_cast<T*>(p);
}

TEST(SanitizerProbe, ACublasProductReadWithVectorLoads) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t B = 24, H = 32, V = 80;  // CallCuda's LCE case: ldz = V
  std::vector<float> x(B * H), w(V * H);
  for (int64_t i = 0; i < B * H; ++i) x[i] = 0.5f * std::sin(0.37f * static_cast<float>(i));
  for (int64_t i = 0; i < V * H; ++i) w[i] = 0.3f * std::cos(0.11f * static_cast<float>(i));
  float* dx = device_copy(x);
  float* dw = device_copy(w);
  void *z = nullptr, *sums = nullptr, *ws = nullptr;
  const size_t ws_bytes = 1 << 20;
  check(cudaMalloc(&z, B * V * sizeof(float)), "cudaMalloc");  // never initialized: the GEMM writes it
  check(cudaMalloc(&sums, B * sizeof(float)), "cudaMalloc");
  check(cudaMalloc(&ws, ws_bytes), "cudaMalloc");
  {
    BlasHandle blas(0, nullptr);
    blas.set_workspace(ws, ws_bytes);
    // Zᵀ[V, B] = Wᵀ... as LCE: op(W)[V, H] · xᵀ[H, B], W stored [V, H] row-major = [H, V] column-major.
    gemm_ex(blas.get(), blas_compute(DType::kF32), CUBLAS_OP_T, CUBLAS_OP_N, V, B, H, 1.0f, {dw, CUDA_R_32F, H},
            {dx, CUDA_R_32F, H}, 0.0f, z, CUDA_R_32F, V, "probe GEMM");
    testing::launch_row_sums(static_cast<const float*>(z), B, V, V, static_cast<float*>(sums), nullptr);
    check(cudaDeviceSynchronize(), "probe");
  }
  std::vector<float> got(B);
  check(cudaMemcpy(got.data(), sums, B * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (int64_t t = 0; t < B; ++t) {
    double want = 0;
    for (int64_t v = 0; v < V; ++v)
      for (int64_t h = 0; h < H; ++h) want += static_cast<double>(x[t * H + h]) * w[v * H + h];
    // Σ of 80·32 products of magnitude ≤ 0.15 in f32: 1e-3 absolute is ~100× the rounding.
    EXPECT_NEAR(got[t], want, 1e-3) << "row " << t;
  }
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dw), z, sums, ws}) cudaFree(p);
}

}  // namespace
}  // namespace tessera::cuda
