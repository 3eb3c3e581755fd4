// Tessera primitives: split-KV decode attention over a paged cache on CUDA cores (FlashDecoding's
// layout), shared by paged_attention's and mla_decode's cuda_v2. Header-only: device kernels and
// the host plan / launch; included by those kernels' .cu files in the CUDA module.
//
// The problem, as both kernels give it: query rows t (each of a sequence s, at key position
// kv_len(s) − q_len(s) + its index in s) and query heads h; head h reads kv head h / G; a cache
// slot's key row is k + slot·k_row + g·k_head (D elements), its value row v + slot·v_row +
// g·v_head (Dv elements: MLA's values are the first Dv of the key row, v = k); slot of key j of s
// = page_table[s][j / page_size]·page_size + j % page_size. Row t sees keys [lo, hi): lo = pos −
// window (window >= 0) else 0, hi = pos + 1 (causal) else kv_len, within [0, kv_len).
// s_j = scale·q·k_j (then c·tanh(s/c) with a soft cap c > 0); o = Σ softmax(s)_j·v_j and lse =
// log Σ exp(s_j), a sink σ_h (optional) joining the softmax as exp(σ_h) with no value; no key and
// no sink: o = 0, lse = −inf. f32 math, __expf. The caches may hold another type than q and o (C:
// paged_attention's f8e4m3 caches); o is scaled by v_scale with the softmax's 1/l.
//
//   * A work item is one sequence, one kv head and up to R (query row, head) pairs that read it
//     (pair i: row t0 + i / G, head g·G + i % G): the kv head's keys are read once for all of them.
//   * The item's visible keys are cut into chunks, one block (4 warps) per (item, chunk).
//   * In a block each lane owns a key: 32 page-table lookups and key-row loads per warp in
//     flight, scores against q in shared memory; the online softmax advances by one warp-wide max
//     per 32 keys; P·V broadcasts each key's p with a shuffle, every lane owning Dv/32 columns.
//   * The 4 warps merge in shared memory into the chunk's f32 partial (o unnormalized, m, l); a
//     second kernel merges the chunks, with the sink as one more chunk of no value.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_util.h"
#include "primitives/cuda_convert.cuh"
#include "primitives/cuda_reduce.cuh"

