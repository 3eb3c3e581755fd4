// attention: the CUDA kernels of the cuda backend, version 1 (CUDA-core FMAs, f32 math).
// Design and limits: docs/kernels/attention.md, section "cuda backend".
//
// Layouts (as in impl.h): q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv], o / dO [Tq, Hq, Dv],
// row-major; element (row, head, col) of a [T, H, W] array is at (row·H + head)·W + col. Sequence
// n owns q rows q0 .. q0+qlen and k rows k0 .. k0+klen (Seq below). lse and the backward's
// delta scratch share the lse layout: dense [N, Hq, Sq], varlen [Hq, Tq] (lse_index).
//
// Forward and dq (row kernels): a CTA = kRowWarps warps = kRowsPerBlock query rows of one
// (sequence, query head); each warp owns kRowsPerWarp rows. Keys stream through shared memory in
// tiles of 32 (f32 copies): lane l scores key l of the tile against each of the warp's rows (a
// dot product over D from shared memory), the warp reduces max / sum with shuffles, and the
// output accumulation runs with lanes over output columns (column lane + 32·c), the tile's
// probabilities broadcast by shuffles. No atomics.
//
// dk/dv: a CTA = 32 keys of one (sequence, kv head) and kBwdGroups(G) warps; thread (lane j,
// warp g) owns key j and the columns g, g + G, g + 2G, ... of its k, v, dk and dv (registers).
// It walks the query rows (of every query head sharing the kv head) that may see those keys, 16
// at a time: partial dot products per column group -> shared memory -> P and dS per (row, key)
// -> dk, dv accumulation. Each key is owned by one CTA, so the result is deterministic.
//
// Dropout (drop_seed set): each (row, key) evaluates primitives/philox.h's rule, the same bits as
// the CPU implementations; a dropped probability is 0 where it meets v (o, dv, dP) and a kept
// one is scaled by drop_scale = 1 / (1 − p); l, lse and the P of dS stay undropped.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "primitives/cuda_reduce.cuh"
#include "primitives/philox.h"

