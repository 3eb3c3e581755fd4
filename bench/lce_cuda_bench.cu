// Benchmark of the cuda linear_cross_entropy backend against three plain cuBLAS GEMMs of the same
// shape, timed in the same run with CUDA events (warm-up, then the median of repeats; the first
// call is reported apart). Writes one JSON document (stdout, or --out FILE).
//
//   lce_cuda_bench [--shapes BxHxV,...] [--dtype bf16|f16|f32] [--dw-dtype f32|same]
//                  [--warmup N] [--iters N] [--budget BYTES] [--out FILE]
//
// w is [V, H] row-major (PyTorch lm_head.weight); labels uniform, no ignored rows; reduction mean.
// The three-GEMM baseline: logits = x·wᵀ (16-bit out), dx = logits·w (16-bit out),
// dw = logitsᵀ·x (f32 out), all f32-accumulated, on the same inputs.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/memory.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace lce = tessera::linear_cross_entropy;
using tessera::Device;
using tessera::DType;
using tessera::Tensor;

namespace {

#define CK(expr)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (expr);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #expr); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define CB(expr)                                                                              \
  do {                                                                                        \
    cublasStatus_t s_ = (expr);                                                               \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                        \
      std::fprintf(stderr, "cuBLAS error %s at %s:%d\n", cublasGetStatusString(s_), __FILE__, __LINE__); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

__device__ inline uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ inline float uniform(uint64_t seed, int64_t i) {  // [-1, 1)
  return static_cast<float>(mix(seed ^ static_cast<uint64_t>(i) * 0x2545F4914F6CDD1Dull) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <class T>
__global__ void fill_uniform(T* p, int64_t n, float scale, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = scale * uniform(seed, i);
    if constexpr (sizeof(T) == 4)
      p[i] = v;
    else if constexpr (std::is_same_v<T, __half>)
      p[i] = __float2half_rn(v);
    else
      p[i] = __float2bfloat16_rn(v);
  }
}

__global__ void fill_labels(int64_t* p, int64_t n, int64_t V, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = static_cast<int64_t>(mix(seed + static_cast<uint64_t>(i)) % static_cast<uint64_t>(V));
}

void fill(const Tensor& t, float scale, uint64_t seed) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kF32: fill_uniform<float><<<1024, 256>>>(t.data_as<float>(), n, scale, seed); break;
    case DType::kBF16: fill_uniform<__nv_bfloat16><<<1024, 256>>>(t.data_as<__nv_bfloat16>(), n, scale, seed); break;
    default: fill_uniform<__half><<<1024, 256>>>(t.data_as<__half>(), n, scale, seed); break;
  }
  CK(cudaGetLastError());
}

struct Timing {
  double first_ms = 0, median_ms = 0, min_ms = 0;
};

template <class F>
Timing time_it(F&& f, int warmup, int iters, cudaStream_t s) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  Timing t;
  auto once = [&] {
    CK(cudaEventRecord(a, s));
    f();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return static_cast<double>(ms);
  };
  t.first_ms = once();
  for (int i = 0; i < warmup; ++i) once();
  std::vector<double> v;
  for (int i = 0; i < iters; ++i) v.push_back(once());
  std::sort(v.begin(), v.end());
  t.median_ms = v[v.size() / 2];
  t.min_ms = v.front();
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return t;
}

std::string timing_json(const Timing& t) {
  std::ostringstream os;
  os << "{\"first_ms\": " << t.first_ms << ", \"median_ms\": " << t.median_ms << ", \"min_ms\": " << t.min_ms << "}";
  return os.str();
}

