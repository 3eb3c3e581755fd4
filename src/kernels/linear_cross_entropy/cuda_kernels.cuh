// linear_cross_entropy, cuda backend: the device kernels (row-wise pass and small helpers).
// The matrix work is done by cuBLAS in cuda.cu; see the "cuda backend" section of
// docs/kernels/linear_cross_entropy.md for the design.
//
// Row-wise pass over one chunk of `rows` tokens whose f32 logits (x·W, before bias) lie in
// `logits` [rows, V] with row stride `ld` floats (V padded to a multiple of 8, so every row is
// 32-byte aligned). One thread block per row, each thread taking groups of 4 columns (one float4
// load; the last group of a row is loaded element by element when V % 4 != 0):
//   pass 1: s_j = logit_j + bias_j, z_j = c·tanh(s_j / c) (soft cap) or s_j; online logsumexp
//           (max + rescaled sum of exp), Σ z_j (label smoothing), first argmax of s_j;
//           then lse, the row loss w_t·((1−ε)(lse − z_y) + ε(lse − Σz/V) + λ·lse²).
//   pass 2: the logit gradient, formed in f32:
//           g_j = r_t·[(1 + 2λ·lse)·p_j − ε/V − (1−ε)·[j==y]]·(dz/ds)_j,   p_j = exp(z_j − lse)
//           with the label column as expm1(z_y − lse) + 2λ·lse·p_y + ε(1 − 1/V) (no cancellation),
//           r_t = weight_t · (grad_loss_t for reduction none, else 1) · dz_scale, and
//           dz/ds = sech²(s/c) under the soft cap. Ignored rows get g = 0.
//           g is stored in place over the row as OutT (the GEMM operand type): for 16-bit OutT
//           the row's first 2V bytes, i.e. a [rows, V] OutT matrix with row stride 2·ld elements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>

#include "primitives/cuda_convert.cuh"

namespace tessera::linear_cross_entropy::cuda_kernels {

constexpr int kRowThreads = 512;  // threads per row block (16 warps)
constexpr int kRowWarps = kRowThreads / 32;

enum BiasType : int { kBiasNone = 0, kBiasF32 = 1, kBiasBF16 = 2, kBiasF16 = 3 };

struct RowParams {
  const float* logits = nullptr;  // chunk [rows, V] f32, before bias, row stride ld
  int64_t rows = 0, V = 0;
  int64_t ld = 0;                 // row stride in floats: a multiple of 8, >= V
  int64_t row0 = 0;               // global token index of the chunk's first row

  const void* bias = nullptr;
  int bias_type = kBiasNone;
  const void* labels = nullptr;   // [B] global
  bool labels_i32 = false;
  const float* weights = nullptr;  // [B] global or null (ones)
  int64_t ignore_index = -100;
  float softcap = 0.f;            // 0: off
  float eps = 0.f;                 // label smoothing
  float zloss = 0.f;               // λ

  // Forward outputs, indexed by global token (each may be null).
  float* lse_out = nullptr;
  float* loss_out = nullptr;       // per-row loss w_t·(...), 0 for ignored rows
  int64_t* argmax_out = nullptr;

  // Gradient.
  bool want_grad = false;
  const float* lse_in = nullptr;     // [B] global: use it instead of computing lse (skips pass 1)
  const float* grad_rows = nullptr;  // [B] global per-row upstream gradient (reduction none) or null
  float dz_scale = 1.f;              // power of two folded into the stored gradient (f16: per call)
};

__device__ __forceinline__ float load_bias(const void* b, int type, int64_t j) {
  switch (type) {
    case kBiasF32: return static_cast<const float*>(b)[j];
    case kBiasBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(b)[j]);
    case kBiasF16: return __half2float(static_cast<const __half*>(b)[j]);
    default: return 0.f;
  }
}

__device__ __forceinline__ int64_t load_label(const void* labels, bool i32, int64_t t) {
  return i32 ? static_cast<int64_t>(static_cast<const int32_t*>(labels)[t])
             : static_cast<const int64_t*>(labels)[t];
}

using primitives::cuda::from_f32;  // primitives/cuda_convert.cuh
using primitives::cuda::to_f32;

// Per-thread / per-block partial statistics of a row.
struct RowStats {
  float m;      // running max of z
  float s;      // Σ exp(z − m)
  float sum_z;  // Σ z
  float best;   // max of s (pre-cap logit) for argmax
  int best_j;   // its first index (INT_MAX: none)
};