namespace tessera::attention::cuda_kernels {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kKeysPerTile = 32;  // forward / dq: one key per lane
constexpr int kRowWarps = 4;      // warps per CTA of the row kernels
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kRowWarps * kRowsPerWarp;  // query rows per CTA (16)
constexpr int kBwdKeys = 32;                             // keys per CTA of the dk/dv kernel
constexpr int kBwdRows = 16;                             // query rows per step of the dk/dv kernel
constexpr int kMaxHeadDim = 256;
constexpr int kDeltaWarps = 4;  // warps per CTA of the delta kernel

enum ElemType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Everything a kernel reads; pointers are device memory.
struct Params {
  int N = 0;                         // sequences
  int Sq = 0, Sk = 0;                // dense: every sequence's lengths; varlen: the longest
  const int32_t* cu_q = nullptr;     // varlen: [N+1] offsets (device copies); nullptr: dense
  const int32_t* cu_k = nullptr;
  int64_t total_q = 0;
  int Hq = 1, Hkv = 1, group = 1, D = 1, Dv = 1;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int in_t = kF32;                   // dtype of q, k, v
  const float* alibi = nullptr;      // slopes, or nullptr
  int64_t alibi_stride = 0;          // 0 ([Hq]) or Hq ([N, Hq])
  const int32_t* seg_q = nullptr;    // [Tq] and [Tk] (dense), or nullptr
  const int32_t* seg_k = nullptr;
  float scale = 1.0f, softcap = 0.0f;
  bool causal = false;
  int64_t wl = -1, wr = -1;          // window left / right, -1 = unbounded
  const int32_t* drop_seed = nullptr;  // dropout: the Philox key [2] (device memory); nullptr = none
  uint32_t drop_threshold = 0;
  float drop_scale = 1.0f;           // 1 / (1 − p)
  const void* bias = nullptr;        // additive bias (dense form), or nullptr
  int bias_t = kF32;
  int64_t bias_stride[4] = {0, 0, 0, 0};  // of (n, h, i, j); 0 on a broadcast dim
  int bias_shape[4] = {1, 1, 1, 1};
  // forward outputs
  void* o = nullptr;
  int o_t = kF32;
  float* lse = nullptr;
  // backward inputs, scratch and outputs
  const void* o_in = nullptr;
  int o_in_t = kF32;
  const float* lse_in = nullptr;
  const void* dout = nullptr;
  int dout_t = kF32;
  float* delta = nullptr;            // scratch, lse layout: Σ_c dO·o per row and head
  void* dq = nullptr;
  int dq_t = kF32;
  void* dk = nullptr;
  int dk_t = kF32;
  void* dv = nullptr;
  int dv_t = kF32;
  void* dbias = nullptr;             // bias_shape, contiguous; nullptr: not asked for
  int dbias_t = kF32;
};

// ---- elements ----

__device__ __forceinline__ float load(const void* p, int t, int64_t i) {
  switch (t) {
    case kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store(void* p, int t, int64_t i, float x) {
  switch (t) {
    case kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x); break;
    case kF16: static_cast<__half*>(p)[i] = __float2half_rn(x); break;
    default: static_cast<float*>(p)[i] = x; break;
  }
}

using primitives::cuda::warp_max;  // primitives/cuda_reduce.cuh
using primitives::cuda::warp_sum;

// ---- geometry and masks (the rules of impl.h's Problem, on the device) ----

struct Seq {
  int64_t q0, k0;  // first q row, first k row
  int qlen, klen;
  int64_t off;     // klen − qlen: row i sits at key position i + off (bottom-right alignment)
};

__device__ __forceinline__ Seq sequence(const Params& p, int n) {
  Seq s;
  if (p.cu_q) {
    s.q0 = p.cu_q[n], s.qlen = p.cu_q[n + 1] - p.cu_q[n];
    s.k0 = p.cu_k[n], s.klen = p.cu_k[n + 1] - p.cu_k[n];
  } else {
    s.q0 = static_cast<int64_t>(n) * p.Sq, s.qlen = p.Sq;
    s.k0 = static_cast<int64_t>(n) * p.Sk, s.klen = p.Sk;
  }
  s.off = static_cast<int64_t>(s.klen) - s.qlen;
  return s;
}

// Index of (sequence n, head h, row i of the sequence) in lse / delta.
__device__ __forceinline__ int64_t lse_index(const Params& p, const Seq& s, int n, int h, int64_t i) {
  return p.cu_q ? static_cast<int64_t>(h) * p.total_q + s.q0 + i
                : (static_cast<int64_t>(n) * p.Hq + h) * p.Sq + i;
}

// Keys [*lo, *hi) of the sequence that row i may see by position (causal, window); segment
// ids are checked separately. Empty when *lo >= *hi. Same rule as Problem::key_range.
__device__ __forceinline__ void key_range(const Params& p, const Seq& s, int64_t i, int64_t* lo, int64_t* hi) {
  const int64_t c = i + s.off;
  int64_t a = 0, b = s.klen;
  if (p.wl >= 0) a = max(a, c - p.wl);
  if (p.causal) b = min(b, c + 1);
  if (p.wr >= 0) b = min(b, c + p.wr + 1);
  *lo = a;
  *hi = max(a, b);
}

// The score of (row at key position c, key j) from dot = q·k: scaled, soft-capped, ALiBi-biased,
// plus `bias` (bias_of). *capped is the value right after the cap (its derivative needs it).
__device__ __forceinline__ float score(const Params& p, float dot, float slope, int64_t c, int64_t j, float bias,
                                       float* capped) {
  float s = p.scale * dot;
  if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
  *capped = s;
  if (p.alibi) s -= slope * static_cast<float>(c > j ? c - j : j - c);
  return s + bias;
}

// The additive bias of (sequence n, query head h, row i, key j); 0 without one.
__device__ __forceinline__ float bias_of(const Params& p, int n, int h, int64_t i, int64_t j) {
  if (!p.bias) return 0.0f;
  return load(p.bias, p.bias_t, n * p.bias_stride[0] + h * p.bias_stride[1] + i * p.bias_stride[2] +
                                    j * p.bias_stride[3]);
}

// Dropout's factor for the probability of (sequence n, query head h, row i, key j): 1 without
// dropout, else 0 (dropped) or drop_scale (kept).
__device__ __forceinline__ float drop_factor(const Params& p, int n, int h, int64_t i, int64_t j) {
  if (!p.drop_seed) return 1.0f;
  const bool keep = primitives::philox::dropout_keep(
      static_cast<uint32_t>(p.drop_seed[0]), static_cast<uint32_t>(p.drop_seed[1]), p.drop_threshold,
      static_cast<uint32_t>(n), static_cast<uint32_t>(h), static_cast<uint32_t>(i), static_cast<uint32_t>(j));
  return keep ? p.drop_scale : 0.0f;
}

__device__ __forceinline__ float slope_of(const Params& p, int n, int h) {
  return p.alibi ? p.alibi[static_cast<int64_t>(n) * p.alibi_stride + h] : 0.0f;
}

// Copies `rows` rows (head h, `width` columns) of a [T, H, width] array starting at row `row0`
// into shared memory as f32 with row stride `ld`; rows >= `valid` are zero. All threads call it.
__device__ __forceinline__ void load_rows(float* dst, int ld, const void* src, int t, int64_t row0, int rows,
                                          int valid, int H, int h, int width) {
  for (int idx = threadIdx.x; idx < rows * width; idx += blockDim.x) {
    const int r = idx / width, c = idx % width;
    dst[r * ld + c] = r < valid ? load(src, t, ((row0 + r) * H + h) * width + c) : 0.0f;
  }
}

// Key positions any of the rows [i0, i1) may see (the union of their key ranges, clamped to the
// sequence): ranges move right with i, so the first row gives lo and the last row gives hi.
__device__ __forceinline__ void block_key_range(const Params& p, const Seq& s, int64_t i0, int64_t i1, int64_t* lo,
                                                int64_t* hi) {
  int64_t a, b, c, d;
  key_range(p, s, i0, &a, &b);
  key_range(p, s, i1 - 1, &c, &d);
  *lo = min(a, static_cast<int64_t>(s.klen));
  *hi = min(d, static_cast<int64_t>(s.klen));
}

// dot(x[0..n), y[0..n)) from shared memory.
__device__ __forceinline__ float dot_smem(const float* x, const float* y, int n) {
  float acc = 0.0f;
  for (int d = 0; d < n; ++d) acc = fmaf(x[d], y[d], acc);
  return acc;
}

// ---- forward ----

// Shared memory of forward_kernel: q rows [16][D], k tile [32][D+1] (padded: lane l reads row
// l, so a stride of D+1 puts the 32 lanes in 32 different banks), v tile [32][Dv].
inline size_t forward_smem_bytes(int D, int Dv) {
  return sizeof(float) * (static_cast<size_t>(kRowsPerBlock) * D + static_cast<size_t>(kKeysPerTile) * (D + 1) +
                          static_cast<size_t>(kKeysPerTile) * Dv);
}

// Online-softmax state of one query row, held by a warp: m and l are the same in every lane;
// lane holds output columns lane + 32·c.
template <int C>
struct RowState {
  float m, l;
  float acc[C];
};

// One tile of keys for one row of the warp. `sc` is this lane's score (−inf when masked).
// `z`: this lane's dropout factor (1 without dropout); l sums the undropped probabilities.
template <int C>
__device__ __forceinline__ void online_softmax_step(RowState<C>& st, float sc, float z, const float* vs, int Dv,
                                                    int kn, int lane) {
  const float m_new = fmaxf(st.m, warp_max(sc));
  if (m_new == -INFINITY) return;  // warp-uniform: nothing seen so far
  const float pj = sc == -INFINITY ? 0.0f : expf(sc - m_new);
  const float corr = expf(st.m - m_new);  // 0 while m = −inf
  st.l = st.l * corr + warp_sum(pj);
#pragma unroll
  for (int c = 0; c < C; ++c) st.acc[c] *= corr;
  const float pz = pj * z;
  for (int jj = 0; jj < kn; ++jj) {
    const float pjj = __shfl_sync(kFull, pz, jj);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int col = lane + kWarp * c;
      if (col < Dv) st.acc[c] = fmaf(pjj, vs[jj * Dv + col], st.acc[c]);
    }
  }
  st.m = m_new;
}

// grid: x = N · q_blocks (sequence-major), y = Hq; block: kRowWarps warps. C: D, Dv <= 32·C.
template <int C>
__global__ void __launch_bounds__(kRowWarps* kWarp) forward_kernel(Params p, int q_blocks) {
  extern __shared__ float smem[];
  const int n = blockIdx.x / q_blocks, h = blockIdx.y;
  const int i0 = (blockIdx.x % q_blocks) * kRowsPerBlock;
  const Seq s = sequence(p, n);
  if (i0 >= s.qlen) return;  // the whole CTA: this sequence is shorter than the longest
  const int rows = min(kRowsPerBlock, s.qlen - i0);
  const int kvh = h / p.group, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int ldk = p.D + 1;
  float* qs = smem;                               // [16][D]
  float* ks = qs + kRowsPerBlock * p.D;           // [32][D+1]
  float* vs = ks + kKeysPerTile * ldk;            // [32][Dv]
  load_rows(qs, p.D, p.q, p.in_t, s.q0 + i0, kRowsPerBlock, rows, p.Hq, h, p.D);

  const float slope = slope_of(p, n, h);
  RowState<C> st[kRowsPerWarp];
  int64_t rlo[kRowsPerWarp], rhi[kRowsPerWarp];
  int segq[kRowsPerWarp];
#pragma unroll
  for (int t = 0; t < kRowsPerWarp; ++t) {
    const int r = warp * kRowsPerWarp + t;
    st[t].m = -INFINITY, st[t].l = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) st[t].acc[c] = 0.0f;
    rlo[t] = rhi[t] = 0;  // rows past the sequence see nothing
    if (r < rows) key_range(p, s, i0 + r, &rlo[t], &rhi[t]);
    segq[t] = p.seg_q && r < rows ? p.seg_q[s.q0 + i0 + r] : 0;
  }

