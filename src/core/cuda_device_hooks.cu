// Tessera: the CUDA backend's harness hooks (harness/device_hooks.h) — device count,
// synchronization, the device's measured ceilings (peak cuBLAS GEMM per dtype, device-to-device
// copy bandwidth) and the plain GEMM that `tessera bench` compares GPU rows with.
//
// Everything here is timed with CUDA events on a stream of its own, after warm-up runs, on
// buffers filled with pseudo-random values (a GEMM on zeros draws less power and can run faster
// than on real data). measure_ceilings and time_gemm never throw: whatever cannot be measured
// (no device, out of memory, a cuBLAS error) is said in the result's method strings / notes, or
// logged. All device memory, streams and events are RAII-owned, so every path frees them; the
// cuBLAS handle is leased from the shared pool (core/cuda_util.h) and configured exactly as the
// backend's GEMMs are. Registration touches no CUDA API, so it is safe on a machine without a GPU.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/cuda_util.h"
#include "core/log.h"
#include "harness/device_hooks.h"
#include "tessera/dtype.h"
#include "tessera/error.h"

namespace tessera::cuda {
namespace {

// ---- RAII owners (destructors never throw; errors on release are ignored) ----

struct DevMem {
  void* p = nullptr;
  size_t bytes = 0;
  DevMem(size_t n, const char* what) {
    const cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
      p = nullptr;
      throw_error(e, std::string("cudaMalloc of ") + std::to_string(n >> 20) + " MiB (" + what + ")");
    }
    bytes = n;
  }
  ~DevMem() {
    if (p) (void)cudaFree(p);
  }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~Stream() {
    if (s) (void)cudaStreamDestroy(s);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

struct Event {
  cudaEvent_t e = nullptr;
  Event() { check(cudaEventCreate(&e), "cudaEventCreate"); }
  ~Event() {
    if (e) (void)cudaEventDestroy(e);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// ---- pseudo-random fill (uniform in [-scale, scale)) ----

__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ inline void store(__half* p, float v) { *p = __float2half(v); }

template <typename T>
__global__ void fill_kernel(T* p, size_t n, uint64_t seed, float scale) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint64_t z = (i + seed * 0x100000001b3ull) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    store(p + i, scale * u);
  }
}

void fill(void* p, DType t, size_t n, uint64_t seed, cudaStream_t s) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 4096));
  switch (t) {
    case DType::kF32: fill_kernel<<<blocks, 256, 0, s>>>(static_cast<float*>(p), n, seed, 1.0f); break;
    case DType::kBF16: fill_kernel<<<blocks, 256, 0, s>>>(static_cast<__nv_bfloat16*>(p), n, seed, 1.0f); break;
    case DType::kF16: fill_kernel<<<blocks, 256, 0, s>>>(static_cast<__half*>(p), n, seed, 1.0f); break;
    default: throw Error(ErrorCode::kInternal, std::string("no fill for ") + dtype_name(t));
  }
  check_launch("harness fill_kernel", s);
}

// Device seconds of `reps` runs of `fn` on `s` (each between two events), after `warmup`
// untimed runs. Fewer timed runs when one run is long (at most ~`budget_s` of timed work, at
// least 3 runs).
std::vector<double> time_runs(const std::function<void()>& fn, cudaStream_t s, int warmup, int reps,
                              double budget_s) {
  Event start, stop;
  for (int i = 0; i < warmup; ++i) fn();
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize (warm-up)");
  std::vector<double> out;
  double spent = 0;
  for (int i = 0; i < reps; ++i) {
    if (static_cast<int>(out.size()) >= 3 && spent >= budget_s) break;
    check(cudaEventRecord(start.e, s), "cudaEventRecord");
    fn();
    check(cudaEventRecord(stop.e, s), "cudaEventRecord");
    check(cudaEventSynchronize(stop.e), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start.e, stop.e), "cudaEventElapsedTime");
    out.push_back(ms * 1e-3);
    spent += ms * 1e-3;
  }
  return out;
}

