// mlstm: the device code of the cuda backend (cuda.cu launches it) — the chunkwise form of
// cpu.cc, its math step for step, in four kernels:
//
//   state_kernel   per (head, 8 rows of C): the inter-chunk recurrence, the state each chunk
//                  enters with (C, n, m) into scratch, in order over the chunks; the last state.
//   intra_kernel   per (chunk, head): P = (q̂kᵀ) ∘ E in shared memory, then h_t (forward), or the
//                  per-step den, ∂/∂den_raw and ∂/∂g the backward needs (backward).
//   dstate_kernel  per (head, 8 rows of C): the reverse recurrence of (dC, dn), the gradient of
//                  the state each chunk ends with; dc0, dn0.
//   grads_kernel   per (chunk, head): dq, dk, dv, di, df of the chunk from P, dS, dD in shared
//                  memory, the state it entered with and the gradient of the state it ends with.
//
// Per chunk of L steps and the state (C, n, m_prev) it enters with (chunk_scalars):
//   cum_t = Σ_{u ≤ t} logsigmoid(f_u) (double), seg_t = the first step of t's segment (after the
//   last reset in the chunk), g_t = m_prev + cum_t while no reset lies in the chunk up to t (else
//   cum_t − cum_{seg−1}: the zero state's m = 0, and no inter-chunk term: w_t = 0; a forget gate
//   that erases the state starts a segment too, with g = −inf and its logsigmoid in no sum),
//   m_t = max(g_t, max_{seg ≤ s ≤ t} cum_t − cum_s + i_s) (the recurrence's m exactly),
//   E_ts = e^{cum_t − cum_s + i_s − m_t} for seg_t ≤ s ≤ t (else 0), w_t = e^{g_t − m_t}.
// Gate sums and exponents in double, everything else f32 (the accumulation too). m is held
// constant in the backward (the contract).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "primitives/cuda_reduce.cuh"