  int64_t k_lo, k_hi;
  block_key_range(p, s, i0, i0 + rows, &k_lo, &k_hi);
  for (int64_t j0 = k_lo; j0 < k_hi; j0 += kKeysPerTile) {
    const int kn = static_cast<int>(min(static_cast<int64_t>(kKeysPerTile), s.klen - j0));
    __syncthreads();  // the previous tile is consumed (and, first time, q is loaded)
    load_rows(ks, ldk, p.k, p.in_t, s.k0 + j0, kKeysPerTile, kn, p.Hkv, kvh, p.D);
    load_rows(vs, p.Dv, p.v, p.in_t, s.k0 + j0, kKeysPerTile, kn, p.Hkv, kvh, p.Dv);
    __syncthreads();
    const int64_t j = j0 + lane;  // this lane's key
    const int segk = p.seg_k && lane < kn ? p.seg_k[s.k0 + j] : 0;
#pragma unroll
    for (int t = 0; t < kRowsPerWarp; ++t) {
      const int r = warp * kRowsPerWarp + t;
      float sc = -INFINITY, capped, z = 1.0f;
      if (lane < kn && j >= rlo[t] && j < rhi[t] && (!p.seg_q || segq[t] == segk)) {
        sc = score(p, dot_smem(qs + r * p.D, ks + lane * ldk, p.D), slope, i0 + r + s.off, j,
                   bias_of(p, n, h, i0 + r, j), &capped);
        z = drop_factor(p, n, h, i0 + r, j);
      }
      online_softmax_step<C>(st[t], sc, z, vs, p.Dv, kn, lane);
    }
  }

