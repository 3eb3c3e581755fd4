// paged_attention: the cuda backend, version 2 — split-KV over the pages, keys across the lanes,
// the query heads of a kv head together (FlashDecoding's layout for a paged cache).
//
// v1 (cuda.cu) gives each (query row, head) one warp that walks its keys one at a time: every key
// costs a page-table lookup, a dependent load and a 5-step shuffle reduction, and a decode step of
// 8192 keys runs at 1.7 % of the H200's memory line (docs/gpu_results/2026-11-27-tenth). Here:
//   * a work item is one sequence s, one kv head g and up to R (query row, head) pairs that read
//     g (the GQA group of a decode row, or a few prefill rows): the kv head's keys are read once
//     for all of them;
//   * the item's visible keys are split into chunks of L keys, one block (4 warps) per (item,
//     chunk): blocks = items × chunks fill the GPU even at batch 1;
//   * in a block each lane owns a key: 32 independent page-table lookups and key-row loads per
//     warp in flight, the dot products against q (in shared memory) without shuffles; the online
//     softmax (m, l) advances by one warp-wide max per 32 keys; P·V broadcasts each key's p with a
//     shuffle and every lane accumulates its own Dv/32 columns of o;
//   * the 4 warps merge in shared memory and write the chunk's unnormalized o and its (m, l) in
//     f32; a second kernel merges the chunks (with the sink as one more chunk of weight
//     exp(σ − M), no value) and writes o and lse.
// f32 math, the same __expf as v1. Not yet run on a GPU: registered after v1, so the default
// stays v1 until a lease verifies this one (docs/kernels/paged_attention.md, v2).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "core/trace_nvtx.h"
#include "kernels/paged_attention/impl.h"
#include "primitives/cuda_available.h"
#include "primitives/cuda_convert.cuh"
#include "primitives/cuda_reduce.cuh"
#include "tessera/error.h"