namespace tessera::mlstm::cuda_kernels {

namespace pc = ::tessera::primitives::cuda;

inline constexpr int kThreads = 256;   // every kernel: 8 warps
inline constexpr int kStateRows = 8;   // rows of C per block of the state recurrences
inline constexpr int kMaxChunk = 128;  // grads_kernel keeps three L×L f32 matrices in shared memory
enum : int { kF32 = 0, kBF16 = 1, kF16 = 2, kI32 = 3, kI64 = 4 };

struct Params {
  int64_t B = 0, NH = 0, S = 0, DK = 0, DV = 0;
  int L = 0, NC = 0;  // chunk length, chunks per head
  float scale = 1.f, eps = 0.f;
  const void *q = nullptr, *k = nullptr, *v = nullptr, *i = nullptr, *f = nullptr, *resets = nullptr;
  int qkv = kF32, gates = kF32, rdt = kI32;
  const float *c0 = nullptr, *n0 = nullptr, *m0 = nullptr;
  // forward
  void* h = nullptr;
  int hdt = kF32;
  float *c_last = nullptr, *n_last = nullptr, *m_last = nullptr;
  // backward
  const void* dh = nullptr;
  int dhdt = kF32;
  const float *dc_last = nullptr, *dn_last = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *di = nullptr, *df = nullptr;
  int dqdt = kF32, dkdt = kF32, dvdt = kF32, didt = kF32, dfdt = kF32;
  float *dc0 = nullptr, *dn0 = nullptr;
  // scratch: per head, per chunk
  float* Cs = nullptr;   // [B·NH, NC, DK, DV] the state chunk j enters with
  float* ns = nullptr;   // [B·NH, NC, DK]
  double* ms = nullptr;  // [B·NH, NC]
  float* dCs = nullptr;  // [B·NH, NC, DK, DV] the gradient of the state chunk j ends with
  float* dns = nullptr;  // [B·NH, NC, DK]
  float *den = nullptr, *ddr = nullptr, *dg = nullptr;  // [B·NH·S] per step (backward)
};

// ---- shared-memory sizes (host and device) ----
__host__ __device__ constexpr size_t scalars_bytes(int L) { return size_t(L) * (3 * 8 + 2 * 4 + 2 * 4); }
__host__ __device__ constexpr size_t state_smem(int L) { return scalars_bytes(L) + size_t(L) * (1 + kStateRows) * 4; }
__host__ __device__ constexpr size_t dstate_smem(int L) { return scalars_bytes(L) + size_t(L) * (2 + kStateRows) * 4; }
__host__ __device__ constexpr size_t intra_smem(int L) { return scalars_bytes(L) + size_t(L) * L * 4; }
__host__ __device__ constexpr size_t grads_smem(int L) {
  return scalars_bytes(L) + size_t(L) * 8 + 3 * size_t(L) * L * 4 + 32 * 4;
}

// ---- loads, stores ----
__device__ __forceinline__ float ld(const void* p, int dt, int64_t j) {
  if (dt == kF32) return static_cast<const float*>(p)[j];
  if (dt == kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[j]);
  return __half2float(static_cast<const __half*>(p)[j]);
}
__device__ __forceinline__ void st(void* p, int dt, int64_t j, float x) {
  if (dt == kF32) static_cast<float*>(p)[j] = x;
  else if (dt == kBF16) static_cast<__nv_bfloat16*>(p)[j] = __float2bfloat16(x);
  else static_cast<__half*>(p)[j] = __float2half(x);
}
__device__ __forceinline__ bool reset_at(const Params& p, int64_t b, int64_t t) {
  if (p.resets == nullptr || t == 0) return false;
  return p.rdt == kI32 ? static_cast<const int32_t*>(p.resets)[b * p.S + t] != 0
                       : static_cast<const int64_t*>(p.resets)[b * p.S + t] != 0;
}
__device__ __forceinline__ double logsigmoid(double x) { return fmin(x, 0.0) - log1p(exp(-fabs(x))); }
// A forget gate that erases the state (cpu.cc's forgets_all): logsigmoid(f) below −1e9 (f = −inf,
// −FLT_MAX: a mask) makes F = 0 and m_t = i_t; the step starts a segment as a reset does, without
// the zero state's stabilizer term (g = −inf), its logsigmoid out of the running sums, df = 0.
inline constexpr double kForgetAll = -1e9;
__device__ __forceinline__ bool forgets_all(double f) { return logsigmoid(f) < kForgetAll; }
// The denominator's floor e^{−m} in f32, never 0 (cpu.cc's den_floor).
__device__ __forceinline__ float den_floor(double m) { return fmaxf(static_cast<float>(exp(-m)), FLT_MIN); }

// The length of the chunk starting at step `start` (the last one may be shorter).
__device__ __forceinline__ int chunk_len(const Params& p, int64_t start) {
  return static_cast<int>(p.S - start < p.L ? p.S - start : p.L);
}

// ---- one chunk's gate quantities, in shared memory ----
struct Scalars {
  double *cum, *g, *m;
  float *ig, *w;
  int *seg, *has;
};
__device__ __forceinline__ Scalars scalars_at(unsigned char* smem, int L) {
  Scalars s;
  s.cum = reinterpret_cast<double*>(smem), s.g = s.cum + L, s.m = s.g + L;
  s.ig = reinterpret_cast<float*>(s.m + L), s.w = s.ig + L;
  s.seg = reinterpret_cast<int*>(s.w + L), s.has = s.seg + L;
  return s;
}

// Fills s for the chunk [start, start + L) of head bh entered with stabilizer m_prev. Every
// thread of the block calls it; it synchronizes before and after.
__device__ void chunk_scalars(const Params& p, int64_t bh, int64_t start, int L, double m_prev, const Scalars& s) {
  __syncthreads();  // s may still be read for the previous chunk
  const int64_t b = bh / p.NH, g0 = bh * p.S + start;
  if (threadIdx.x == 0) {
    double acc = 0.0, base = 0.0;
    int seg = 0, has = 1;
    bool erased = false;  // t's segment began at an erasing forget gate
    for (int t = 0; t < L; ++t) {
      const double f = ld(p.f, p.gates, g0 + t);
      const bool cut = forgets_all(f);
      if (cut || reset_at(p, b, start + t)) seg = t, has = 0, base = acc, erased = cut;
      if (!cut) acc += logsigmoid(f);
      s.cum[t] = acc, s.seg[t] = seg, s.has[t] = has;
      s.g[t] = has ? m_prev + acc : erased ? -HUGE_VAL : acc - base;
    }
  }
  for (int t = threadIdx.x; t < L; t += blockDim.x) s.ig[t] = ld(p.i, p.gates, g0 + t);
  __syncthreads();
  for (int t = threadIdx.x; t < L; t += blockDim.x) {
    double m = s.g[t];
    for (int u = s.seg[t]; u <= t; ++u) m = fmax(m, s.cum[t] - s.cum[u] + static_cast<double>(s.ig[u]));
    s.m[t] = m;
    s.w[t] = s.has[t] ? static_cast<float>(exp(s.g[t] - m)) : 0.f;
  }
  __syncthreads();
}

// E_tu: the decay from step u to step t within the chunk (0 outside t's segment).
__device__ __forceinline__ float decay(const Scalars& s, int t, int u) {
  if (u < s.seg[t] || u > t) return 0.f;
  return static_cast<float>(exp(s.cum[t] - s.cum[u] + static_cast<double>(s.ig[u]) - s.m[t]));
}

// q̂_t·k_u over DK (t, u: global rows).
__device__ __forceinline__ float qk(const Params& p, int64_t t, int64_t u) {
  float acc = 0.f;
  for (int64_t x = 0; x < p.DK; ++x) acc += ld(p.q, p.qkv, t * p.DK + x) * ld(p.k, p.qkv, u * p.DK + x);
  return acc * p.scale;
}

// ---- the inter-chunk recurrence: grid (B·NH, ⌈DK / kStateRows⌉) ----
// Cs[0] = c0 (or 0); Cs[j + 1] = w_last·Cs[j] + Σ_u A_u k_u v_uᵀ with A_u = E_{last,u}; the state
// after the last chunk goes to c_last (with `want_last`). Each thread owns the same elements of
// C in every chunk, so the state is read and written in place in the scratch without a barrier.
__global__ void state_kernel(Params p, bool want_last) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int L = p.L;
  const Scalars s = scalars_at(smem, L);
  float* A = reinterpret_cast<float*>(smem + scalars_bytes(L));
  float* kt = A + L;  // [L, rows]
  const int64_t bh = blockIdx.x, x0 = int64_t(blockIdx.y) * kStateRows, per = p.DK * p.DV;
  const int rows = static_cast<int>(p.DK - x0 < kStateRows ? p.DK - x0 : kStateRows);
  const bool lead = blockIdx.y == 0 && threadIdx.x == 0;
  float* C = p.Cs + bh * p.NC * per;
  float* n = p.ns + bh * p.NC * p.DK;
  for (int64_t e = threadIdx.x; e < rows * p.DV; e += blockDim.x) {
    const int64_t j = (x0 + e / p.DV) * p.DV + e % p.DV;
    C[j] = p.c0 ? p.c0[bh * per + j] : 0.f;
  }
  for (int r = threadIdx.x; r < rows; r += blockDim.x) n[x0 + r] = p.n0 ? p.n0[bh * p.DK + x0 + r] : 0.f;
  double m = p.m0 ? static_cast<double>(p.m0[bh]) : 0.0;
  if (lead) p.ms[bh * p.NC] = m;
  const int chunks = want_last ? p.NC : p.NC - 1;
  for (int c = 0; c < chunks; ++c) {
    const int64_t start = int64_t(c) * p.L;
    const int Lc = chunk_len(p, start);
    chunk_scalars(p, bh, start, Lc, m, s);
    for (int u = threadIdx.x; u < Lc; u += blockDim.x) A[u] = decay(s, Lc - 1, u);
    for (int e = threadIdx.x; e < Lc * rows; e += blockDim.x)
      kt[e] = ld(p.k, p.qkv, (bh * p.S + start + e / rows) * p.DK + x0 + e % rows);
    __syncthreads();
    const float wl = s.w[Lc - 1];
    const bool last = c + 1 == p.NC;
    float* Cin = C + int64_t(c) * per;
    float* Cout = last ? p.c_last + bh * per : Cin + per;
    float* nin = n + int64_t(c) * p.DK;
    float* nout = last ? p.n_last + bh * p.DK : nin + p.DK;
    for (int64_t e = threadIdx.x; e < rows * p.DV; e += blockDim.x) {
      const int r = static_cast<int>(e / p.DV);
      const int64_t y = e % p.DV, j = (x0 + r) * p.DV + y;
      float acc = wl * Cin[j];
      for (int u = 0; u < Lc; ++u) acc += A[u] * kt[u * rows + r] * ld(p.v, p.qkv, (bh * p.S + start + u) * p.DV + y);
      Cout[j] = acc;
    }
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
      float acc = wl * nin[x0 + r];
      for (int u = 0; u < Lc; ++u) acc += A[u] * kt[u * rows + r];
      nout[x0 + r] = acc;
    }
    m = s.m[Lc - 1];
    if (lead) {
      if (last) p.m_last[bh] = static_cast<float>(m);
      else p.ms[bh * p.NC + c + 1] = m;
    }
  }
}