__device__ __forceinline__ void combine(RowStats& a, const RowStats& b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) {
    a.s = 0.f;
  } else {
    a.s = a.s * expf(a.m - m) + b.s * expf(b.m - m);  // exp(−inf) = 0 for an empty side
  }
  a.m = m;
  a.sum_z += b.sum_z;
  if (b.best > a.best || (b.best == a.best && b.best_j < a.best_j)) {
    a.best = b.best;
    a.best_j = b.best_j;
  }
}

__device__ __forceinline__ RowStats shfl_xor(const RowStats& v, int lane_mask) {
  RowStats o;
  o.m = __shfl_xor_sync(0xffffffffu, v.m, lane_mask);
  o.s = __shfl_xor_sync(0xffffffffu, v.s, lane_mask);
  o.sum_z = __shfl_xor_sync(0xffffffffu, v.sum_z, lane_mask);
  o.best = __shfl_xor_sync(0xffffffffu, v.best, lane_mask);
  o.best_j = __shfl_xor_sync(0xffffffffu, v.best_j, lane_mask);
  return o;
}

// Transform of one raw logit: returns z (after bias and cap); *pre = s (after bias, before cap).
__device__ __forceinline__ float transform(const RowParams& p, float g, int64_t j, float* pre) {
  float s = g;
  if (p.bias_type != kBiasNone) s += load_bias(p.bias, p.bias_type, j);
  *pre = s;
  return p.softcap > 0.f ? p.softcap * tanhf(s / p.softcap) : s;
}

// The logit gradient of one element (see the header comment), before the row factor.
__device__ __forceinline__ float grad_elem(const RowParams& p, float z, float s, bool is_label, float lse,
                                           float a, float off) {
  const float e = z - lse;
  const float pj = expf(e);
  float d;
  if (is_label) {
    d = expm1f(e) + 2.f * p.zloss * lse * pj + (p.eps - off);
  } else {
    d = a * pj - off;
  }
  if (p.softcap > 0.f) {
    const float ch = coshf(s / p.softcap);  // inf for large |s/c|: sech² = 0
    d *= 1.f / (ch * ch);
  }
  return d;
}

constexpr int kGroup = 4;                                // columns per thread per step
constexpr int64_t kTile = int64_t{kRowThreads} * kGroup;  // columns per block per step

// Loads the group of columns [j0, j0 + 4) of a row (j0 % 4 == 0) into g and returns how many of
// them are < V (0..4). A full group is one float4 load (the row is 32-byte aligned); the last,
// partial group of a row reads only its columns below V (g[k] = 0 for the others).
__device__ __forceinline__ int load_group(const float* row, int64_t j0, int64_t V, float g[kGroup]) {
  const int64_t left = V - j0;
  if (left >= kGroup) {
    const float4 q = *reinterpret_cast<const float4*>(row + j0);
    g[0] = q.x; g[1] = q.y; g[2] = q.z; g[3] = q.w;
    return kGroup;
  }
  const int n = left > 0 ? static_cast<int>(left) : 0;
#pragma unroll
  for (int k = 0; k < kGroup; ++k) g[k] = k < n ? row[j0 + k] : 0.f;
  return n;
}

// Stores the first n (1..4) values of d as OutT at out[j0 ..]: one 16-byte (f32) or 8-byte
// (bf16 / f16) store for a full group, element stores for a partial one.
template <class OutT>
__device__ __forceinline__ void store_group(OutT* out, int64_t j0, int n, const float d[kGroup]) {
  if (n == kGroup) {
    if constexpr (sizeof(OutT) == sizeof(float)) {
      *reinterpret_cast<float4*>(out + j0) = make_float4(d[0], d[1], d[2], d[3]);
    } else {
      OutT o[kGroup];
#pragma unroll
      for (int k = 0; k < kGroup; ++k) o[k] = from_f32<OutT>(d[k]);
      uint2 packed;
      __builtin_memcpy(&packed, o, sizeof(packed));
      *reinterpret_cast<uint2*>(out + j0) = packed;
    }
  } else {
    for (int k = 0; k < n; ++k) out[j0 + k] = from_f32<OutT>(d[k]);
  }
}