namespace tessera::primitives::cuda::split_kv {

constexpr int kWarps = 4;
constexpr int kTile = 32 * kWarps;  // keys a block covers per step
constexpr int kVUnroll = 4;         // value rows loaded ahead in P·V
constexpr size_t kMaxScratch = size_t{1} << 30;

// The compile-time head dims a kernel instantiates: D <= MaxD, Dv <= MaxDv (a multiple of 32).
template <int MaxD, int MaxDv>
struct Limits {
  static_assert(MaxDv % 32 == 0, "every lane owns MaxDv / 32 columns of o");
  static constexpr int kMaxD = MaxD, kMaxDv = MaxDv, kPerLane = MaxDv / 32;
};

// One work item (int32 fields, host-built): sequence s, kv head g, pairs [pb, pb + pc) of the
// sequence's q_len·G pairs, its first query row t0, kv_len and q_len, and the keys any of its
// pairs may see, [klo, khi).
struct Item {
  int32_t s, g, pb, pc, t0, kv, ql, klo, khi;
};
static_assert(sizeof(Item) == 9 * sizeof(int32_t), "items go to the device inside an int32 buffer");

struct Params {
  const void *q, *k, *v;            // q [T, Hq, D]
  const int32_t* page_table;        // [N, max_pages] (device; run() sets it)
  const Item* items;                // (device; run() sets it)
  const float* sinks;               // [Hq] or nullptr
  void* o;                          // [T, Hq, Dv], f32 (o_f32) or the inputs' dtype
  bool o_f32;
  float* lse;                       // [T, Hq]
  float* part;                      // [items, chunks, R, Dv + 2]: o unnormalized, then m, l (run())
  int64_t Hq, G, D, Dv, page_size, max_pages;
  int64_t k_row, k_head, v_row, v_head;  // elements between slots / kv heads
  int64_t chunk;                    // keys per chunk: the caller's (> 0, rounded up to tiles) or run()'s
  int chunks;                       // chunks per item, grid.y (run())
  float scale, softcap;
  float v_scale = 1.0f;             // o = v_scale · Σ p·v (a cache's dequantization scale)
  bool causal;
  int64_t window;
  bool k_vec;                       // key rows in 16-byte loads (run())
};

// exp(a − b) with exp(−inf − anything) = 0 (b = −inf only when a is too).
__device__ __forceinline__ float weight(float a, float b) { return a == -INFINITY ? 0.0f : __expf(a - b); }

// The visible keys [lo, hi) of pair i of item it.
__device__ __forceinline__ void pair_range(const Params& p, const Item& it, int i, int* lo, int* hi) {
  if (i >= it.pc) { *lo = *hi = 0; return; }
  const int64_t pos = int64_t{it.kv} - it.ql + (it.pb + i) / p.G;
  *lo = static_cast<int>(p.window >= 0 ? max(int64_t{0}, pos - p.window) : 0);
  *hi = static_cast<int>(p.causal ? min(int64_t{it.kv}, pos + 1) : int64_t{it.kv});
}

template <int R, class Lim>
struct Shared {
  float q[R][Lim::kMaxD];
  int lo[R], hi[R];
  float m[kWarps][R], l[kWarps][R];
  float acc[kWarps][R][Lim::kMaxDv];
};

// One warp's online-softmax state: m and the lane's part of l per pair, and the lane's columns
// d = lane + 32·c of the unnormalized o.
template <int R, class Lim>
struct WarpState {
  float m[R], l[R], acc[R][Lim::kPerLane];
};

// The scores of one key row against the R queries in shared memory (every lane reads the same q
// element: a broadcast), in 16-byte loads where the row allows. T: the cache's element type.
template <class T, int R, class Lim>
__device__ __forceinline__ void dot_row(const Params& p, const Shared<R, Lim>& sh, const T* kr, float* sc) {
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
template <class C, int R, class Lim>
__device__ void step(const Params& p, const Item& it, Shared<R, Lim>& sh, WarpState<R, Lim>& w, int64_t j,
                     int64_t end) {
  const int lane = threadIdx.x & 31;
  const int64_t key = j + lane;
  const bool valid = key < end;
  // Key positions and the page size fit int32 (the backends' supports()): 32-bit division.
  const int k32 = static_cast<int>(key), ps = static_cast<int>(p.page_size);
  const int64_t row = valid ? int64_t{p.page_table[int64_t{it.s} * p.max_pages + k32 / ps]} * ps + k32 % ps : 0;
  float sc[R], pr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) sc[r] = 0.0f;
  if (valid) dot_row<C, R, Lim>(p, sh, static_cast<const C*>(p.k) + row * p.k_row + it.g * p.k_head, sc);
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
    for (int c = 0; c < Lim::kPerLane; ++c) w.acc[r][c] *= a;
    w.m[r] = mn;
  }
  const int n = static_cast<int>(min(int64_t{32}, end - j));
  const C* vbase = static_cast<const C*>(p.v) + it.g * p.v_head;
  for (int k0 = 0; k0 < n; k0 += kVUnroll) {  // kVUnroll value rows in flight at once
    float v[kVUnroll][Lim::kPerLane];
#pragma unroll
    for (int u = 0; u < kVUnroll; ++u) {
      const int64_t rk = __shfl_sync(kFullMask, row, (k0 + u) & 31);
      const C* vr = vbase + rk * p.v_row;
#pragma unroll
      for (int c = 0; c < Lim::kPerLane; ++c) {
        const int64_t d = lane + 32 * c;
        v[u][c] = k0 + u < n && d < p.Dv ? to_f32(vr[d]) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kVUnroll; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float pk = __shfl_sync(kFullMask, pr[r], (k0 + u) & 31);  // 0 past n: v is 0 there too
        // A key this pair does not see (p = 0: another row of the item sees it) adds nothing, even
        // where its value is not finite (0·Inf would be NaN; the reference never reads it).
#pragma unroll
        for (int c = 0; c < Lim::kPerLane; ++c) w.acc[r][c] = pk != 0.0f ? fmaf(pk, v[u][c], w.acc[r][c]) : w.acc[r][c];
      }
  }
}

// Warps' states into shared memory, merged by the block into the chunk's partial.
template <int R, class Lim>
__device__ void write_partial(const Params& p, Shared<R, Lim>& sh, WarpState<R, Lim>& w) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float l = warp_sum(w.l[r]);
    if (lane == 0) sh.m[warp][r] = w.m[r], sh.l[warp][r] = l;
#pragma unroll
    for (int c = 0; c < Lim::kPerLane; ++c)
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

// `__launch_bounds__(128, 1)`: with the default bound ptxas spilled 24 bytes in one instance.
// T: q's element type, C: the caches'.
template <class T, class C, int R, class Lim>
__global__ void __launch_bounds__(32 * kWarps, 1) chunk_kernel(Params p) {
  __shared__ Shared<R, Lim> sh;
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
  WarpState<R, Lim> w;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    w.m[r] = -INFINITY, w.l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < Lim::kPerLane; ++c) w.acc[r][c] = 0.0f;
  }
  for (int64_t j = begin + 32 * (threadIdx.x >> 5); j < end; j += kTile) step<C, R, Lim>(p, it, sh, w, j, end);
  write_partial<R, Lim>(p, sh, w);
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
  // L = 0: no key seen (o 0, lse −inf); a NaN L (a non-finite key seen: the caches are not
  // scanned) stays NaN in o and lse, as in the reference — never "saw nothing".
  const float inv = L == 0.0f ? 0.0f : p.v_scale / L;
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
  if (threadIdx.x == 0) p.lse[t * p.Hq + h] = L == 0.0f ? -INFINITY : M + logf(L);
}