namespace tessera::paged_attention {
namespace {

constexpr int kMaxDim = 256;          // D, Dv
constexpr int kPerLane = kMaxDim / 32;
constexpr int kWarps = 4;
constexpr int kTile = 32 * kWarps;    // keys a block covers per step
constexpr int kVUnroll = 4;           // value rows loaded ahead in P·V
constexpr size_t kMaxScratch = size_t{1} << 30;
constexpr const char* kIndexCopy = "paged_attention cuda_v2 copies the page table and its work list to the device";

// One work item (int32 fields, host-built): sequence s, kv head g, pairs [pb, pb + pc) of the
// sequence's q_len·G pairs (pair i: row t0 + i / G, head g·G + i % G), the sequence's kv_len and
// q_len, and the keys any of its pairs may see, [klo, khi).
struct Item {
  int32_t s, g, pb, pc, t0, kv, ql, klo, khi;
};
static_assert(sizeof(Item) == 9 * sizeof(int32_t), "items go to the device inside an int32 buffer");

struct Params {
  const void *q, *k, *v;
  const int32_t* page_table;
  const Item* items;
  const float* sinks;
  void* o;
  bool o_f32;
  float* lse;
  float* part;     // [items, chunks, R, Dv + 2]: o unnormalized, then m and l
  int64_t Hq, Hkv, D, Dv, page_size, max_pages, G;
  int64_t chunk;   // L keys per chunk
  int chunks;      // chunks per item (grid.y)
  float scale, softcap;
  bool causal;
  int64_t window;
  bool k_vec;      // key rows in 16-byte loads (D·sizeof(T) a multiple of 16, k_cache 16-byte aligned)
};

using primitives::cuda::from_f32;  // primitives/cuda_convert.cuh
using primitives::cuda::to_f32;
using primitives::cuda::warp_max;  // primitives/cuda_reduce.cuh
using primitives::cuda::warp_sum;
// exp(a − b) with exp(−inf − anything) = 0 (b = −inf only when a is too).
__device__ __forceinline__ float weight(float a, float b) { return a == -INFINITY ? 0.0f : __expf(a - b); }

// The visible keys [lo, hi) of pair i of item it (v1's rule: causal and window around the row's
// position kv_len − q_len + its index in the sequence).
__device__ __forceinline__ void pair_range(const Params& p, const Item& it, int i, int* lo, int* hi) {
  if (i >= it.pc) { *lo = *hi = 0; return; }
  const int64_t pos = int64_t{it.kv} - it.ql + (it.pb + i) / p.G;
  *lo = static_cast<int>(p.window >= 0 ? max(int64_t{0}, pos - p.window) : 0);
  *hi = static_cast<int>(p.causal ? min(int64_t{it.kv}, pos + 1) : int64_t{it.kv});
}

// The block's state after its keys: per warp, then merged into warp 0's slots.
template <int R>
struct Shared {
  float q[R][kMaxDim];
  int lo[R], hi[R];
  float m[kWarps][R], l[kWarps][R];
  float acc[kWarps][R][kMaxDim];
};

// One warp's online-softmax state over its keys: m and the lane's part of l per pair, and the
// lane's columns d = lane + 32·c of the unnormalized o.
template <int R>
struct WarpState {
  float m[R], l[R], acc[R][kPerLane];
};

// The scores of one key row against the R queries in shared memory (every lane reads the same q
// element: a broadcast), in 16-byte loads where the row allows.
template <class T, int R>
__device__ __forceinline__ void dot_row(const Params& p, const Shared<R>& sh, const T* kr, float* sc) {
  if (p.k_vec) {
    constexpr int E = 16 / sizeof(T);
    const uint4* k4 = reinterpret_cast<const uint4*>(kr);
    for (int64_t d0 = 0; d0 < p.D; d0 += E) {
      const uint4 raw = k4[d0 / E];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int u = 0; u < E; ++u) {
        const float x = to_f32(e[u]);
#pragma unroll
        for (int r = 0; r < R; ++r) sc[r] += sh.q[r][d0 + u] * x;
      }
    }
    return;
  }
  for (int64_t d = 0; d < p.D; ++d) {
    const float x = to_f32(kr[d]);
#pragma unroll
    for (int r = 0; r < R; ++r) sc[r] += sh.q[r][d] * x;
  }
}

// Keys [j, j + 32) of the chunk, one per lane: scores, the online update, then P·V.
template <class T, int R>
__device__ void step(const Params& p, const Item& it, Shared<R>& sh, WarpState<R>& w, int64_t j, int64_t end) {
  const int lane = threadIdx.x & 31;
  const int64_t key = j + lane;
  const bool valid = key < end;
  // Key positions and the page size fit int32 (supports()): 32-bit division, not the emulated 64-bit one.
  const int k32 = static_cast<int>(key), ps = static_cast<int>(p.page_size);
  const int64_t row = valid ? int64_t{p.page_table[int64_t{it.s} * p.max_pages + k32 / ps]} * ps + k32 % ps : 0;
  float sc[R], pr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) sc[r] = 0.0f;
  if (valid) dot_row<T, R>(p, sh, static_cast<const T*>(p.k) + (row * p.Hkv + it.g) * p.D, sc);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float s = sc[r];
    if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
    if (!valid || key < sh.lo[r] || key >= sh.hi[r]) s = -INFINITY;
    const float mn = fmaxf(w.m[r], warp_max(s));
    const float a = weight(w.m[r], mn);
    pr[r] = weight(s, mn);
    w.l[r] = w.l[r] * a + pr[r];
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) w.acc[r][c] *= a;
    w.m[r] = mn;
  }
  const int n = static_cast<int>(min(int64_t{32}, end - j));
  const T* vbase = static_cast<const T*>(p.v) + int64_t{it.g} * p.Dv;
  for (int k0 = 0; k0 < n; k0 += kVUnroll) {  // kVUnroll value rows in flight at once
    float v[kVUnroll][kPerLane];
#pragma unroll
    for (int u = 0; u < kVUnroll; ++u) {
      const int64_t rk = __shfl_sync(0xffffffffu, row, (k0 + u) & 31);
      const T* vr = vbase + rk * p.Hkv * p.Dv;
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) {
        const int64_t d = lane + 32 * c;
        v[u][c] = k0 + u < n && d < p.Dv ? to_f32(vr[d]) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kVUnroll; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float pk = __shfl_sync(0xffffffffu, pr[r], (k0 + u) & 31);  // 0 past n: v is 0 there too
        // A key this pair does not see (p = 0: another row of the item sees it) adds nothing, even
        // where its value is not finite (0·Inf would be NaN; the reference never reads it).
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) w.acc[r][c] = pk != 0.0f ? fmaf(pk, v[u][c], w.acc[r][c]) : w.acc[r][c];
      }
  }
}