double best(const std::vector<double>& v) {
  if (v.empty()) throw Error(ErrorCode::kInternal, "no timed runs");
  return *std::min_element(v.begin(), v.end());
}
double median(std::vector<double> v) {
  if (v.empty()) throw Error(ErrorCode::kInternal, "no timed runs");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool tf32_enabled() { return blas_compute(DType::kF32) == CUBLAS_COMPUTE_32F_FAST_TF32; }  // as the backend

// Row-major C[M,N] (dtype c_type) = A[M,K] · B[K,N] (B stored [N,K] when b_transposed), A and B
// in `t`, f32 accumulation. Column-major cuBLAS view: Cᵀ[N,M] = Bᵀ · Aᵀ.
struct GemmProblem {
  int64_t M = 0, N = 0, K = 0;
  DType t = DType::kF32;
  DType c_type = DType::kF32;
  bool b_transposed = false;
};

int current_device() {
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

// Seconds per run (`best` or median) of the GEMM, buffers allocated, filled and freed here.
double run_gemm(const GemmProblem& g, bool take_best, int warmup, int reps, double budget_s, std::string* how) {
  for (int64_t d : {g.M, g.N, g.K})
    if (d <= 0 || d > INT_MAX) throw Error(ErrorCode::kUnsupported, "GEMM dimension outside the cuBLAS int range");
  const cudaDataType ab_cuda = blas_type(g.t), c_cuda = blas_type(g.c_type);
  Stream st;
  const BlasHandle blas(current_device(), st.s);  // configured as the backend's GEMMs are
  const size_t es = dtype_size(g.t);
  DevMem a(static_cast<size_t>(g.M) * static_cast<size_t>(g.K) * es, "GEMM A");
  DevMem b(static_cast<size_t>(g.K) * static_cast<size_t>(g.N) * es, "GEMM B");
  DevMem c(static_cast<size_t>(g.M) * static_cast<size_t>(g.N) * dtype_size(g.c_type), "GEMM C");
  fill(a.p, g.t, static_cast<size_t>(g.M) * static_cast<size_t>(g.K), 1, st.s);
  fill(b.p, g.t, static_cast<size_t>(g.K) * static_cast<size_t>(g.N), 2, st.s);
  const bool tf32 = tf32_enabled();
  const cublasComputeType_t compute = blas_compute(g.t);
  const int64_t m = g.N, n = g.M, k = g.K;
  const cublasOperation_t op_b = g.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t ldb_cm = g.b_transposed ? k : m;  // B [K,N] row-major = (N×K, ld N); [N,K] = (K×N, ld K)
  auto run = [&] {
    gemm_ex(blas.get(), compute, op_b, CUBLAS_OP_N, m, n, k, 1.0f, {b.p, ab_cuda, ldb_cm}, {a.p, ab_cuda, k}, 0.0f,
            c.p, c_cuda, m, "cublasGemmEx (harness ceiling / baseline)");
  };
  const std::vector<double> t = time_runs(run, st.s, warmup, reps, budget_s);
  if (how) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "cublasGemmEx %s %lldx%lldx%lld (MxNxK), %s out, %s, %s of %d after %d warm-up, CUDA events",
                  dtype_name(g.t), static_cast<long long>(g.M), static_cast<long long>(g.N),
                  static_cast<long long>(g.K), dtype_name(g.c_type),
                  tf32 && g.t == DType::kF32 ? "CUBLAS_COMPUTE_32F_FAST_TF32" : "CUBLAS_COMPUTE_32F", take_best ? "best" : "median",
                  static_cast<int>(t.size()), warmup);
    *how = buf;
  }
  return take_best ? best(t) : median(t);
}

std::string reason_of(const std::exception& e) { return e.what(); }

// ---- the hooks ----

int hook_device_count() { return device_count(); }

void hook_synchronize(int index) {
  DeviceGuard g(index);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// Seconds of one call of `fn`, between two events on the legacy default stream (which orders
// with every blocking stream, where the backends' calls run by default). The device is idle
// before the start event; the stop event is recorded once fn has returned on the host, so the
// time covers everything fn queued plus any host synchronization inside it.
double hook_time_call(int index, const std::function<void()>& fn) {
  DeviceGuard g(index);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  Event start, stop;
  check(cudaEventRecord(start.e, cudaStreamLegacy), "cudaEventRecord");
  fn();
  check(cudaEventRecord(stop.e, cudaStreamLegacy), "cudaEventRecord");
  check(cudaEventSynchronize(stop.e), "cudaEventSynchronize");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // work fn left on other streams
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start.e, stop.e), "cudaEventElapsedTime");
  return ms / 1e3;
}