// ---- the intra-chunk part: grid (NC, B·NH) ----
// P_tu = E_tu (q̂_t·k_u); per step t (one warp): den_raw = Σ_u P_tu + w_t q̂_t·n, den = max(|den_raw|,
// e^{−m_t}) + eps, num = P v + w_t Cᵀq̂_t; forward: h_t = num / den; backward: den, ∂/∂den_raw
// and ∂/∂g_t of the chunk (cpu.cc chunk_backward's ddr and dg) into the per-step scratch.
__global__ void intra_kernel(Params p, bool backward) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int L = p.L;
  const Scalars s = scalars_at(smem, L);
  float* P = reinterpret_cast<float*>(smem + scalars_bytes(L));  // [L, L]
  const int c = blockIdx.x;
  const int64_t bh = blockIdx.y, start = int64_t(c) * L, g0 = bh * p.S + start;
  const int Lc = chunk_len(p, start);
  chunk_scalars(p, bh, start, Lc, p.ms[bh * p.NC + c], s);
  const float* C = p.Cs + (bh * p.NC + c) * p.DK * p.DV;
  const float* n = p.ns + (bh * p.NC + c) * p.DK;
  for (int e = threadIdx.x; e < Lc * Lc; e += blockDim.x) {
    const int t = e / Lc, u = e % Lc;
    const float E = decay(s, t, u);
    P[t * L + u] = E != 0.f ? E * qk(p, g0 + t, g0 + u) : 0.f;
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int t = threadIdx.x / 32; t < Lc; t += warps) {
    const int64_t g = g0 + t;
    float qn = 0.f, rs = 0.f;
    for (int64_t x = lane; x < p.DK; x += 32) qn += ld(p.q, p.qkv, g * p.DK + x) * n[x];
    for (int u = lane; u <= t; u += 32) rs += P[t * L + u];
    qn = pc::warp_sum(qn) * p.scale, rs = pc::warp_sum(rs);
    const float w = s.w[t], den_raw = rs + w * qn, floor = den_floor(s.m[t]);
    const float den = fmaxf(fabsf(den_raw), floor) + p.eps;
    float dhnum = 0.f, dhqc = 0.f;
    for (int64_t y = lane; y < p.DV; y += 32) {
      float qc = 0.f;
      if (w != 0.f) {
        for (int64_t x = 0; x < p.DK; ++x) qc += ld(p.q, p.qkv, g * p.DK + x) * C[x * p.DV + y];
        qc *= p.scale;
      }
      float num = w * qc;
      for (int u = s.seg[t]; u <= t; ++u) num += P[t * L + u] * ld(p.v, p.qkv, (g0 + u) * p.DV + y);
      if (!backward) {
        st(p.h, p.hdt, g * p.DV + y, num / den);
      } else {
        const float d = ld(p.dh, p.dhdt, g * p.DV + y);
        dhnum += d * num, dhqc += d * qc;
      }
    }
    if (!backward) continue;
    dhnum = pc::warp_sum(dhnum), dhqc = pc::warp_sum(dhqc);
    if (lane == 0) {
      const float dden = -dhnum / (den * den);
      const float ddr = fabsf(den_raw) > floor ? (den_raw > 0.f ? dden : -dden) : 0.f;
      p.den[g] = den, p.ddr[g] = ddr, p.dg[g] = w * (qn * ddr + dhqc / den);
    }
  }
}

