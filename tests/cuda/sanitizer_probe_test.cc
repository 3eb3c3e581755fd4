// A probe for compute-sanitizer, not a test of Tessera's code: run4 of 2026-11-26
// (docs/gpu_results/2026-11-26-fifth) saw initcheck report "uninitialized __global__ memory read"
// in linear_cross_entropy's row_kernel on the logits scratch that a cuBLAS GEMM had just written.
// This test does exactly that and nothing else: a never-initialized buffer, the logits GEMM with
// the arguments LCE uses (operand dtype, weight layout, rows, our counted workspace), then the row
// kernel's 16-byte loads. Under plain runs it checks the values; under initcheck, a report here
// means the tool does not see that cuBLAS kernel's stores (so LCE's reports are the tool's), no
// report means LCE's are real. Under racecheck, a fault at "after the cuBLAS GEMM" is the tool's
// handling of cuBLAS's kernel, not ours. The cases: the f32 one of run6 (0 reports unfiltered),
// the two bf16 ones where run9 of 2026-11-27 (docs/gpu_results/2026-11-27-eighth) saw initcheck's
// reports and racecheck's "failed to handle a hardware exception", and the f16 one of
// RowPaths/LceCudaRowPaths, whose initcheck reports run13 (docs/gpu_results/2026-11-27-tenth)
// could not attribute (the tool printed only the first 100, all in a bf16 case).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda_util.h"
#include "tessera/dtype.h"

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

struct ProbeGemm {
  const char* name;
  DType dtype;     // x and w (f32, bf16 or f16); the product is always f32, as LCE's logits
  bool hv;         // w stored [H, V] (else [V, H], LCE's default layout)
  int64_t B, H, V;
  size_t workspace;  // bytes handed to cuBLAS, as LCE carves them out of its budget
};

// Host values as the device sees them (rounded to bf16 / f16 for those), and their device copy.
struct Operand {
  std::vector<double> values;
  void* dev = nullptr;
};

Operand make_operand(int64_t n, DType dt, float scale, float freq) {
  Operand o;
  std::vector<float> f(static_cast<size_t>(n));
  std::vector<uint16_t> h(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float v = scale * std::sin(freq * static_cast<float>(i) + 0.3f);
    if (dt == DType::kBF16) {
      h[static_cast<size_t>(i)] = f32_to_bf16(v);
      v = bf16_to_f32(h[static_cast<size_t>(i)]);
    } else if (dt == DType::kF16) {
      h[static_cast<size_t>(i)] = f32_to_f16(v);
      v = f16_to_f32(h[static_cast<size_t>(i)]);
    }
    f[static_cast<size_t>(i)] = v;
    o.values.push_back(v);
  }
  o.dev = dt == DType::kF32 ? static_cast<void*>(device_copy(f)) : static_cast<void*>(device_copy(h));
  return o;
}

class SanitizerProbe : public ::testing::TestWithParam<ProbeGemm> {};

TEST_P(SanitizerProbe, ACublasProductReadWithVectorLoads) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const ProbeGemm& c = GetParam();
  const int64_t B = c.B, H = c.H, V = c.V, ldz = (V + 7) / 8 * 8;  // LCE's logits row stride
  const Operand x = make_operand(B * H, c.dtype, 0.5f, 0.37f), w = make_operand(V * H, c.dtype, 0.3f, 0.11f);
  void *z = nullptr, *sums = nullptr, *ws = nullptr;
  check(cudaMalloc(&z, static_cast<size_t>(B * ldz) * sizeof(float)), "cudaMalloc");  // never initialized
  check(cudaMalloc(&sums, static_cast<size_t>(B) * sizeof(float)), "cudaMalloc");
  check(cudaMalloc(&ws, c.workspace), "cudaMalloc");
  {
    BlasHandle blas(0, nullptr);
    blas.set_workspace(ws, c.workspace);
    // As LCE: Zᵀ[V, B] = op(W)[V, H] · xᵀ[H, B] in column-major terms, Z row stride ldz.
    const cudaDataType t = blas_type(c.dtype);
    gemm_ex(blas.get(), blas_compute(c.dtype), c.hv ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, V, B, H, 1.0f,
            {w.dev, t, c.hv ? V : H}, {x.dev, t, H}, 0.0f, z, CUDA_R_32F, ldz, "probe GEMM");
    check(cudaDeviceSynchronize(), "after the cuBLAS GEMM");
    testing::launch_row_sums(static_cast<const float*>(z), B, V, ldz, static_cast<float*>(sums), nullptr);
    check(cudaDeviceSynchronize(), "after the row-sums kernel");
  }
  std::vector<float> got(static_cast<size_t>(B));
  check(cudaMemcpy(got.data(), sums, got.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (int64_t b = 0; b < B; ++b) {
    double want = 0, mag = 0;
    for (int64_t v = 0; v < V; ++v)
      for (int64_t h = 0; h < H; ++h) {
        const double wv = w.values[static_cast<size_t>(c.hv ? h * V + v : v * H + h)];
        want += x.values[static_cast<size_t>(b * H + h)] * wv;
        mag += std::fabs(x.values[static_cast<size_t>(b * H + h)] * wv);
      }
    // f32 sums of products (exact for bf16·bf16 and f16·f16, one rounding for f32), H terms per
    // logit then V per row: |error| <= (H + V + 1)·2⁻²⁴·Σ|terms| (the worst-case bound of recursive summation).
    const double tol = static_cast<double>(H + V + 1) * std::ldexp(1.0, -24) * mag + 1e-6;
    EXPECT_NEAR(got[static_cast<size_t>(b)], want, tol) << c.name << ", row " << b;
  }
  for (void* p : {x.dev, w.dev, z, sums, ws}) cudaFree(p);
}

INSTANTIATE_TEST_SUITE_P(
    Gemms, SanitizerProbe,
    ::testing::Values(
        // CallCuda's LCE case (f32, w [V, H], ldz = V): 0 initcheck reports in run6.
        ProbeGemm{"f32_vh_V80", DType::kF32, false, 24, 32, 80, size_t{1} << 20},
        // LceCudaChunks case4 (bf16, w [H, V], V 128, a 20 KiB budget: 16 KiB of workspace, 7 rows).
        ProbeGemm{"bf16_hv_V128_ws16k", DType::kBF16, true, 7, 24, 128, size_t{16} << 10},
        // LceCudaBackwardWithLse case52 (bf16, w [H, V], V 2112, chunks of 8 rows, the default
        // 1 GiB budget's 16 MiB of workspace on Hopper).
        ProbeGemm{"bf16_hv_V2112", DType::kBF16, true, 8, 24, 2112, size_t{16} << 20},
        // RowPaths/LceCudaRowPaths case2 (f16, w [H, V], V 2112, 23 rows, the same workspace):
        // whether initcheck follows cuBLAS's f16 kernels (LCE's f16 reports) and racecheck
        // survives them (Upstream/LceCudaF16Scale, f16 with V 40000, never reached yet).
        ProbeGemm{"f16_hv_V2112", DType::kF16, true, 23, 24, 2112, size_t{16} << 20}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tessera::cuda
