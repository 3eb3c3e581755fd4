// paged_attention: the cuda backend, version 1 — one warp per (query row, query head), f32 math.
//
// Each warp walks the visible key positions of its row: the page of position j comes from the
// page table, the key's dot product is split over the lanes (D/32 elements each) and reduced with
// warp shuffles, the online softmax state (m, l) is kept in registers by every lane, and each
// lane accumulates its Dv/32 elements of o. Sinks start the state (m = σ, l = 1). Keys past
// kv_len are never read. A first-contact design (no shared-memory tiling, no GQA packing across
// warps): correctness first; docs/kernels/paged_attention.md.
// The index arrays are host memory in Problem: they go to the device through one staged copy into
// stream-ordered scratch (a stream being captured is refused: the graph would replay stale ids).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "core/trace_nvtx.h"
#include "kernels/paged_attention/cuda_checks.h"
#include "kernels/paged_attention/impl.h"
#include "primitives/cuda_available.h"
#include "tessera/error.h"

namespace tessera::paged_attention {
namespace {

constexpr int kMaxPerLane = 8;  // D, Dv <= 256
constexpr int kWarpsPerBlock = 4;
constexpr const char* kIndexCopy = "paged_attention copies the page table, kv_lens and cu_q_lens to the device";

struct Params {
  const void *q, *k, *v;
  int dtype;        // q's and o's: 0 f32, 1 bf16, 2 f16
  int cache_dtype;  // the caches': q's, or 3 f8e4m3
  const int32_t *page_table, *kv_lens, *cu_q;
  const float* sinks;
  void* o;
  bool o_f32;
  float* lse;
  int64_t N, T, Hq, Hkv, D, Dv, page_size, max_pages;
  float scale, softcap;
  bool causal;
  int64_t window;
  float v_scale;  // o = v_scale · Σ p·v_cache
};

__device__ __forceinline__ float load(const void* p, int dtype, int64_t i) {
  if (dtype == 0) return static_cast<const float*>(p)[i];
  if (dtype == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (dtype == 3) return static_cast<float>(static_cast<const __nv_fp8_e4m3*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}

__device__ __forceinline__ void store(void* p, int dtype, bool f32, int64_t i, float x) {
  if (f32 || dtype == 0)
    static_cast<float*>(p)[i] = x;
  else if (dtype == 1)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(x);
  else
    static_cast<__half*>(p)[i] = __float2half(x);
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

__global__ void forward_kernel(Params p) {
  const int lane = threadIdx.x & 31;
  const int64_t t = blockIdx.x, h = static_cast<int64_t>(blockIdx.y) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (h >= p.Hq) return;
  int64_t lo_s = 0, hi_s = p.N - 1;  // the sequence of row t: the last s with cu_q[s] <= t
  while (lo_s < hi_s) {
    const int64_t mid = (lo_s + hi_s + 1) / 2;
    if (p.cu_q[mid] <= t) lo_s = mid; else hi_s = mid - 1;
  }
  const int64_t s = lo_s, kv = p.kv_lens[s], ql = p.cu_q[s + 1] - p.cu_q[s];
  const int64_t pos = kv - ql + (t - p.cu_q[s]), g = h / (p.Hq / p.Hkv);
  const int64_t k_lo = p.window >= 0 ? max(int64_t{0}, pos - p.window) : 0, k_hi = p.causal ? min(kv, pos + 1) : kv;
  float q[kMaxPerLane], acc[kMaxPerLane];
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    q[i] = d < p.D ? load(p.q, p.dtype, (t * p.Hq + h) * p.D + d) * p.scale : 0.0f;
    acc[i] = 0.0f;
  }
  float m = p.sinks ? p.sinks[h] : -INFINITY, l = p.sinks ? 1.0f : 0.0f;
  for (int64_t j = k_lo; j < k_hi; ++j) {
    const int64_t row = static_cast<int64_t>(p.page_table[s * p.max_pages + j / p.page_size]) * p.page_size + j % p.page_size;
    float part = 0.0f;
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < p.D) part += q[i] * load(p.k, p.cache_dtype, (row * p.Hkv + g) * p.D + d);
    }
    float x = warp_sum(part);
    if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
    const float mn = fmaxf(m, x);
    const float a = m == -INFINITY ? 0.0f : __expf(m - mn), e = __expf(x - mn);
    l = l * a + e;
    m = mn;
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < p.Dv) acc[i] = acc[i] * a + e * load(p.v, p.cache_dtype, (row * p.Hkv + g) * p.Dv + d);
    }
  }
  const float inv = l == 0.0f ? 0.0f : p.v_scale / l;  // NaN (a non-finite key seen) stays NaN
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < p.Dv) store(p.o, p.dtype, p.o_f32, (t * p.Hq + h) * p.Dv + d, acc[i] * inv);
  }
  if (lane == 0) p.lse[t * p.Hq + h] = l == 0.0f ? -INFINITY : m + logf(l);
}