  // o = acc / l, lse = m + log l; a row that saw no key: o = 0, lse = −inf.
#pragma unroll
  for (int t = 0; t < kRowsPerWarp; ++t) {
    const int r = warp * kRowsPerWarp + t;
    if (r >= rows) continue;
    const int64_t i = i0 + r;
    const float inv = st[t].l > 0.0f ? 1.0f / st[t].l : 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int col = lane + kWarp * c;
      if (col < p.Dv) store(p.o, p.o_t, ((s.q0 + i) * p.Hq + h) * p.Dv + col, st[t].acc[c] * inv);
    }
    if (lane == 0) p.lse[lse_index(p, s, n, h, i)] = st[t].l > 0.0f ? st[t].m + logf(st[t].l) : -INFINITY;
  }
}

// ---- backward: delta = rowsum(dO ∘ o) ----

// One warp per (q row, head): grid.x = ceil(Tq·Hq / kDeltaWarps), block kDeltaWarps warps.
__global__ void __launch_bounds__(kDeltaWarps* kWarp) delta_kernel(Params p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kDeltaWarps + threadIdx.x / kWarp;
  if (idx >= p.total_q * p.Hq) return;  // whole warps
  const int lane = threadIdx.x % kWarp;
  const int64_t row = idx / p.Hq, base = idx * p.Dv;  // idx = row·Hq + h: o's (row, h) offset / Dv
  const int h = static_cast<int>(idx % p.Hq);
  float acc = 0.0f;
  for (int c = lane; c < p.Dv; c += kWarp) acc = fmaf(load(p.dout, p.dout_t, base + c), load(p.o_in, p.o_in_t, base + c), acc);
  acc = warp_sum(acc);
  if (lane != 0) return;
  // lse layout: varlen [Hq, Tq]; dense [N, Hq, Sq] with row = n·Sq + i.
  const int64_t li = p.cu_q ? h * p.total_q + row : ((row / p.Sq) * p.Hq + h) * p.Sq + row % p.Sq;
  p.delta[li] = acc;
}

// ---- backward: dq ----

// Shared memory of dq_kernel: q rows [16][D], dO rows [16][Dv], k tile [32][D+1], v tile
// [32][Dv+1] (both read row-per-lane when scoring, hence padded).
inline size_t dq_smem_bytes(int D, int Dv) {
  return sizeof(float) * (static_cast<size_t>(kRowsPerBlock) * (D + Dv) + static_cast<size_t>(kKeysPerTile) * (D + 1) +
                          static_cast<size_t>(kKeysPerTile) * (Dv + 1));
}