// Peak GEMM per dtype and copy bandwidth of device `index`; each failure is caught where it
// happens and written as "not measured: <reason>".
harness::DeviceCeilingsRaw measure_ceilings(int index, bool quick) {
  harness::DeviceCeilingsRaw r;
  r.name = "cuda:" + std::to_string(index);
  auto not_measured = [&](const std::string& why) {
    for (const char* dt : {"bf16", "f16", "f32"}) r.gemm_method[dt] = "not measured: " + why;
    r.bandwidth_method = "not measured: " + why;
    r.notes.push_back("not measured: " + why);
    return r;
  };
  std::string why;
  const int n = device_count(&why);
  if (n == 0) return not_measured(why);
  if (index < 0 || index >= n)
    return not_measured("no CUDA device " + std::to_string(index) + " (" + std::to_string(n) + " present)");
  try {
    DeviceGuard guard(index);
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
    r.name = prop.name;
    r.notes.push_back("compute capability " + std::to_string(prop.major) + "." + std::to_string(prop.minor) + ", " +
                      std::to_string(prop.multiProcessorCount) + " SMs, " +
                      std::to_string(prop.totalGlobalMem >> 20) + " MiB");
  } catch (const std::exception& e) {
    return not_measured(reason_of(e));
  }

  const int warmup = quick ? 1 : 3;
  const int reps = quick ? 3 : 10;
  const double budget = quick ? 0.2 : 1.0;
  for (const DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    const std::string dt = dtype_name(t);
    // 16-bit at 8192³ (quick 4096³), f32 at 4096³ (quick 2048³): large enough to be compute
    // bound; halved on out-of-memory down to 1024³.
    int64_t size = t == DType::kF32 ? (quick ? 2048 : 4096) : (quick ? 4096 : 8192);
    for (;;) {
      try {
        DeviceGuard guard(index);
        GemmProblem g;
        g.M = g.N = g.K = size;
        g.t = t;
        g.c_type = t;  // 16-bit in, 16-bit out, f32 compute: the usual "bf16 GEMM peak"
        std::string how;
        const double s = run_gemm(g, /*take_best=*/true, warmup, reps, budget, &how);
        if (s > 0) r.gemm_gflops[dt] = 2.0 * static_cast<double>(size) * size * size / s / 1e9;
        r.gemm_method[dt] = how;
        break;
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kOutOfMemory && size > 1024) {
          size /= 2;
          continue;
        }
        r.gemm_method[dt] = "not measured: " + reason_of(e);
        break;
      } catch (const std::exception& e) {
        r.gemm_method[dt] = "not measured: " + reason_of(e);
        break;
      }
    }
  }
  if (tf32_enabled())
    r.notes.push_back("TESSERA_CUDA_TF32 is set: the f32 ceiling is TF32 tensor-core GEMM, as the backend runs");

  // Device-to-device copy: 1 GiB (quick 256 MiB), halved on out-of-memory down to 64 MiB.
  size_t bytes = quick ? (size_t{256} << 20) : (size_t{1} << 30);
  for (;;) {
    try {
      DeviceGuard guard(index);
      Stream st;
      DevMem src(bytes, "copy source");
      DevMem dst(bytes, "copy destination");
      check(cudaMemsetAsync(src.p, 1, bytes, st.s), "cudaMemsetAsync");
      check(cudaMemsetAsync(dst.p, 0, bytes, st.s), "cudaMemsetAsync");
      auto copy = [&] { check(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, st.s), "cudaMemcpyAsync"); };
      const std::vector<double> t = time_runs(copy, st.s, quick ? 1 : 2, quick ? 5 : 10, budget);
      const double s = best(t);
      if (s > 0) r.bandwidth_gbs = 2.0 * static_cast<double>(bytes) / s / 1e9;
      r.bandwidth_method = "cudaMemcpyAsync device-to-device of " + std::to_string(bytes >> 20) +
                           " MiB, read + write bytes counted, best of " + std::to_string(t.size()) +
                           ", CUDA events";
      break;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kOutOfMemory && bytes > (size_t{64} << 20)) {
        bytes /= 2;
        continue;
      }
      r.bandwidth_method = "not measured: " + reason_of(e);
      break;
    } catch (const std::exception& e) {
      r.bandwidth_method = "not measured: " + reason_of(e);
      break;
    }
  }
  return r;
}

std::optional<harness::DeviceCeilingsRaw> hook_measure_ceilings(int index, bool quick) {
  try {
    return measure_ceilings(index, quick);
  } catch (const std::exception& e) {  // only string / map allocation can get here
    harness::DeviceCeilingsRaw r;
    r.notes.push_back(std::string("not measured: ") + e.what());
    return r;
  } catch (...) {
    return std::nullopt;
  }
}

// Seconds (median) of the plain GEMM [M,K]·[K,N] in `dtype` with f32 output, as the cuda
// backend's logits GEMM writes. nullopt (with a warning) when it cannot run. Never throws.
std::optional<double> hook_time_gemm(int index, int64_t M, int64_t N, int64_t K, DType dtype, bool b_transposed) {
  std::string what = "GPU GEMM baseline";
  try {
    what += std::string(" ") + dtype_name(dtype) + " " + std::to_string(M) + "x" + std::to_string(N) + "x" +
            std::to_string(K) + " (MxNxK) on cuda:" + std::to_string(index);
    std::string why;
    const int n = device_count(&why);
    if (index < 0 || index >= n) {
      log::warn_once(what + " not timed: " + (why.empty() ? "no such device" : why));
      return std::nullopt;
    }
    DeviceGuard guard(index);
    GemmProblem g;
    g.M = M, g.N = N, g.K = K, g.t = dtype, g.c_type = DType::kF32, g.b_transposed = b_transposed;
    return run_gemm(g, /*take_best=*/false, 2, 7, 1.0, nullptr);
  } catch (const std::exception& e) {
    log::warn(what + " not timed: " + reason_of(e));
    return std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
}

std::once_flag g_hooks_registered;

// Registration at load time for programs that link this object; make_cuda_implementation()
// calls register_device_hooks() too, which is what makes the linker keep this object.
[[maybe_unused]] const bool g_static_hooks = [] {
  register_device_hooks();
  return true;
}();

}  // namespace

void register_device_hooks() {
  std::call_once(g_hooks_registered, [] {
    harness::DeviceHooks h;
    h.synchronize = hook_synchronize;
    h.measure_ceilings = hook_measure_ceilings;
    h.time_gemm = hook_time_gemm;
    h.time_call = hook_time_call;
    h.device_count = hook_device_count;
    harness::register_device_hooks(DeviceType::kCUDA, std::move(h));
  });
}

}  // namespace tessera::cuda