// ---- host: the plan and the launch ----

// A sequence as the plan sees it: its first query row, q_len and kv_len.
struct Seq {
  int64_t t0, ql, kv;
};

// (query row, head) pairs per item: the GQA group rounded down to a power of two, at most max_r.
inline int rows_per_item(int64_t G, int max_r) {
  int r = 1;
  while (r * 2 <= max_r && r * 2 <= G) r *= 2;
  return r;
}

// The work list: every sequence's pairs of each kv head in items of R, with their visible keys.
inline std::vector<Item> work_items(const std::vector<Seq>& seqs, int64_t Hkv, int64_t G, int R, bool causal,
                                    int64_t window) {
  std::vector<Item> items;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const Seq& q = seqs[s];
    const int64_t pairs = q.ql * G;
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t pb = 0; pb < pairs; pb += R) {
        const int64_t pc = std::min<int64_t>(R, pairs - pb);
        const int64_t first = q.kv - q.ql + pb / G, last = q.kv - q.ql + (pb + pc - 1) / G;  // positions
        const int64_t klo = window >= 0 ? std::max<int64_t>(0, first - window) : 0;
        const int64_t khi = std::max(klo, causal ? std::min(q.kv, last + 1) : q.kv);
        items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(g), static_cast<int32_t>(pb),
                         static_cast<int32_t>(pc), static_cast<int32_t>(q.t0), static_cast<int32_t>(q.kv),
                         static_cast<int32_t>(q.ql), static_cast<int32_t>(klo), static_cast<int32_t>(khi)});
      }
  }
  return items;
}

// The partials of one chunk per item, counted without building the work list: a long prefill is
// refused before anything is allocated (run() checks the real count).
inline size_t scratch_lower_bound(const std::vector<int64_t>& q_lens, int64_t Hkv, int64_t G, int R, int64_t Dv) {
  double items = 0;
  for (const int64_t ql : q_lens) items += static_cast<double>(Hkv) * ((ql * G + R - 1) / R);
  return static_cast<size_t>(std::min(items * R * static_cast<double>(Dv + 2) * sizeof(float), 1e18));
}

// Keys per chunk: the items' keys over about 1024 blocks (8 per SM of an H100 / H200), so that one
// long sequence among short ones is cut too, but at most 64 chunks an item (every item gets the
// longest one's count of blocks: the short ones' are empty); whole tiles.
inline int64_t chunk_length(const std::vector<Item>& items) {
  int64_t longest = 1, total = 0;
  for (const Item& it : items) longest = std::max<int64_t>(longest, it.khi - it.klo), total += it.khi - it.klo;
  const int64_t L = std::max({int64_t{kTile}, (total + 1023) / 1024, (longest + 63) / 64});
  return (L + kTile - 1) / kTile * kTile;
}

inline int chunk_count(const std::vector<Item>& items, int64_t L) {
  int64_t n = 1;
  for (const Item& it : items) n = std::max<int64_t>(n, (it.khi - it.klo + L - 1) / L);
  return static_cast<int>(n);
}

template <class T, class C, int R, class Lim>
void launch(const Params& k, int items, cudaStream_t stream) {
  chunk_kernel<T, C, R, Lim><<<dim3(static_cast<unsigned>(items), static_cast<unsigned>(k.chunks)), 32 * kWarps, 0,
                            stream>>>(k);
  tessera::cuda::check_launch("split_kv chunk_kernel", stream);
  merge_kernel<T, R><<<dim3(static_cast<unsigned>(items), static_cast<unsigned>(R)), 128, 0, stream>>>(k);
  tessera::cuda::check_launch("split_kv merge_kernel", stream);
}