// One block per row (see the header comment).
template <class OutT>
__global__ void __launch_bounds__(kRowThreads, 3) row_kernel(RowParams p) {
  const int64_t r = blockIdx.x;
  const int64_t t = p.row0 + r;
  const int64_t V = p.V;
  const float* row = p.logits + r * p.ld;
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;

  __shared__ RowStats warp_stats[kRowWarps];
  __shared__ float sh_lse;

  const int64_t y = load_label(p.labels, p.labels_i32, t);
  const bool ignored = y == p.ignore_index;
  const bool label_ok = y >= 0 && y < V;

  float lse;
  if (p.lse_in != nullptr) {
    lse = p.lse_in[t];
  } else {
    // ---- pass 1: statistics ----
    RowStats st{-INFINITY, 0.f, 0.f, -INFINITY, INT_MAX};
    for (int64_t j0 = static_cast<int64_t>(tid) * kGroup; j0 < V; j0 += kTile) {
      float g[kGroup];
      const int n = load_group(row, j0, V, g);  // >= 1: j0 < V
      float mloc = -INFINITY;
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {  // g[k] becomes z of column j0 + k
        if (k >= n) break;
        float s;
        g[k] = transform(p, g[k], j0 + k, &s);
        mloc = fmaxf(mloc, g[k]);
        st.sum_z += g[k];
        if (s > st.best) {  // ascending j per thread: strict > keeps the first maximum
          st.best = s;
          st.best_j = static_cast<int>(j0 + k);
        }
      }
      if (mloc > st.m) {
        st.s *= expf(st.m - mloc);
        st.m = mloc;
      }
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        if (k >= n) break;
        st.s += expf(g[k] - st.m);
      }
    }
    // Block reduction in a fixed order (deterministic).
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const RowStats o = shfl_xor(st, off);
      combine(st, o);
    }
    if (lane == 0) warp_stats[warp] = st;
    __syncthreads();
    if (warp == 0) {
      RowStats w = lane < kRowWarps ? warp_stats[lane] : RowStats{-INFINITY, 0.f, 0.f, -INFINITY, INT_MAX};
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const RowStats o = shfl_xor(w, off);
        combine(w, o);
      }
      if (lane == 0) {
        const float l = w.m + logf(w.s);
        sh_lse = l;
        if (p.lse_out) p.lse_out[t] = l;
        if (p.argmax_out) p.argmax_out[t] = w.best_j == INT_MAX ? 0 : w.best_j;
        if (p.loss_out) {
          float loss = 0.f;
          if (!ignored) {
            if (label_ok) {
              float s_unused;
              const float zy = transform(p, row[y], y, &s_unused);
              const float wt = p.weights ? p.weights[t] : 1.f;
              // The smoothing term is absent at ε = 0 (0·inf is NaN when a logit is −inf).
              const float ce = (1.f - p.eps) * (l - zy) + (p.eps > 0.f ? p.eps * (l - w.sum_z / static_cast<float>(V)) : 0.f);
              loss = wt * (ce + p.zloss * l * l);
            } else {
              loss = NAN;  // out-of-range label (only reachable when the host check is disabled)
            }
          }
          p.loss_out[t] = loss;
        }
      }
    }
    __syncthreads();
    lse = sh_lse;
  }
  if (!p.want_grad) return;

  // ---- pass 2: gradient, stored in place as OutT ----
  float rf = 0.f;
  if (!ignored && label_ok) {
    rf = (p.weights ? p.weights[t] : 1.f) * (p.grad_rows ? p.grad_rows[t] : 1.f) * p.dz_scale;
  }
  const float a = 1.f + 2.f * p.zloss * lse;
  const float off = p.eps / static_cast<float>(V);
  OutT* out = reinterpret_cast<OutT*>(const_cast<float*>(row));  // same row start, OutT elements
  constexpr bool kNarrow = sizeof(OutT) < sizeof(float);
  // Every thread runs every step (the loop bound does not depend on tid): the barrier is uniform.
  for (int64_t base = 0; base < V; base += kTile) {
    const int64_t j0 = base + static_cast<int64_t>(tid) * kGroup;
    float g[kGroup];
    const int n = load_group(row, j0, V, g);  // 0 past the end of the row
    // 16-bit output overwrites f32 slots [base/2, (base + kTile)/2) of this row, all below
    // base + kTile: every thread must have read its part of this step's tile first. Slots of
    // later tiles are never touched.
    if constexpr (kNarrow) __syncthreads();
    if (n > 0) {
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {  // g[k] becomes the gradient of column j0 + k
        float d = 0.f;
        if (k < n && rf != 0.f) {
          float s;
          const float z = transform(p, g[k], j0 + k, &s);
          d = rf * grad_elem(p, z, s, j0 + k == y, lse, a, off);
        }
        g[k] = d;
      }
      store_group<OutT>(out, j0, n, g);
    }
  }
}