// Warps' states into shared memory, merged by the block into the chunk's partial.
template <int R>
__device__ void write_partial(const Params& p, Shared<R>& sh, WarpState<R>& w) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float l = warp_sum(w.l[r]);
    if (lane == 0) sh.m[warp][r] = w.m[r], sh.l[warp][r] = l;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c)
      if (lane + 32 * c < p.Dv) sh.acc[warp][r][lane + 32 * c] = w.acc[r][c];
  }
  __syncthreads();
  float* out = p.part + (int64_t{blockIdx.x} * p.chunks + blockIdx.y) * R * (p.Dv + 2);
  for (int r = 0; r < R; ++r) {
    float M = -INFINITY;
    for (int x = 0; x < kWarps; ++x) M = fmaxf(M, sh.m[x][r]);
    for (int64_t d = threadIdx.x; d < p.Dv + 2; d += blockDim.x) {
      float sum = 0.0f;
      for (int x = 0; x < kWarps; ++x) {
        const float wx = weight(sh.m[x][r], M);
        sum += wx * (d < p.Dv ? sh.acc[x][r][d] : sh.l[x][r]);
      }
      out[r * (p.Dv + 2) + d] = d == p.Dv ? M : sum;
    }
  }
}

template <class T, int R>
__global__ void __launch_bounds__(32 * kWarps, 1) chunk_kernel(Params p) {
  __shared__ Shared<R> sh;
  const Item it = p.items[blockIdx.x];
  const int64_t begin = it.klo + int64_t{blockIdx.y} * p.chunk, end = min(int64_t{it.khi}, begin + p.chunk);
  for (int64_t x = threadIdx.x; x < int64_t{R} * p.D; x += blockDim.x) {
    const int r = static_cast<int>(x / p.D);
    const int64_t d = x % p.D;
    const int64_t t = it.t0 + (it.pb + r) / p.G, h = it.g * p.G + (it.pb + r) % p.G;
    sh.q[r][d] = r < it.pc ? to_f32(static_cast<const T*>(p.q)[(t * p.Hq + h) * p.D + d]) * p.scale : 0.0f;
  }
  if (threadIdx.x < R) pair_range(p, it, threadIdx.x, &sh.lo[threadIdx.x], &sh.hi[threadIdx.x]);
  __syncthreads();
  WarpState<R> w;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    w.m[r] = -INFINITY, w.l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) w.acc[r][c] = 0.0f;
  }
  for (int64_t j = begin + 32 * (threadIdx.x >> 5); j < end; j += kTile) step<T, R>(p, it, sh, w, j, end);
  write_partial<R>(p, sh, w);
}

// One block per (item, pair): the chunks' partials merged, with the sink as a chunk of no value.
template <class T, int R>
__global__ void merge_kernel(Params p) {
  const Item it = p.items[blockIdx.x];
  const int r = blockIdx.y;
  if (r >= it.pc) return;
  const int64_t t = it.t0 + (it.pb + r) / p.G, h = it.g * p.G + (it.pb + r) % p.G;
  const float* part = p.part + int64_t{blockIdx.x} * p.chunks * R * (p.Dv + 2) + r * (p.Dv + 2);
  const int64_t stride = int64_t{R} * (p.Dv + 2);
  float M = p.sinks ? p.sinks[h] : -INFINITY;
  for (int c = 0; c < p.chunks; ++c) M = fmaxf(M, part[c * stride + p.Dv]);
  float L = p.sinks ? weight(p.sinks[h], M) : 0.0f;
  for (int c = 0; c < p.chunks; ++c) L += weight(part[c * stride + p.Dv], M) * part[c * stride + p.Dv + 1];
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  for (int64_t d = threadIdx.x; d < p.Dv; d += blockDim.x) {
    float sum = 0.0f;
    for (int c = 0; c < p.chunks; ++c) sum += weight(part[c * stride + p.Dv], M) * part[c * stride + d];
    const float x = sum * inv;
    const int64_t at = (t * p.Hq + h) * p.Dv + d;
    if (p.o_f32)
      static_cast<float*>(p.o)[at] = x;
    else
      static_cast<T*>(p.o)[at] = from_f32<T>(x);
  }
  if (threadIdx.x == 0) p.lse[t * p.Hq + h] = L > 0.0f && M > -INFINITY ? M + logf(L) : -INFINITY;
}

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, std::string(kKernelName) + " (cuda_v2): " + msg);
}

