// mla_decode cuda: the split-KV pipeline on the GPU, two kernels on the caller's stream.
//   stage 1 (mla_split_kv): one block per (split, group of kWarps query rows), one warp per row.
//     The block stages each key of its split in shared memory (converted to f32 once per block)
//     and every warp scores it against its row (warp-reduced dot product), online softmax, and
//     accumulates the first Dv dims (each lane Dv/32 of them). Writes o_part and lse_part.
//   stage 2 (mla_combine): one warp per (b, row): the lse combine of that sequence's splits
//     (the math of primitives/lse_combine.h), o rounded to its dtype.
// The page table and lengths are host memory (the API validates them there); they, the split
// plan and the partials go to stream-ordered device scratch. A first, plain version: keys are
// re-read from L2 by each row group (no tensor cores); compiled in CI for sm_90a + PTX, NOT run
// on a GPU yet (docs/kernels/mla_decode.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "core/trace_nvtx.h"
#include "kernels/mla_decode/impl.h"
#include "primitives/cuda_available.h"
#include "tessera/error.h"

namespace tessera::mla_decode {
namespace {

constexpr int kWarps = 4;           // query rows per stage-1 block
constexpr int kMaxPerLane = 32;     // Dv ≤ 1024 = 32 lanes × 32
constexpr int kMaxD = 1024;

__device__ __forceinline__ float load_f32(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f32(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load_f32(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load_f32(const __nv_fp8_e4m3* p, int64_t i) { return static_cast<float>(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }
__device__ __forceinline__ void store(__half* p, int64_t i, float v) { p[i] = __float2half(v); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

struct Dims {
  int64_t Sq, Hq, D, Dv, page_size, max_pages, R;
  float scale;
  bool causal;
  float v_scale;  // o = v_scale · Σ p·c[:Dv] (kv_scale; 1 for a cache of q's type)
};

// splits: (b, k0, k1) triples. q of T, the cache of C (T, or f8e4m3).
template <class T, class C>
__global__ void mla_split_kv(const T* q, const C* kv, const int32_t* page_table, const int32_t* seqlens,
                             const int32_t* splits, Dims d, float* o_part, float* lse_part) {
  __shared__ float key[kMaxD];
  __shared__ float qs[kWarps][kMaxD];
  const int64_t s = blockIdx.x;
  const int b = splits[3 * s], k0 = splits[3 * s + 1], k1 = splits[3 * s + 2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = int64_t{blockIdx.y} * kWarps + warp;
  const bool active = r < d.R;
  if (active)
    for (int64_t e = lane; e < d.D; e += 32) qs[warp][e] = load_f32(q, (b * d.R + r) * d.D + e);
  const int64_t L = seqlens[b];
  const int64_t visible = !active ? 0 : !d.causal ? L : max(int64_t{0}, L - d.Sq + r / d.Hq + 1);
  float m = -INFINITY, l = 0.f, acc[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0.f;
  for (int64_t j = k0; j < k1; ++j) {
    __syncthreads();
    const int64_t entry = (int64_t{page_table[b * d.max_pages + j / d.page_size]} * d.page_size + j % d.page_size) * d.D;
    for (int64_t e = threadIdx.x; e < d.D; e += blockDim.x) key[e] = load_f32(kv, entry + e);
    __syncthreads();
    if (j >= visible) continue;  // uniform per warp
    float dot = 0.f;
    for (int64_t e = lane; e < d.D; e += 32) dot += qs[warp][e] * key[e];
    const float sc = warp_sum(dot) * d.scale;
    const float mn = fmaxf(m, sc);
    const float alpha = m == -INFINITY ? 0.f : __expf(m - mn), p = __expf(sc - mn);
    l = l * alpha + p;
    m = mn;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t e = lane + 32 * i;
      if (e < d.Dv) acc[i] = acc[i] * alpha + p * key[e];
    }
  }
  if (!active) return;
  const float inv = l == 0.f ? 0.f : d.v_scale / l;  // NaN (a non-finite entry seen) stays NaN
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t e = lane + 32 * i;
    if (e < d.Dv) o_part[(s * d.R + r) * d.Dv + e] = acc[i] * inv;
  }
  if (lane == 0) lse_part[s * d.R + r] = l == 0.f ? -INFINITY : m + logf(l);
}

// One warp per (b, r): lse = log Σ exp(lse_s), o = Σ exp(lse_s − lse)·o_s; no key: o 0, lse −inf;
// a NaN partial (a non-finite cache entry seen) makes o and lse NaN (fmaxf would drop it).
template <class O>
__global__ void mla_combine(const float* o_part, const float* lse_part, const int32_t* first, int64_t B, Dims d,
                            O* o, float* lse) {
  const int64_t w = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= B * d.R) return;  // whole warps: B·R rows of 32 lanes each
  const int64_t b = w / d.R, r = w % d.R, s0 = first[b], s1 = first[b + 1];
  float m = -INFINITY;
  bool nan = false;
  for (int64_t s = s0 + lane; s < s1; s += 32) m = fmaxf(m, lse_part[s * d.R + r]), nan |= isnan(lse_part[s * d.R + r]);
  if (__any_sync(0xffffffffu, nan)) {
    for (int64_t e = lane; e < d.Dv; e += 32) store(o, w * d.Dv + e, NAN);
    if (lane == 0) lse[w] = NAN;
    return;
  }
  m = warp_max(m);
  float total = 0.f;
  if (m != -INFINITY)
    for (int64_t s = s0 + lane; s < s1; s += 32) total += __expf(lse_part[s * d.R + r] - m);
  total = warp_sum(total);
  for (int64_t e = lane; e < d.Dv; e += 32) {
    float v = 0.f;
    if (m != -INFINITY)
      for (int64_t s = s0; s < s1; ++s) {
        const float wgt = __expf(lse_part[s * d.R + r] - m) / total;
        if (wgt > 0.f) v += wgt * o_part[(s * d.R + r) * d.Dv + e];
      }
    store(o, w * d.Dv + e, v);
  }
  if (lane == 0) lse[w] = m == -INFINITY ? -INFINITY : m + logf(total);
}

cudaStream_t stream_of(const Problem& p) { return static_cast<cudaStream_t>(p.stream); }

// Splits of split_keys keys (block_sizes, else enough (b, split) items for ~2 waves of 132 SMs).
std::vector<int32_t> plan_splits(const Problem& p, std::vector<int32_t>& first) {
  int64_t Lmax = 0;
  for (int64_t b = 0; b < p.B; ++b) Lmax = std::max<int64_t>(Lmax, p.seqlens[b]);
  int64_t keys = p.block_sizes && p.block_sizes->split_keys > 0 ? p.block_sizes->split_keys : 0;
  if (keys == 0) {
    const int64_t per = std::max<int64_t>(1, (264 + p.B - 1) / p.B);
    keys = std::max<int64_t>(64, ((Lmax + per - 1) / per + 63) / 64 * 64);
  }
  std::vector<int32_t> splits;
  first.assign(1, 0);
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t k0 = 0, k1 = 0; k0 < p.seqlens[b]; k0 = k1) {
      k1 = k0 + std::min<int64_t>(p.seqlens[b] - k0, keys);  // no overflow for any split_keys
      splits.insert(splits.end(), {static_cast<int32_t>(b), static_cast<int32_t>(k0), static_cast<int32_t>(k1)});
    }
    first.push_back(static_cast<int32_t>(splits.size() / 3));
  }
  return splits;
}

template <class T, class C, class O>
void launch(const Problem& p, const Dims& d, const int32_t* pt, const int32_t* L, const int32_t* splits,
            const int32_t* first, int64_t nsplits, float* o_part, float* lse_part, cudaStream_t st) {
  if (nsplits > 0) {
    TESSERA_NVTX_RANGE("mla_decode.cuda.split_kv");
    const dim3 grid(static_cast<unsigned>(nsplits), static_cast<unsigned>((d.R + kWarps - 1) / kWarps));
    mla_split_kv<T, C><<<grid, kWarps * 32, 0, st>>>(static_cast<const T*>(p.q), static_cast<const C*>(p.kv), pt, L,
                                                    splits, d, o_part, lse_part);
    cuda::check_launch("mla_decode mla_split_kv", st);
  }
  TESSERA_NVTX_RANGE("mla_decode.cuda.combine");
  const int64_t warps = p.B * d.R;
  mla_combine<O><<<static_cast<unsigned>((warps + 7) / 8), 256, 0, st>>>(o_part, lse_part, first, p.B, d,
                                                                         static_cast<O*>(p.o), p.lse);
  cuda::check_launch("mla_decode mla_combine", st);
}

template <class T, class C>
void launch_for_o(const Problem& p, const Dims& d, const int32_t* pt, const int32_t* L, const int32_t* sp,
                  const int32_t* first, int64_t n, float* op, float* lp, cudaStream_t st) {
  switch (p.o_dtype) {
    case DType::kF32: return launch<T, C, float>(p, d, pt, L, sp, first, n, op, lp, st);
    case DType::kBF16: return launch<T, C, __nv_bfloat16>(p, d, pt, L, sp, first, n, op, lp, st);
    case DType::kF16: return launch<T, C, __half>(p, d, pt, L, sp, first, n, op, lp, st);
    default: throw Error(ErrorCode::kInternal, "mla_decode cuda: o dtype");
  }
}

// q of T; the cache of T or f8e4m3.
template <class T>
void launch_for_cache(const Problem& p, const Dims& d, const int32_t* pt, const int32_t* L, const int32_t* sp,
                      const int32_t* first, int64_t n, float* op, float* lp, cudaStream_t st) {
  if (p.cache_dtype == DType::kF8E4M3) return launch_for_o<T, __nv_fp8_e4m3>(p, d, pt, L, sp, first, n, op, lp, st);
  launch_for_o<T, T>(p, d, pt, L, sp, first, n, op, lp, st);
}

class Cuda final : public primitives::CudaBackend<Implementation> {
 public:
  std::string name() const override { return "cuda"; }
  std::string description() const override {
    return "NVIDIA GPUs: split-KV partial attention (a warp per query row, keys staged in shared memory), then the "
           "lse combine";
  }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCUDA) return Availability::no("inputs are on " + p.device.str());
    if (p.D > kMaxD || p.Dv > 32 * kMaxPerLane) return Availability::no("D and Dv must be <= 1024");
    if (p.B * p.rows() > INT_MAX / 32 || (p.rows() + kWarps - 1) / kWarps > 65535)
      return Availability::no("Sq·Hq (at most 262,140) or B·Sq·Hq too large for one launch");
    return Availability::yes();
  }

  void forward(const Problem& p) const override {
    const int dev = p.device.index;
    cuda::DeviceGuard guard(dev);
    for (auto [ptr, what] : {std::pair<const void*, const char*>{p.q, "q"}, {p.kv, "kv_cache"}, {p.o, "o"}, {p.lse, "lse"}})
      cuda::require_accessible(ptr, dev, "mla_decode cuda", what);
    const cudaStream_t st = stream_of(p);
    std::vector<int32_t> first;
    const std::vector<int32_t> splits = plan_splits(p, first);
    const int64_t nsplits = static_cast<int64_t>(splits.size() / 3), R = p.rows();
    auto upload = [&](const void* src, size_t bytes, const char* what) {
      cuda::DeviceBuffer buf(std::max<size_t>(bytes, 4), st, dev);
      if (bytes > 0) cuda::copy_host_to_device(buf.get(), src, bytes, st, dev, what);
      return buf;
    };
    const cuda::DeviceBuffer pt = upload(p.page_table, sizeof(int32_t) * p.B * p.max_pages, "mla_decode cuda: page_table");
    const cuda::DeviceBuffer L = upload(p.seqlens, sizeof(int32_t) * p.B, "mla_decode cuda: cache_seqlens");
    const cuda::DeviceBuffer sp = upload(splits.data(), sizeof(int32_t) * splits.size(), "mla_decode cuda: splits");
    const cuda::DeviceBuffer fi = upload(first.data(), sizeof(int32_t) * first.size(), "mla_decode cuda: split offsets");
    const cuda::DeviceBuffer op(std::max<size_t>(sizeof(float) * nsplits * R * p.Dv, 4), st, dev);
    const cuda::DeviceBuffer lp(std::max<size_t>(sizeof(float) * nsplits * R, 4), st, dev);
    const Dims d{p.Sq, p.Hq, p.D, p.Dv, p.page_size, p.max_pages, R, static_cast<float>(p.scale), p.causal,
                 static_cast<float>(p.v_scale)};
    auto* ptd = static_cast<const int32_t*>(pt.get());
    auto* Ld = static_cast<const int32_t*>(L.get());
    auto* spd = static_cast<const int32_t*>(sp.get());
    auto* fid = static_cast<const int32_t*>(fi.get());
    auto* o_part = static_cast<float*>(op.get());
    auto* lse_part = static_cast<float*>(lp.get());
    switch (p.dtype) {
      case DType::kF32: return launch_for_cache<float>(p, d, ptd, Ld, spd, fid, nsplits, o_part, lse_part, st);
      case DType::kBF16: return launch_for_cache<__nv_bfloat16>(p, d, ptd, Ld, spd, fid, nsplits, o_part, lse_part, st);
      case DType::kF16: return launch_for_cache<__half>(p, d, ptd, Ld, spd, fid, nsplits, o_part, lse_part, st);
      default: throw Error(ErrorCode::kInternal, "mla_decode cuda: dtype");
    }
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cuda_implementation() { return primitives::make_cuda<Cuda>(); }

// The CUDA module registers this implementation when it is loaded, in place of the "cuda"
// placeholder declared in implementations.cc.
TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cuda_implementation()); });

}  // namespace tessera::mla_decode