// Deterministic single-block reduction of the label check, the mean denominator, the largest
// row factor and the upstream scalar. Results in `scalars`.
struct Scalars {
  double denom;                // Σ weight_t over non-ignored rows
  unsigned long long first_bad;  // smallest token index with an out-of-range label (ULLONG_MAX: none)
  float grad_scalar;           // grad_loss[0] for reduction sum / mean (else 0)
  float max_row_factor;        // max |weight_t · grad_rows_t| over rows with a valid label (f16 scale)
};

constexpr int kReduceThreads = 1024;

// grad_scalar: the upstream scalar (sum / mean) or null; grad_rows: the per-row upstream
// gradient (none) or null. The row factor is formed as the row kernel forms it (f32 product).
__global__ void __launch_bounds__(kReduceThreads)
prologue_kernel(const void* labels, bool labels_i32, const float* weights, int64_t B, int64_t V,
                int64_t ignore_index, const float* grad_scalar, const float* grad_rows, Scalars* out) {
  __shared__ double sh_sum[kReduceThreads];
  __shared__ unsigned long long sh_bad[kReduceThreads];
  __shared__ float sh_max[kReduceThreads];
  const int tid = threadIdx.x;
  double sum = 0.0;
  unsigned long long bad = ULLONG_MAX;
  float mx = 0.f;
  for (int64_t t = tid; t < B; t += kReduceThreads) {
    const int64_t y = load_label(labels, labels_i32, t);
    if (y == ignore_index) continue;
    const float wt = weights ? weights[t] : 1.f;
    if (y < 0 || y >= V) {
      if (bad == ULLONG_MAX) bad = static_cast<unsigned long long>(t);
    } else {
      mx = fmaxf(mx, fabsf(wt * (grad_rows ? grad_rows[t] : 1.f)));
    }
    sum += static_cast<double>(wt);
  }
  sh_sum[tid] = sum;
  sh_bad[tid] = bad;
  sh_max[tid] = mx;
  __syncthreads();
  for (int stride = kReduceThreads / 2; stride > 0; stride >>= 1) {
    if (tid < stride) {
      sh_sum[tid] += sh_sum[tid + stride];
      sh_bad[tid] = min(sh_bad[tid], sh_bad[tid + stride]);
      sh_max[tid] = fmaxf(sh_max[tid], sh_max[tid + stride]);
    }
    __syncthreads();
  }
  if (tid == 0) {
    out->denom = sh_sum[0];
    out->first_bad = sh_bad[0];
    out->grad_scalar = grad_scalar ? grad_scalar[0] : 0.f;
    out->max_row_factor = sh_max[0];
  }
}

// loss[0] = Σ_t row_loss[t] (in double, fixed order), divided by the denominator for mean
// (0 when the denominator is 0).
__global__ void __launch_bounds__(kReduceThreads)
reduce_loss_kernel(const float* row_loss, int64_t B, const Scalars* sc, bool mean, float* loss) {
  __shared__ double sh[kReduceThreads];
  const int tid = threadIdx.x;
  double s = 0.0;
  for (int64_t t = tid; t < B; t += kReduceThreads) s += static_cast<double>(row_loss[t]);
  sh[tid] = s;
  __syncthreads();
  for (int stride = kReduceThreads / 2; stride > 0; stride >>= 1) {
    if (tid < stride) sh[tid] += sh[tid + stride];
    __syncthreads();
  }
  if (tid == 0) {
    double total = sh[0];
    if (mean) total = sc->denom == 0.0 ? 0.0 : total / sc->denom;
    loss[0] = static_cast<float>(total);
  }
}

// acc[j] += alpha · Σ_r g[r, j] over a chunk's stored gradient (row stride ld elements).
// One thread per column, rows in order: deterministic.
template <class T>
__global__ void colsum_kernel(const T* g, int64_t ld, int64_t rows, int64_t V, float alpha, float* acc) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= V) return;
  float s = 0.f;
  for (int64_t r = 0; r < rows; ++r) s += to_f32(g[r * ld + j]);
  acc[j] += alpha * s;
}

// dst[i] = OutT(src[i]) for i < n.
template <class OutT>
__global__ void convert_kernel(const float* src, OutT* dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = from_f32<OutT>(src[i]);
}

}  // namespace tessera::linear_cross_entropy::cuda_kernels