// (query row, head) pairs per item: the GQA group (a power of two up to 8), whole.
int rows_per_item(int64_t G) { return G >= 8 ? 8 : G >= 4 ? 4 : G >= 2 ? 2 : 1; }

// The work list: every sequence's pairs of each kv head in items of R.
std::vector<Item> work_items(const Problem& p, int R) {
  std::vector<Item> items;
  const int64_t G = p.group();
  for (int64_t s = 0; s < p.N; ++s) {
    const int64_t ql = p.q_len(s), kv = p.kv_len(s), pairs = ql * G;
    for (int64_t g = 0; g < p.Hkv; ++g)
      for (int64_t pb = 0; pb < pairs; pb += R) {
        const int64_t pc = std::min<int64_t>(R, pairs - pb);
        const int64_t first = kv - ql + pb / G, last = kv - ql + (pb + pc - 1) / G;  // positions
        const int64_t klo = p.key_lo(first), khi = std::max(klo, p.key_hi(s, last));
        items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(g), static_cast<int32_t>(pb),
                         static_cast<int32_t>(pc), static_cast<int32_t>(p.cu_q[s]), static_cast<int32_t>(kv),
                         static_cast<int32_t>(ql), static_cast<int32_t>(klo), static_cast<int32_t>(khi)});
      }
  }
  return items;
}

// Keys per chunk: the items' keys over about 1024 blocks (8 per SM of an H100 / H200), so that one
// long sequence among short ones is cut too, but at most 64 chunks an item (every item gets the
// longest one's count of blocks: the short ones' are empty); whole tiles.
int64_t chunk_length(const std::vector<Item>& items) {
  int64_t longest = 1, total = 0;
  for (const Item& it : items) longest = std::max<int64_t>(longest, it.khi - it.klo), total += it.khi - it.klo;
  const int64_t L = std::max({int64_t{kTile}, (total + 1023) / 1024, (longest + 63) / 64});
  return (L + kTile - 1) / kTile * kTile;
}

int chunk_count(const std::vector<Item>& items, int64_t L) {
  int64_t n = 1;
  for (const Item& it : items) n = std::max<int64_t>(n, (it.khi - it.klo + L - 1) / L);
  return static_cast<int>(n);
}

template <class T, int R>
void launch(const Params& k, int items, cudaStream_t stream) {
  chunk_kernel<T, R><<<dim3(static_cast<unsigned>(items), static_cast<unsigned>(k.chunks)), 32 * kWarps, 0, stream>>>(k);
  cuda::check_launch("paged_attention cuda_v2 chunk_kernel", stream);
  merge_kernel<T, R><<<dim3(static_cast<unsigned>(items), static_cast<unsigned>(R)), 128, 0, stream>>>(k);
  cuda::check_launch("paged_attention cuda_v2 merge_kernel", stream);
}

template <class T>
void launch_rows(const Params& k, int R, int items, cudaStream_t stream) {
  switch (R) {
    case 1: return launch<T, 1>(k, items, stream);
    case 2: return launch<T, 2>(k, items, stream);
    case 4: return launch<T, 4>(k, items, stream);
    default: return launch<T, 8>(k, items, stream);
  }
}