// dS of (row, this lane's key): P·(dP − Δ), through the soft cap, times scale. 0 when masked.
// z: the dropout factor of (row, key) (1 without dropout), on dP = z · dO·v.
__device__ __forceinline__ float grad_score(const Params& p, const float* q_row, const float* do_row, const float* k_row,
                                            const float* v_row, float lse, float delta, float slope, int64_t c,
                                            int64_t j, float z, float bias) {
  float capped;
  const float sc = score(p, dot_smem(q_row, k_row, p.D), slope, c, j, bias, &capped);
  if (sc == -INFINITY) return 0.0f;  // a −inf bias: P = 0 (also where the row's lse is −inf)
  const float pj = expf(sc - lse);
  float ds = pj * (z * dot_smem(do_row, v_row, p.Dv) - delta);
  if (p.softcap > 0.0f) ds *= 1.0f - (capped / p.softcap) * (capped / p.softcap);
  return ds * p.scale;
}

// Same grid and rows as forward_kernel; dq_i = Σ_j dS_ij · k_j, lanes over columns of D.
template <int C>
__global__ void __launch_bounds__(kRowWarps* kWarp) dq_kernel(Params p, int q_blocks) {
  extern __shared__ float smem[];
  const int n = blockIdx.x / q_blocks, h = blockIdx.y;
  const int i0 = (blockIdx.x % q_blocks) * kRowsPerBlock;
  const Seq s = sequence(p, n);
  if (i0 >= s.qlen) return;
  const int rows = min(kRowsPerBlock, s.qlen - i0);
  const int kvh = h / p.group, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int ldk = p.D + 1, ldv = p.Dv + 1;
  float* qs = smem;                          // [16][D]
  float* dos = qs + kRowsPerBlock * p.D;     // [16][Dv]
  float* ks = dos + kRowsPerBlock * p.Dv;    // [32][D+1]
  float* vs = ks + kKeysPerTile * ldk;       // [32][Dv+1]
  load_rows(qs, p.D, p.q, p.in_t, s.q0 + i0, kRowsPerBlock, rows, p.Hq, h, p.D);
  load_rows(dos, p.Dv, p.dout, p.dout_t, s.q0 + i0, kRowsPerBlock, rows, p.Hq, h, p.Dv);

  const float slope = slope_of(p, n, h);
  float acc[kRowsPerWarp][C], lse[kRowsPerWarp], delta[kRowsPerWarp];
  int64_t rlo[kRowsPerWarp], rhi[kRowsPerWarp];
  int segq[kRowsPerWarp];
#pragma unroll
  for (int t = 0; t < kRowsPerWarp; ++t) {
    const int r = warp * kRowsPerWarp + t;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[t][c] = 0.0f;
    rlo[t] = rhi[t] = 0, lse[t] = -INFINITY, delta[t] = 0.0f, segq[t] = 0;
    if (r >= rows) continue;
    const int64_t li = lse_index(p, s, n, h, i0 + r);
    lse[t] = p.lse_in[li], delta[t] = p.delta[li];
    if (lse[t] > -INFINITY) key_range(p, s, i0 + r, &rlo[t], &rhi[t]);  // −inf: the row saw nothing
    if (p.seg_q) segq[t] = p.seg_q[s.q0 + i0 + r];
  }

  int64_t k_lo, k_hi;
  block_key_range(p, s, i0, i0 + rows, &k_lo, &k_hi);
  for (int64_t j0 = k_lo; j0 < k_hi; j0 += kKeysPerTile) {
    const int kn = static_cast<int>(min(static_cast<int64_t>(kKeysPerTile), s.klen - j0));
    __syncthreads();
    load_rows(ks, ldk, p.k, p.in_t, s.k0 + j0, kKeysPerTile, kn, p.Hkv, kvh, p.D);
    load_rows(vs, ldv, p.v, p.in_t, s.k0 + j0, kKeysPerTile, kn, p.Hkv, kvh, p.Dv);
    __syncthreads();
    const int64_t j = j0 + lane;
    const int segk = p.seg_k && lane < kn ? p.seg_k[s.k0 + j] : 0;
#pragma unroll
    for (int t = 0; t < kRowsPerWarp; ++t) {
      const int r = warp * kRowsPerWarp + t;
      float ds = 0.0f;
      if (lane < kn && j >= rlo[t] && j < rhi[t] && (!p.seg_q || segq[t] == segk))
        ds = grad_score(p, qs + r * p.D, dos + r * p.Dv, ks + lane * ldk, vs + lane * ldv, lse[t], delta[t], slope,
                        i0 + r + s.off, j, drop_factor(p, n, h, i0 + r, j), bias_of(p, n, h, i0 + r, j));
      for (int jj = 0; jj < kn; ++jj) {
        const float dsj = __shfl_sync(kFull, ds, jj);
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const int col = lane + kWarp * c;
          if (col < p.D) acc[t][c] = fmaf(dsj, ks[jj * ldk + col], acc[t][c]);
        }
      }
    }
  }