cudaDataType cuda_type(DType t) {
  return t == DType::kF32 ? CUDA_R_32F : t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shapes = "8192x4096x128256,8192x2304x256000", out_path, dtype_s = "bf16", dw_s = "f32";
  int warmup = 3, iters = 10;
  size_t budget = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value after %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--shapes") shapes = next();
    else if (a == "--dtype") dtype_s = next();
    else if (a == "--dw-dtype") dw_s = next();
    else if (a == "--warmup") warmup = std::atoi(next().c_str());
    else if (a == "--iters") iters = std::max(1, std::atoi(next().c_str()));
    else if (a == "--budget") budget = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--out") out_path = next();
    else {
      std::fprintf(stderr, "usage: %s [--shapes BxHxV,...] [--dtype bf16|f16|f32] [--dw-dtype f32|same] "
                           "[--warmup N] [--iters N] [--budget BYTES] [--out FILE]\n", argv[0]);
      return 2;
    }
  }
  const DType dt = tessera::parse_dtype(dtype_s);
  const DType dw_dt = dw_s == "same" ? dt : DType::kF32;

  int dev = 0;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t h;
  CB(cublasCreate(&h));
  CB(cublasSetStream(h, stream));
  CB(cublasSetMathMode(h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));

  std::ostringstream js;
  js << "{\n  \"device\": \"" << prop.name << "\",\n  \"sm_count\": " << prop.multiProcessorCount
     << ",\n  \"dtype\": \"" << dtype_s << "\",\n  \"dw_dtype\": \"" << tessera::dtype_name(dw_dt)
     << "\",\n  \"warmup\": " << warmup << ", \"iters\": " << iters << ",\n  \"memory_budget\": " << budget
     << ",\n  \"results\": [";
  bool first_row = true;
  std::stringstream ss(shapes);
  std::string item;
  while (std::getline(ss, item, ',')) {
    long long B = 0, H = 0, V = 0;
    if (std::sscanf(item.c_str(), "%lldx%lldx%lld", &B, &H, &V) != 3) {
      std::fprintf(stderr, "bad shape '%s' (want BxHxV)\n", item.c_str());
      return 2;
    }
    if (B < 1 || H < 1 || V < 1 || B > (1ll << 30) || H > (1ll << 30) || V > (1ll << 30)) {
      std::fprintf(stderr, "shape '%s' out of range\n", item.c_str());
      return 2;
    }
    std::fprintf(stderr, "shape B=%lld H=%lld V=%lld %s ...\n", B, H, V, dtype_s.c_str());
    const int Bi = static_cast<int>(B), Hi = static_cast<int>(H), Vi = static_cast<int>(V);
    const Device d = Device::cuda(dev);
    Tensor x = Tensor::empty(dt, {B, H}, d), w = Tensor::empty(dt, {V, H}, d);
    Tensor labels = Tensor::empty(DType::kI64, {B}, d);
    fill(x, 1.0f, 1);
    fill(w, 3.0f / std::sqrt(static_cast<float>(H)), 2);
    fill_labels<<<256, 256>>>(labels.data_as<int64_t>(), B, V, 3);
    CK(cudaGetLastError());
    Tensor one = Tensor::empty(DType::kF32, {}, Device::cpu());
    one.data_as<float>()[0] = 1.0f;
    const Tensor grad = one.to(d);
    Tensor loss = Tensor::empty(DType::kF32, {}, d), lse = Tensor::empty(DType::kF32, {B}, d);
    Tensor dx = Tensor::empty(dt, {B, H}, d), dw = Tensor::empty(dw_dt, {V, H}, d);
    CK(cudaDeviceSynchronize());

    lce::Options opt;
    opt.implementation = "cuda";
    opt.stream = stream;
    opt.memory_budget = budget;
    const lce::Inputs in{x.view(), w.view(), std::nullopt, labels.view(), std::nullopt};
    const lce::ForwardOutputs fo{loss.view(), lse.view(), std::nullopt};
    const lce::Gradients g{dx.view(), dw.view(), std::nullopt};

    using tessera::memory::Space;
    auto peak_extra = [&](auto&& f) {
      CK(cudaDeviceSynchronize());
      const size_t before = tessera::memory::current_bytes(Space::kDevice);
      tessera::memory::reset_peak(Space::kDevice);
      f();
      CK(cudaStreamSynchronize(stream));
      return tessera::memory::peak_bytes(Space::kDevice) - before;
    };
    const Timing t_fwd = time_it([&] { lce::forward(in, fo, opt); }, warmup, iters, stream);
    const size_t mem_fwd = peak_extra([&] { lce::forward(in, fo, opt); });
    const Timing t_fb = time_it([&] { lce::forward_backward(in, grad.view(), fo, g, opt); }, warmup, iters, stream);
    const size_t mem_fb = peak_extra([&] { lce::forward_backward(in, grad.view(), fo, g, opt); });
    float loss_host = 0;
    CK(cudaMemcpy(&loss_host, loss.data(), 4, cudaMemcpyDeviceToHost));

    // Three cuBLAS GEMMs of the same shape (the logits materialized in 16 bits).
    Timing t_g1, t_g3;
    {
      Tensor logits = Tensor::empty(dt, {B, V}, d), dx2 = Tensor::empty(dt, {B, H}, d),
             dw2 = Tensor::empty(DType::kF32, {V, H}, d);
      const cudaDataType ct = cuda_type(dt);
      const float one_f = 1.0f, zero_f = 0.0f;
      auto g1 = [&] {  // logits[B,V] = x·wᵀ; col-major: [V,B] = w(op T of [H,V]) · x([H,B])
        CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, Vi, Bi, Hi, &one_f, w.data(), ct, Hi, x.data(), ct, Hi, &zero_f,
                        logits.data(), ct, Vi, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      auto g2 = [&] {  // dx[B,H] = logits·w; col-major: [H,B] = w([H,V]) · logits([V,B])
        CB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, Hi, Bi, Vi, &one_f, w.data(), ct, Hi, logits.data(), ct, Vi, &zero_f,
                        dx2.data(), ct, Hi, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      auto g3 = [&] {  // dw[V,H] = logitsᵀ·x; col-major: [H,V] = x([H,B]) · logits(op T of [V,B])
        CB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, Hi, Vi, Bi, &one_f, x.data(), ct, Hi, logits.data(), ct, Vi, &zero_f,
                        dw2.data(), CUDA_R_32F, Hi, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      t_g1 = time_it(g1, warmup, iters, stream);
      t_g3 = time_it([&] { g1(); g2(); g3(); }, warmup, iters, stream);
      CK(cudaDeviceSynchronize());
    }
    const double flop1 = 2.0 * static_cast<double>(B) * static_cast<double>(H) * static_cast<double>(V);
    const double fb_ratio = t_fb.median_ms / t_g3.median_ms;
    std::ostringstream row;
    row << (first_row ? "\n" : ",\n") << "    {\"B\": " << B << ", \"H\": " << H << ", \"V\": " << V
        << ", \"loss\": " << loss_host
        << ",\n     \"forward\": " << timing_json(t_fwd) << ",\n     \"forward_backward\": " << timing_json(t_fb)
        << ",\n     \"gemm1\": " << timing_json(t_g1) << ",\n     \"gemm3\": " << timing_json(t_g3)
        << ",\n     \"forward_tflops\": " << flop1 / (t_fwd.median_ms * 1e9)
        << ", \"forward_backward_tflops\": " << 3 * flop1 / (t_fb.median_ms * 1e9)
        << ", \"gemm3_tflops\": " << 3 * flop1 / (t_g3.median_ms * 1e9)
        << ",\n     \"forward_vs_gemm1\": " << t_fwd.median_ms / t_g1.median_ms
        << ", \"forward_backward_vs_gemm3\": " << fb_ratio
        << ",\n     \"peak_extra_bytes_forward\": " << mem_fwd << ", \"peak_extra_bytes_forward_backward\": " << mem_fb
        << ",\n     \"target_ratio_ok\": " << (fb_ratio <= 1.3 ? "true" : "false")
        << ", \"target_memory_ok\": " << (mem_fb <= (size_t{1} << 30) ? "true" : "false") << "}";
    js << row.str();
    first_row = false;
    std::fprintf(stderr, "  fwd %.2f ms, fwd+bwd %.2f ms, 3 GEMMs %.2f ms (ratio %.3f), peak extra %.1f MiB\n",
                 t_fwd.median_ms, t_fb.median_ms, t_g3.median_ms, fb_ratio, mem_fb / 1048576.0);
  }
  js << "\n  ]\n}\n";
  if (out_path.empty()) {
    std::cout << js.str();
  } else {
    std::ofstream f(out_path);
    f << js.str();
    if (!f) {
      std::fprintf(stderr, "could not write %s\n", out_path.c_str());
      return 2;
    }
  }
  cublasDestroy(h);
  cudaStreamDestroy(stream);
  return 0;
}