class Cuda final : public primitives::CudaBackend<Implementation> {
 public:
  std::string name() const override { return "cuda"; }
  std::string description() const override {
    return "NVIDIA GPUs: one warp per query row and head, online softmax over the pages (v1, f32 math)";
  }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCUDA) return Availability::no("the cuda backend runs on CUDA device memory");
    if (const Availability a = available(); !a.ok) return a;
    if (p.D > 32 * kMaxPerLane || p.Dv > 32 * kMaxPerLane)
      return Availability::no("the cuda backend supports D, Dv <= 256, got D=" + std::to_string(p.D) +
                              ", Dv=" + std::to_string(p.Dv));
    if (p.T >= INT_MAX || (p.Hq + kWarpsPerBlock - 1) / kWarpsPerBlock > 65535)
      return Availability::no("T must be < 2^31 and Hq <= 262140 (grid dimensions) on the cuda backend");
    if (const std::string why = cuda::capture_refusal(static_cast<cudaStream_t>(p.stream), kIndexCopy); !why.empty())
      return Availability::no(why);
    return Availability::yes();
  }
  void forward(const Problem& p) const override {
    TESSERA_NVTX_RANGE("paged_attention.cuda.fwd");
    const int dev = p.device.index;
    cuda::DeviceGuard guard(dev);
    require_launchable(p, std::string(kKernelName) + " (cuda)", kIndexCopy);
    const auto stream = static_cast<cudaStream_t>(p.stream);
    // One staged copy: page_table [N·max_pages], kv_lens [N], cu_q [N+1].
    const size_t npt = static_cast<size_t>(p.N * p.max_pages), n = static_cast<size_t>(p.N);
    std::vector<int32_t> idx(npt + 2 * n + 1);
    std::copy(p.page_table, p.page_table + npt, idx.begin());
    std::copy(p.kv_lens, p.kv_lens + n, idx.begin() + static_cast<std::ptrdiff_t>(npt));
    std::copy(p.cu_q, p.cu_q + n + 1, idx.begin() + static_cast<std::ptrdiff_t>(npt + n));
    cuda::DeviceBuffer buf(idx.size() * sizeof(int32_t), stream, dev);
    cuda::copy_host_to_device(buf.get(), idx.data(), buf.bytes(), stream, dev, "paged_attention (cuda): copy of the index arrays");
    const int32_t* d = static_cast<const int32_t*>(buf.get());
    const auto code = [](DType t) { return t == DType::kF32 ? 0 : t == DType::kBF16 ? 1 : t == DType::kF16 ? 2 : 3; };
    Params k{p.q, p.k, p.v, code(p.dtype), code(p.cache_dtype), d, d + npt, d + npt + n,
             p.sinks, p.o, p.o_f32, p.lse, p.N, p.T, p.Hq, p.Hkv, p.D, p.Dv, p.page_size, p.max_pages,
             static_cast<float>(p.scale), static_cast<float>(p.softcap), p.causal, p.window, static_cast<float>(p.v_scale)};
    const dim3 grid(static_cast<unsigned>(p.T), static_cast<unsigned>((p.Hq + kWarpsPerBlock - 1) / kWarpsPerBlock));
    forward_kernel<<<grid, 32 * kWarpsPerBlock, 0, stream>>>(k);
    cuda::check_launch("paged_attention forward_kernel", stream);
    // buf is released stream-ordered when it goes out of scope.
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cuda_implementation() { return primitives::make_cuda<Cuda>(); }

TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cuda_implementation()); });

}  // namespace tessera::paged_attention