// ---- the reverse recurrence of the state's gradient: grid (B·NH, ⌈DK / kStateRows⌉) ----
// dCs[NC − 1] = dc_last (or 0); the gradient of the state chunk c entered with:
// dC_prev = w_last·dC + Σ_t q̂_t (w_t/den_t) dh_tᵀ, dn_prev = w_last·dn + Σ_t w_t ddr_t q̂_t, which is
// dCs[c − 1], and dc0 / dn0 for c = 0 (with `want_d0`).
__global__ void dstate_kernel(Params p, bool want_d0) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int L = p.L;
  const Scalars s = scalars_at(smem, L);
  float* a = reinterpret_cast<float*>(smem + scalars_bytes(L));
  float* bcoef = a + L;
  float* qt = bcoef + L;  // [L, rows]
  const int64_t bh = blockIdx.x, x0 = int64_t(blockIdx.y) * kStateRows, per = p.DK * p.DV;
  const int rows = static_cast<int>(p.DK - x0 < kStateRows ? p.DK - x0 : kStateRows);
  float* dC = p.dCs + bh * p.NC * per;
  float* dn = p.dns + bh * p.NC * p.DK;
  const int64_t lastc = p.NC - 1;
  for (int64_t e = threadIdx.x; e < rows * p.DV; e += blockDim.x) {
    const int64_t j = (x0 + e / p.DV) * p.DV + e % p.DV;
    dC[lastc * per + j] = p.dc_last ? p.dc_last[bh * per + j] : 0.f;
  }
  for (int r = threadIdx.x; r < rows; r += blockDim.x)
    dn[lastc * p.DK + x0 + r] = p.dn_last ? p.dn_last[bh * p.DK + x0 + r] : 0.f;
  for (int c = p.NC - 1; c >= (want_d0 ? 0 : 1); --c) {
    const int64_t start = int64_t(c) * L, g0 = bh * p.S + start;
    const int Lc = chunk_len(p, start);
    chunk_scalars(p, bh, start, Lc, p.ms[bh * p.NC + c], s);
    for (int t = threadIdx.x; t < Lc; t += blockDim.x)
      a[t] = s.w[t] / p.den[g0 + t], bcoef[t] = s.w[t] * p.ddr[g0 + t];
    for (int e = threadIdx.x; e < Lc * rows; e += blockDim.x)
      qt[e] = ld(p.q, p.qkv, (g0 + e / rows) * p.DK + x0 + e % rows) * p.scale;
    __syncthreads();
    const float wl = s.w[Lc - 1];
    const float* Din = dC + int64_t(c) * per;
    float* Dout = c > 0 ? dC + int64_t(c - 1) * per : p.dc0 + bh * per;
    const float* nin = dn + int64_t(c) * p.DK;
    float* nout = c > 0 ? dn + int64_t(c - 1) * p.DK : p.dn0 + bh * p.DK;
    for (int64_t e = threadIdx.x; e < rows * p.DV; e += blockDim.x) {
      const int r = static_cast<int>(e / p.DV);
      const int64_t y = e % p.DV, j = (x0 + r) * p.DV + y;
      float acc = wl != 0.f ? wl * Din[j] : 0.f;
      for (int t = 0; t < Lc; ++t)
        if (a[t] != 0.f) acc += qt[t * rows + r] * a[t] * ld(p.dh, p.dhdt, (g0 + t) * p.DV + y);
      Dout[j] = acc;
    }
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
      float acc = wl != 0.f ? wl * nin[x0 + r] : 0.f;
      for (int t = 0; t < Lc; ++t) acc += bcoef[t] * qt[t * rows + r];
      nout[x0 + r] = acc;
    }
  }
}