#pragma unroll
  for (int t = 0; t < kRowsPerWarp; ++t) {
    const int r = warp * kRowsPerWarp + t;
    if (r >= rows) continue;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int col = lane + kWarp * c;
      if (col < p.D) store(p.dq, p.dq_t, ((s.q0 + i0 + r) * p.Hq + h) * p.D + col, acc[t][c]);
    }
  }
}

// ---- backward: dk, dv ----

// Shared memory of dkdv_kernel with G warps: q rows [16][D], dO rows [16][Dv], partial scores
// and partial dP [G][16][32] each, P and dS [16][32] each, lse and delta [16] each.
inline size_t dkdv_smem_bytes(int G, int D, int Dv) {
  const size_t R = kBwdRows, K = kBwdKeys;
  return sizeof(float) * (R * (D + Dv) + 2 * static_cast<size_t>(G) * R * K + 2 * R * K + 2 * R);
}

// Query rows of the sequence that may see a key in [j0, j1) by position (a superset; the
// per-pair mask decides): j < hi(i) needs i + off >= j0 − R with R = 0 (causal), window_right,
// or unbounded; j >= lo(i) needs i + off <= j1 − 1 + window_left.
__device__ __forceinline__ void rows_seeing(const Params& p, const Seq& s, int64_t j0, int64_t j1, int64_t* i_lo,
                                            int64_t* i_hi) {
  int64_t lo = 0, hi = s.qlen;
  if (p.causal || p.wr >= 0) lo = max(lo, j0 - (p.causal ? 0 : p.wr) - s.off);  // causal: wr >= 0 adds nothing
  if (p.wl >= 0) hi = min(hi, j1 - 1 + p.wl - s.off + 1);
  *i_lo = lo;
  *i_hi = max(lo, hi);
}

// Per thread: key j = lane, columns g + G·m (m < C) of its k, v, dk, dv.
template <int G, int C>
struct KeyCols {
  float k[C], v[C], dk[C], dv[C];
};

// Loads 16 query rows of head h (q, dO, lse, delta) into shared memory; rows >= valid get
// lse = −inf (they contribute nothing).
__device__ __forceinline__ void load_query_rows(const Params& p, const Seq& s, int n, int h, int64_t i0, int valid,
                                                float* qs, float* dos, float* lses, float* deltas) {
  load_rows(qs, p.D, p.q, p.in_t, s.q0 + i0, kBwdRows, valid, p.Hq, h, p.D);
  load_rows(dos, p.Dv, p.dout, p.dout_t, s.q0 + i0, kBwdRows, valid, p.Hq, h, p.Dv);
  if (threadIdx.x < kBwdRows) {
    const int r = threadIdx.x;
    const int64_t li = r < valid ? lse_index(p, s, n, h, i0 + r) : 0;
    lses[r] = r < valid ? p.lse_in[li] : -INFINITY;
    deltas[r] = r < valid ? p.delta[li] : 0.0f;
  }
}

// P (dropout applied: the P that meets dO in dv) and dS of (row r, key jj) of query head h from
// the G partial dot products; 0 where masked.
__device__ __forceinline__ void p_and_ds(const Params& p, const Seq& s, int n, int h, int G, int64_t i0, int64_t j0,
                                         float slope,
                                         const float* part_s, const float* part_dp, const float* lses,
                                         const float* deltas, float* P, float* dS) {
  for (int idx = threadIdx.x; idx < kBwdRows * kBwdKeys; idx += blockDim.x) {
    const int r = idx / kBwdKeys, jj = idx % kBwdKeys;
    const int64_t i = i0 + r, j = j0 + jj;
    float pv = 0.0f, ds = 0.0f;
    int64_t lo, hi;
    key_range(p, s, i, &lo, &hi);
    const bool ok = lses[r] > -INFINITY && j < s.klen && j >= lo && j < hi &&
                    (!p.seg_q || p.seg_q[s.q0 + i] == p.seg_k[s.k0 + j]);
    if (ok) {
      float dot = 0.0f, dp = 0.0f;
      for (int g = 0; g < G; ++g) dot += part_s[idx + g * kBwdRows * kBwdKeys], dp += part_dp[idx + g * kBwdRows * kBwdKeys];
      float capped;
      const float sc = score(p, dot, slope, i + s.off, j, bias_of(p, n, h, i, j), &capped);
      pv = expf(sc - lses[r]);
      const float z = drop_factor(p, n, h, i, j);
      ds = pv * (z * dp - deltas[r]);
      if (p.softcap > 0.0f) ds *= 1.0f - (capped / p.softcap) * (capped / p.softcap);
      ds *= p.scale;
      pv *= z;
    }
    P[idx] = pv, dS[idx] = ds;
  }
}