// Why run() cannot take a problem, or "" (its users' supports()): head dims over Lim's, query rows
// or key positions past int32 (the Item fields, the page arithmetic), a stream being captured (the
// work list goes through a staged copy: `index_copy` says so), or partials past kMaxScratch with
// one chunk an item (counted without building the work list; run() checks the real count).
template <class Lim>
std::string refusal(int64_t D, int64_t Dv, int64_t rows, int64_t key_positions, const std::vector<int64_t>& q_lens,
                    int64_t Hkv, int64_t G, int max_r, cudaStream_t stream, const char* index_copy) {
  if (D > Lim::kMaxD || Dv > Lim::kMaxDv)
    return "D <= " + std::to_string(Lim::kMaxD) + " and Dv <= " + std::to_string(Lim::kMaxDv) +
           " are supported, got D=" + std::to_string(D) + ", Dv=" + std::to_string(Dv);
  if (rows >= INT32_MAX || key_positions >= INT32_MAX) return "needs fewer than 2^31 query rows and key positions";
  if (std::string why = tessera::cuda::capture_refusal(stream, index_copy); !why.empty()) return why;
  const size_t bytes = scratch_lower_bound(q_lens, Hkv, G, rows_per_item(G, max_r), Dv);
  if (bytes > kMaxScratch)
    return "the chunk partials would take at least " + std::to_string(bytes >> 20) + " MiB (> 1024)";
  return {};
}

// Plans `seqs` (R pairs an item, R a power of two <= MaxR; q and o of T, the caches of C), copies
// the page table (host, n_pages entries) and the work list to the device in one staged copy, and launches both kernels
// on `stream`; `k` holds everything but what this fills. Throws kUnsupported (via `refuse`) when
// the partials would pass kMaxScratch. Scratch is released stream-ordered.
template <class T, class C, class Lim, int MaxR, class Refuse>
void run(Params k, const std::vector<Seq>& seqs, int64_t Hkv, const int32_t* page_table, size_t n_pages,
         cudaStream_t stream, int device, const char* what, Refuse refuse) {
  static_assert(MaxR == 1 || MaxR == 2 || MaxR == 4 || MaxR == 8, "items of 1, 2, 4 or 8 pairs");
  const int R = rows_per_item(k.G, MaxR);
  const std::vector<Item> items = work_items(seqs, Hkv, k.G, R, k.causal, k.window);
  if (items.empty()) return;
  if (k.chunk > 0) {  // the caller's (any int64: no longer than the longest item), in whole tiles,
                      // few enough chunks for grid.y
    int64_t longest = 1;
    for (const Item& it : items) longest = std::max<int64_t>(longest, it.khi - it.klo);
    k.chunk = std::max(std::min(k.chunk, longest), (longest + 65534) / 65535);
    k.chunk = (k.chunk + kTile - 1) / kTile * kTile;
  } else {
    k.chunk = chunk_length(items);
  }
  k.chunks = chunk_count(items, k.chunk);
  const size_t part_floats = items.size() * static_cast<size_t>(k.chunks) * R * static_cast<size_t>(k.Dv + 2);
  if (part_floats * sizeof(float) > kMaxScratch)
    refuse("the chunk partials would take " + std::to_string(part_floats * sizeof(float) >> 20) + " MiB (> 1024)");
  std::vector<int32_t> idx(n_pages + items.size() * (sizeof(Item) / sizeof(int32_t)));
  std::copy(page_table, page_table + n_pages, idx.begin());
  std::memcpy(idx.data() + n_pages, items.data(), items.size() * sizeof(Item));
  tessera::cuda::DeviceBuffer buf(idx.size() * sizeof(int32_t), stream, device);
  tessera::cuda::copy_host_to_device(buf.get(), idx.data(), buf.bytes(), stream, device, what);
  tessera::cuda::DeviceBuffer part(part_floats * sizeof(float), stream, device);
  const auto* d = static_cast<const int32_t*>(buf.get());
  k.page_table = d;
  k.items = reinterpret_cast<const Item*>(d + n_pages);
  k.part = static_cast<float*>(part.get());
  constexpr int64_t c = sizeof(C);
  k.k_vec = (k.D * c) % 16 == 0 && (k.k_row * c) % 16 == 0 && (k.k_head * c) % 16 == 0 &&
            reinterpret_cast<std::uintptr_t>(k.k) % 16 == 0;
  const int n = static_cast<int>(items.size());
  if constexpr (MaxR >= 8) {
    if (R == 8) return launch<T, C, 8, Lim>(k, n, stream);
  }
  if (R == 4) return launch<T, C, 4, Lim>(k, n, stream);
  if (R == 2) return launch<T, C, 2, Lim>(k, n, stream);
  launch<T, C, 1, Lim>(k, n, stream);
  // buf and part are released stream-ordered when they go out of scope.
}

}  // namespace tessera::primitives::cuda::split_kv