// ---- the gradients of one chunk: grid (NC, B·NH) ----
// With dnum_t = dh_t / den_t and d_tu = dnum_t·v_u + ddr_t on t's segment: dS = d∘E, dD = d∘P;
// dq_t = (Σ_u dS_tu k_u + (w_t/den_t) C dh_t + w_t ddr_t n)/√DK; dk_u = Σ_t dS_tu q̂_t + A_u (dC v_u
// + dn); dv_u = Σ_t P_tu dnum_t + A_u dCᵀk_u; gates from dD (row and column sums, a suffix sum
// over cum) and ∂/∂g_t (+ w_last(⟨dC, C⟩ + ⟨dn, n⟩) at the last step): cpu.cc chunk_backward.
__global__ void grads_kernel(Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int L = p.L;
  const Scalars s = scalars_at(smem, L);
  double* dcum = reinterpret_cast<double*>(smem + scalars_bytes(L));
  float* P = reinterpret_cast<float*>(dcum + L);
  float* dS = P + L * L;
  float* dD = dS + L * L;
  float* red = dD + L * L;  // 32 floats
  const int c = blockIdx.x;
  const int64_t bh = blockIdx.y, start = int64_t(c) * L, g0 = bh * p.S + start, per = p.DK * p.DV;
  const int Lc = chunk_len(p, start), last = Lc - 1;
  chunk_scalars(p, bh, start, Lc, p.ms[bh * p.NC + c], s);
  const float* C = p.Cs + (bh * p.NC + c) * per;
  const float* n = p.ns + (bh * p.NC + c) * p.DK;
  const float* dC = p.dCs + (bh * p.NC + c) * per;
  const float* dn = p.dns + (bh * p.NC + c) * p.DK;
  for (int e = threadIdx.x; e < Lc * Lc; e += blockDim.x) {
    const int t = e / Lc, u = e % Lc;
    const float E = decay(s, t, u);
    float pv = 0.f, ds = 0.f, dd = 0.f;
    if (E != 0.f) {
      float dp = 0.f;
      for (int64_t y = 0; y < p.DV; ++y) dp += ld(p.dh, p.dhdt, (g0 + t) * p.DV + y) * ld(p.v, p.qkv, (g0 + u) * p.DV + y);
      const float d = dp / p.den[g0 + t] + p.ddr[g0 + t];
      pv = E * qk(p, g0 + t, g0 + u), ds = d * E, dd = d * pv;
    }
    P[t * L + u] = pv, dS[t * L + u] = ds, dD[t * L + u] = dd;
  }
  const float wl = s.w[last];
  float part = 0.f;
  if (wl != 0.f) {
    for (int64_t j = threadIdx.x; j < per; j += blockDim.x) part += dC[j] * C[j];
    for (int64_t x = threadIdx.x; x < p.DK; x += blockDim.x) part += dn[x] * n[x];
  }
  const float dwl = pc::block_sum(part, red) * wl;  // synchronizes: P, dS, dD complete
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int u = threadIdx.x / 32; u < Lc; u += warps) {  // dk, dv of step u; dD_{last,u} += A_u dA_u
    const int64_t gu = g0 + u;
    const float A = decay(s, last, u);
    float dA = 0.f;
    for (int64_t x = lane; x < p.DK; x += 32) {
      float acc = 0.f;
      for (int t = u; t < Lc; ++t) acc += dS[t * L + u] * ld(p.q, p.qkv, (g0 + t) * p.DK + x);
      acc *= p.scale;
      if (A != 0.f) {
        float w = dn[x];
        for (int64_t y = 0; y < p.DV; ++y) w += ld(p.v, p.qkv, gu * p.DV + y) * dC[x * p.DV + y];
        acc += A * w, dA += ld(p.k, p.qkv, gu * p.DK + x) * w;
      }
      st(p.dk, p.dkdt, gu * p.DK + x, acc);
    }
    dA = pc::warp_sum(dA);
    if (lane == 0) dD[last * L + u] += dA * A;
    for (int64_t y = lane; y < p.DV; y += 32) {
      float acc = 0.f;
      for (int t = u; t < Lc; ++t) acc += P[t * L + u] * ld(p.dh, p.dhdt, (g0 + t) * p.DV + y) / p.den[g0 + t];
      if (A != 0.f) {
        float kc = 0.f;
        for (int64_t x = 0; x < p.DK; ++x) kc += ld(p.k, p.qkv, gu * p.DK + x) * dC[x * p.DV + y];
        acc += A * kc;
      }
      st(p.dv, p.dvdt, gu * p.DV + y, acc);
    }
  }
  for (int t = threadIdx.x / 32; t < Lc; t += warps) {  // dq of step t
    const int64_t g = g0 + t;
    const float w = s.w[t], a = w / p.den[g], b = w * p.ddr[g];
    for (int64_t x = lane; x < p.DK; x += 32) {
      float acc = 0.f;
      for (int u = s.seg[t]; u <= t; ++u) acc += dS[t * L + u] * ld(p.k, p.qkv, (g0 + u) * p.DK + x);
      if (w != 0.f) {
        float cd = 0.f;
        for (int64_t y = 0; y < p.DV; ++y) cd += ld(p.dh, p.dhdt, g * p.DV + y) * C[x * p.DV + y];
        acc += a * cd + b * n[x];
      }
      st(p.dq, p.dqdt, g * p.DK + x, acc * p.scale);
    }
  }
  __syncthreads();  // dD complete (the state-out terms of the last row)
  for (int t = threadIdx.x; t < Lc; t += blockDim.x) {  // D_tu = cum_t − cum_u + i_u, g_t = m_prev + cum_t
    double row = 0.0, col = 0.0;
    for (int u = 0; u <= t; ++u) row += dD[t * L + u];
    for (int u = t; u < Lc; ++u) col += dD[u * L + t];
    dcum[t] = double(p.dg[g0 + t]) + (t == last ? double(dwl) : 0.0) + row - col;
    st(p.di, p.didt, g0 + t, static_cast<float>(col));
  }
  __syncthreads();
  for (int t = threadIdx.x; t < Lc; t += blockDim.x) {  // cum_u depends on logf_t for t ≤ u
    double suffix = 0.0;
    for (int u = t; u < Lc; ++u) suffix += dcum[u];
    const double f = ld(p.f, p.gates, g0 + t);
    // d logsigmoid(f)/df = σ(−f); an erasing gate's logsigmoid is in no sum (the steps after it
    // depend on the sums' differences only: what crosses it cancels, as across a reset).
    st(p.df, p.dfdt, g0 + t, forgets_all(f) ? 0.f : static_cast<float>(suffix / (1.0 + exp(f))));
  }
}

}  // namespace tessera::mlstm::cuda_kernels