// grid: x = N · k_blocks (sequence-major), y = Hkv; block: G warps.
template <int G, int C>
__global__ void __launch_bounds__(G* kWarp) dkdv_kernel(Params p, int k_blocks) {
  extern __shared__ float smem[];
  const int n = blockIdx.x / k_blocks, kvh = blockIdx.y;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x % k_blocks) * kBwdKeys;
  const Seq s = sequence(p, n);
  if (j0 >= s.klen) return;
  const int jj = threadIdx.x % kWarp, g = threadIdx.x / kWarp;
  const bool key_ok = j0 + jj < s.klen;
  const int64_t krow = s.k0 + j0 + jj;
  const int RK = kBwdRows * kBwdKeys;
  float* qs = smem;                        // [16][D]
  float* dos = qs + kBwdRows * p.D;        // [16][Dv]
  float* part_s = dos + kBwdRows * p.Dv;   // [G][16][32]
  float* part_dp = part_s + G * RK;        // [G][16][32]
  float* P = part_dp + G * RK;             // [16][32]
  float* dS = P + RK;                      // [16][32]
  float* lses = dS + RK;                   // [16]
  float* deltas = lses + kBwdRows;         // [16]

  KeyCols<G, C> kc;
#pragma unroll
  for (int m = 0; m < C; ++m) {
    const int d = g + G * m;
    kc.k[m] = key_ok && d < p.D ? load(p.k, p.in_t, (krow * p.Hkv + kvh) * p.D + d) : 0.0f;
    kc.v[m] = key_ok && d < p.Dv ? load(p.v, p.in_t, (krow * p.Hkv + kvh) * p.Dv + d) : 0.0f;
    kc.dk[m] = kc.dv[m] = 0.0f;
  }

  int64_t i_lo, i_hi;
  rows_seeing(p, s, j0, min(j0 + kBwdKeys, static_cast<int64_t>(s.klen)), &i_lo, &i_hi);
  for (int hh = 0; hh < p.group; ++hh) {
    const int h = kvh * p.group + hh;
    const float slope = slope_of(p, n, h);
    for (int64_t i0 = i_lo; i0 < i_hi; i0 += kBwdRows) {
      const int valid = static_cast<int>(min(static_cast<int64_t>(kBwdRows), i_hi - i0));
      __syncthreads();  // the previous rows are consumed
      load_query_rows(p, s, n, h, i0, valid, qs, dos, lses, deltas);
      __syncthreads();
      // Partial q·k and dO·v over this thread's columns, per row.
      for (int r = 0; r < kBwdRows; ++r) {
        float ps = 0.0f, pdp = 0.0f;
#pragma unroll
        for (int m = 0; m < C; ++m) {
          const int d = g + G * m;
          if (d < p.D) ps = fmaf(qs[r * p.D + d], kc.k[m], ps);
          if (d < p.Dv) pdp = fmaf(dos[r * p.Dv + d], kc.v[m], pdp);
        }
        part_s[g * RK + r * kBwdKeys + jj] = ps;
        part_dp[g * RK + r * kBwdKeys + jj] = pdp;
      }
      __syncthreads();
      p_and_ds(p, s, n, h, G, i0, j0, slope, part_s, part_dp, lses, deltas, P, dS);
      __syncthreads();
      // dv_j += P_rj · dO_r, dk_j += dS_rj · q_r.
      for (int r = 0; r < kBwdRows; ++r) {
        const float pr = P[r * kBwdKeys + jj], dsr = dS[r * kBwdKeys + jj];
#pragma unroll
        for (int m = 0; m < C; ++m) {
          const int d = g + G * m;
          if (d < p.Dv) kc.dv[m] = fmaf(pr, dos[r * p.Dv + d], kc.dv[m]);
          if (d < p.D) kc.dk[m] = fmaf(dsr, qs[r * p.D + d], kc.dk[m]);
        }
      }
    }
  }

  if (!key_ok) return;