class CudaV2 final : public primitives::CudaBackend<Implementation> {
 public:
  std::string name() const override { return "cuda_v2"; }
  std::string description() const override {
    return "NVIDIA GPUs: split-KV, keys across the lanes, a kv head's query heads together (v2, f32 math)";
  }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCUDA) return Availability::no("the cuda_v2 backend runs on CUDA device memory");
    if (const Availability a = available(); !a.ok) return a;
    if (p.D > kMaxDim || p.Dv > kMaxDim)
      return Availability::no("the cuda_v2 backend supports D, Dv <= 256, got D=" + std::to_string(p.D) +
                              ", Dv=" + std::to_string(p.Dv));
    if (p.T >= INT_MAX || p.max_pages * p.page_size >= INT_MAX)  // key positions and Item fields in int32
      return Availability::no("the cuda_v2 backend needs fewer than 2^31 query rows and key positions");
    if (const std::string why = cuda::capture_refusal(static_cast<cudaStream_t>(p.stream), kIndexCopy); !why.empty())
      return Availability::no(why);
    const size_t bytes = scratch_bytes(p);
    if (bytes > kMaxScratch)
      return Availability::no("the cuda_v2 backend's chunk partials would take at least " +
                              std::to_string(bytes >> 20) + " MiB (> 1024: long prefills belong to cuda)");
    return Availability::yes();
  }
  void forward(const Problem& p) const override {
    TESSERA_NVTX_RANGE("paged_attention.cuda_v2.fwd");
    const int dev = p.device.index;
    cuda::DeviceGuard guard(dev);
    const std::string who = std::string(kKernelName) + " (cuda_v2)";
    for (const auto& [ptr, what] : {std::pair<const void*, const char*>{p.q, "q"}, {p.k, "k_cache"}, {p.v, "v_cache"},
                                    {p.o, "o"}, {p.lse, "lse"}})
      cuda::require_accessible(ptr, dev, who, what);
    if (p.sinks) cuda::require_accessible(p.sinks, dev, who, "sinks");
    const auto stream = static_cast<cudaStream_t>(p.stream);
    if (const std::string why = cuda::capture_refusal(stream, kIndexCopy); !why.empty()) fail(ErrorCode::kUnsupported, why);
    const int R = rows_per_item(p.group());
    const std::vector<Item> items = work_items(p, R);
    if (items.empty()) return;
    const int64_t L = chunk_length(items);
    const int chunks = chunk_count(items, L);
    // One staged copy: the page table, then the items (both int32).
    const size_t npt = static_cast<size_t>(p.N * p.max_pages), nit = items.size() * (sizeof(Item) / sizeof(int32_t));
    std::vector<int32_t> idx(npt + nit);
    std::copy(p.page_table, p.page_table + npt, idx.begin());
    std::memcpy(idx.data() + npt, items.data(), items.size() * sizeof(Item));
    cuda::DeviceBuffer buf(idx.size() * sizeof(int32_t), stream, dev);
    cuda::copy_host_to_device(buf.get(), idx.data(), buf.bytes(), stream, dev, "paged_attention (cuda_v2): copy of the work list");
    const size_t part_floats = items.size() * static_cast<size_t>(chunks) * R * static_cast<size_t>(p.Dv + 2);
    if (part_floats * sizeof(float) > kMaxScratch)
      fail(ErrorCode::kUnsupported, "the chunk partials would take " + std::to_string(part_floats * sizeof(float) >> 20) +
                                        " MiB (> 1024: long prefills belong to cuda)");
    cuda::DeviceBuffer part(part_floats * sizeof(float), stream, dev);
    const int32_t* d = static_cast<const int32_t*>(buf.get());
    Params k{p.q, p.k, p.v, d, reinterpret_cast<const Item*>(d + npt), p.sinks, p.o, p.o_f32, p.lse,
             static_cast<float*>(part.get()), p.Hq, p.Hkv, p.D, p.Dv, p.page_size, p.max_pages, p.group(), L, chunks,
             static_cast<float>(p.scale), static_cast<float>(p.softcap), p.causal, p.window,
             (p.D * static_cast<int64_t>(dtype_size(p.dtype))) % 16 == 0 && reinterpret_cast<uintptr_t>(p.k) % 16 == 0};
    const int n = static_cast<int>(items.size());
    if (p.dtype == DType::kF32) launch_rows<float>(k, R, n, stream);
    else if (p.dtype == DType::kBF16) launch_rows<__nv_bfloat16>(k, R, n, stream);
    else launch_rows<__half>(k, R, n, stream);
    // buf and part are released stream-ordered when they go out of scope.
  }

 private:
  // The partials of one chunk per item, counted without building the work list: a long prefill
  // named on cuda_v2 is refused before anything is allocated (forward checks the real count).
  static size_t scratch_bytes(const Problem& p) {
    const int64_t G = p.group(), R = rows_per_item(G);
    double items = 0;
    for (int64_t s = 0; s < p.N; ++s) items += static_cast<double>(p.Hkv) * ((p.q_len(s) * G + R - 1) / R);
    return static_cast<size_t>(std::min(items * R * (p.Dv + 2) * sizeof(float), 1e18));
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cuda_v2_implementation() { return primitives::make_cuda<CudaV2>(); }

TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cuda_v2_implementation()); });

}  // namespace tessera::paged_attention