#pragma unroll
  for (int m = 0; m < C; ++m) {
    const int d = g + G * m;
    if (d < p.D) store(p.dk, p.dk_t, (krow * p.Hkv + kvh) * p.D + d, kc.dk[m]);
    if (d < p.Dv) store(p.dv, p.dv_t, (krow * p.Hkv + kvh) * p.Dv + d, kc.dv[m]);
  }
}

// ---- backward: dbias ----

// dS of (sequence n, query head h, row i, key j) before the soft cap's factor (the bias comes
// after the cap): P·(z·dP − Δ), 0 where masked; q, k, v and dO read from global memory.
__device__ float bias_grad_term(const Params& p, int n, int h, int64_t i, int64_t j) {
  const Seq s = sequence(p, n);
  int64_t lo, hi;
  key_range(p, s, i, &lo, &hi);
  if (j < lo || j >= hi || (p.seg_q && p.seg_q[s.q0 + i] != p.seg_k[s.k0 + j])) return 0.0f;
  const int64_t li = lse_index(p, s, n, h, i);
  const float lse = p.lse_in[li];
  if (lse == -INFINITY) return 0.0f;
  const int kvh = h / p.group;
  const int64_t qb = ((s.q0 + i) * p.Hq + h), kb = ((s.k0 + j) * p.Hkv + kvh);
  float dot = 0.0f, dp = 0.0f, capped;
  for (int d = 0; d < p.D; ++d) dot = fmaf(load(p.q, p.in_t, qb * p.D + d), load(p.k, p.in_t, kb * p.D + d), dot);
  const float sc = score(p, dot, slope_of(p, n, h), i + s.off, j, bias_of(p, n, h, i, j), &capped);
  if (sc == -INFINITY) return 0.0f;
  for (int c = 0; c < p.Dv; ++c) dp = fmaf(load(p.dout, p.dout_t, qb * p.Dv + c), load(p.v, p.in_t, kb * p.Dv + c), dp);
  return expf(sc - lse) * (drop_factor(p, n, h, i, j) * dp - p.delta[li]);
}

// The terms summed into one dbias element: the product of the problem's extents over the bias's
// broadcast dims.
__host__ __device__ __forceinline__ int64_t dbias_terms(const Params& p) {
  const int64_t ext[4] = {p.N, p.Hq, p.Sq, p.Sk};
  int64_t t = 1;
  for (int d = 0; d < 4; ++d) t *= p.bias_shape[d] == 1 ? ext[d] : 1;
  return t;
}

// dbias = dS summed over the bias's broadcast dims, in a pass of its own after dq and dk/dv (as on
// cpu). kWarpEach: a warp per dbias element, lane l summing terms l, l + 32, … and the warp's sum
// taken in a fixed tree (a bias broadcast over many dims has few elements and many terms); else
// one thread per element, its terms in order. Deterministic either way. Straight loops over q, k,
// v and dO in global memory, not tiled. grid.x = ceil(count · (kWarpEach ? 32 : 1) / blockDim.x),
// blockDim.x a multiple of 32.
template <bool kWarpEach>
__global__ void dbias_kernel(Params p, int64_t count) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t e = kWarpEach ? tid / kWarp : tid;
  if (e >= count) return;  // with kWarpEach, whole warps (count per warp)
  const int lane = kWarpEach ? static_cast<int>(threadIdx.x % kWarp) : 0, step = kWarpEach ? kWarp : 1;
  const int* shape = p.bias_shape;
  const int64_t j1 = e % shape[3], i1 = e / shape[3] % shape[2];
  const int h1 = static_cast<int>(e / (static_cast<int64_t>(shape[3]) * shape[2]) % shape[1]);
  const int n1 = static_cast<int>(e / (static_cast<int64_t>(shape[3]) * shape[2] * shape[1]));
  const bool all_n = shape[0] == 1, all_h = shape[1] == 1, all_i = shape[2] == 1, all_j = shape[3] == 1;
  const int64_t ej = all_j ? p.Sk : 1, ei = all_i ? p.Sq : 1, eh = all_h ? p.Hq : 1;
  float acc = 0.0f;
  for (int64_t t = lane; t < dbias_terms(p); t += step) {  // t = ((n·eh + h)·ei + i)·ej + j over the broadcast dims
    const int64_t j = all_j ? t % ej : j1, i = all_i ? t / ej % ei : i1;
    const int h = all_h ? static_cast<int>(t / (ej * ei) % eh) : h1;
    const int n = all_n ? static_cast<int>(t / (ej * ei * eh)) : n1;
    acc += bias_grad_term(p, n, h, i, j);
  }
  if (kWarpEach) acc = warp_sum(acc);
  if (lane == 0) store(p.dbias, p.dbias_t, e, acc);
}

}  // namespace tessera::attention::cuda_kernels
