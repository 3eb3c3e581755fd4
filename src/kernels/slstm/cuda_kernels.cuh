// slstm cuda: the device code (kernel arguments, the three kernels), included by cuda.cu and by
// the CPU emulation test (tests/kernels/slstm_cuda_emulation_test.cc), which defines
// TESSERA_CUDA_EMULATION and runs these kernels on host threads, one per CUDA thread, with a
// barrier for __syncthreads: the same text checked against the reference without a GPU.
// The design is described at the top of cuda.cu.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/slstm/cuda_plan.h"

#if !defined(TESSERA_CUDA_EMULATION)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
// The block's dynamic shared memory (its size is the launch's).
#define TESSERA_BLOCK_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace tessera::slstm::cuda_kernels {

using cuda_plan::backward_smem;
using cuda_plan::forward_smem;
using cuda_plan::kMaxDH;
using cuda_plan::kMaxThreads;
using cuda_plan::kRegRows;
using cuda_plan::kRows;
using cuda_plan::register_rows;
using cuda_plan::threads_for;
constexpr int kWeightJ = 8;     // rows j of dr per thread in slstm_weight_grads
constexpr int kTapeFields = 11;
// Tape fields, each an array of B·S·NH·DH f32 in h's layout.
enum Tape { kHPrev, kCPrev, kNPrev, kI, kF, kZt, kOg, kSfm, kC, kN, kH };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half(x); }

// Stable forms in f32 from e = exp(−|x|) ∈ (0, 1] (never overflows): sigmoid(x) = 1/(1 + e) or
// e/(1 + e), which does not flush to 0 below −17 like 0.5 + 0.5·tanh(x/2); logsigmoid(x) =
// min(x, 0) − log1p(e).
__device__ __forceinline__ float sigmoid_of(float x, float e) { return (x >= 0.0f ? 1.0f : e) / (1.0f + e); }
__device__ __forceinline__ float sigmoid_of(float x) { return sigmoid_of(x, expf(-fabsf(x))); }

struct Args {
  const void *wx, *r, *b;                          // the inputs' dtype
  const uint8_t* resets;                           // [B, S] device copy, or null
  const float *h0, *c0, *n0, *m0;                  // [B, NH, DH] or null
  void* h;                                         // in h_dtype (0 f32, 1 bf16, 2 f16); null: not asked for
  int h_dtype;
  float *h_last, *c_last, *n_last, *m_last;        // null when not asked for
  float* tape;                                     // [kTapeFields][cells], null: forward only
  // backward
  const void* dh;  // [B, S, NH, DH] in dh_dtype (0 f32, 1 bf16, 2 f16)
  int dh_dtype;
  const float *dh_last, *dc_last, *dn_last;
  void* dwx;
  float* dpre;     // wx's layout, f32
  float *dh0, *dc0, *dn0;
  int64_t B, S, NH, DH;

  __device__ int64_t cells() const { return B * S * NH * DH; }
  __device__ int64_t wx_at(int64_t bi, int64_t t, int64_t g, int64_t hd, int64_t k) const {
    return (((bi * S + t) * 4 + g) * NH + hd) * DH + k;
  }
  __device__ int64_t h_at(int64_t bi, int64_t t, int64_t hd, int64_t k) const { return ((bi * S + t) * NH + hd) * DH + k; }
  __device__ int64_t state_at(int64_t bi, int64_t hd, int64_t k) const { return (bi * NH + hd) * DH + k; }
  __device__ int64_t r_at(int64_t g, int64_t hd, int64_t j, int64_t k) const { return ((g * NH + hd) * DH + j) * DH + k; }
  __device__ bool reset(int64_t bi, int64_t t) const { return t > 0 && resets != nullptr && resets[bi * S + t] != 0; }
  __device__ bool first(int64_t bi, int64_t t) const { return (t == 0 && h0 == nullptr) || reset(bi, t); }
  __device__ void store_h(int64_t i, float v) const {  // the f32 h rounded once
    if (h_dtype == 0)
      static_cast<float*>(h)[i] = v;
    else if (h_dtype == 1)
      static_cast<__nv_bfloat16*>(h)[i] = __float2bfloat16_rn(v);
    else
      static_cast<__half*>(h)[i] = __float2half_rn(v);
  }
  __device__ float upstream(int64_t i) const {
    if (dh_dtype == 0) return static_cast<const float*>(dh)[i];
    if (dh_dtype == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(dh)[i]);
    return __half2float(static_cast<const __half*>(dh)[i]);
  }
};

template <class T, int JR>
__global__ void __launch_bounds__(kMaxThreads) slstm_forward(Args a) {
  TESSERA_BLOCK_SMEM(smem);
  const int64_t DH = a.DH, W = 4 * DH, hd = blockIdx.x, b0 = int64_t{blockIdx.y} * kRows;
  const int rows = static_cast<int>(min(int64_t{kRows}, a.B - b0));
  const int tid = threadIdx.x, nthr = blockDim.x;
  float* hs = reinterpret_cast<float*>(smem);  // [kRows][DH] each
  float* cs = hs + kRows * DH;
  float* ns = cs + kRows * DH;
  float* ms = ns + kRows * DH;
  float* pre = ms + kRows * DH;                // [kRows][W]
  T* Rs = reinterpret_cast<T*>(pre + kRows * W);  // [DH − JR][W]: Rs[(j − JR)·W + c] = r[g, hd, j, k]
  const T* r = static_cast<const T*>(a.r);
  for (int64_t e = tid; e < (DH - JR) * W; e += nthr) {
    const int64_t j = JR + e / W, c = e % W;
    Rs[e] = r[a.r_at(c / DH, hd, j, c % DH)];
  }
  const bool col = tid < W;
  const int64_t g = tid / DH, k = tid % DH;
  float rreg[JR > 0 ? JR : 1];
#pragma unroll
  for (int j = 0; j < JR; ++j) rreg[j] = col ? to_f32(r[a.r_at(g, hd, j, k)]) : 0.0f;
  const float bias = col ? to_f32(static_cast<const T*>(a.b)[(g * a.NH + hd) * DH + k]) : 0.0f;
  for (int64_t e = tid; e < kRows * DH; e += nthr) {  // rows past B stay zero: the product reads them
    const int64_t bb = e / DH, s = a.state_at(b0 + bb, hd, e % DH);
    const bool init = a.h0 != nullptr && bb < rows;
    hs[e] = init ? a.h0[s] : 0.0f, cs[e] = init ? a.c0[s] : 0.0f;
    ns[e] = init ? a.n0[s] : 0.0f, ms[e] = init ? a.m0[s] : 0.0f;
  }
  __syncthreads();
  const T* wx = static_cast<const T*>(a.wx);
  const int64_t cells = a.cells();
  for (int64_t t = 0; t < a.S; ++t) {
    // A reset zeroes the state before step t; the tape keeps the state the step starts from.
    for (int64_t e = tid; e < rows * DH; e += nthr) {
      const int64_t bb = e / DH, kk = e % DH;
      if (a.reset(b0 + bb, t)) hs[e] = cs[e] = ns[e] = ms[e] = 0.0f;
      if (a.tape) {
        const int64_t i = a.h_at(b0 + bb, t, hd, kk);
        a.tape[kHPrev * cells + i] = hs[e], a.tape[kCPrev * cells + i] = cs[e], a.tape[kNPrev * cells + i] = ns[e];
      }
    }
    __syncthreads();
    if (col) {
      float acc[kRows];
#pragma unroll
      for (int bb = 0; bb < kRows; ++bb) acc[bb] = 0.0f;
#pragma unroll
      for (int j = 0; j < JR; ++j)
#pragma unroll
        for (int bb = 0; bb < kRows; ++bb) acc[bb] = fmaf(hs[bb * DH + j], rreg[j], acc[bb]);
      for (int64_t j = JR; j < DH; ++j) {
        const float rv = to_f32(Rs[(j - JR) * W + tid]);
#pragma unroll
        for (int bb = 0; bb < kRows; ++bb) acc[bb] = fmaf(hs[bb * DH + j], rv, acc[bb]);
      }
#pragma unroll
      for (int bb = 0; bb < kRows; ++bb)
        if (bb < rows) pre[bb * W + tid] = acc[bb] + to_f32(wx[a.wx_at(b0 + bb, t, g, hd, k)]) + bias;
    }
    __syncthreads();
    for (int64_t e = tid; e < rows * DH; e += nthr) {
      const int64_t bb = e / DH, kk = e % DH, bi = b0 + bb;
      const float* p = pre + bb * W;
      const float i = p[kk], f = p[DH + kk], z = p[2 * DH + kk], o = p[3 * DH + kk];
      const float ef = expf(-fabsf(f)), lsf = fminf(f, 0.0f) - log1pf(ef);
      float m = i, I = 1.0f, F = 0.0f;
      if (!a.first(bi, t)) {
        const float mf = ms[e] + lsf;
        m = fmaxf(i, mf);
        I = expf(i - m), F = expf(mf - m);
      }
      const float zt = tanhf(z), og = sigmoid_of(o);
      const float c = F * cs[e] + I * zt, n = F * ns[e] + I, h = og * c / n;
      hs[e] = h, cs[e] = c, ns[e] = n, ms[e] = m;
      const int64_t hi = a.h_at(bi, t, hd, kk);
      if (a.h) a.store_h(hi, h);
      if (a.tape) {
        float* tp = a.tape + hi;
        tp[kI * cells] = I, tp[kF * cells] = F, tp[kZt * cells] = zt, tp[kOg * cells] = og;
        tp[kSfm * cells] = sigmoid_of(-f, ef);  // sigmoid(−f̄)
        tp[kC * cells] = c, tp[kN * cells] = n, tp[kH * cells] = h;
      }
    }
    __syncthreads();
  }
  if (a.h_last)
    for (int64_t e = tid; e < rows * DH; e += nthr) {
      const int64_t s = a.state_at(b0 + e / DH, hd, e % DH);
      a.h_last[s] = hs[e], a.c_last[s] = cs[e], a.n_last[s] = ns[e], a.m_last[s] = ms[e];
    }
}

template <class T, int JR>
__global__ void __launch_bounds__(kMaxThreads) slstm_backward(Args a) {
  TESSERA_BLOCK_SMEM(smem);
  const int64_t DH = a.DH, W = 4 * DH, hd = blockIdx.x, b0 = int64_t{blockIdx.y} * kRows;
  const int rows = static_cast<int>(min(int64_t{kRows}, a.B - b0));
  const int tid = threadIdx.x, nthr = blockDim.x;
  float* dhs = reinterpret_cast<float*>(smem);  // [kRows][DH] each: gradients of h, c, n carried back
  float* dcs = dhs + kRows * DH;
  float* dns = dcs + kRows * DH;
  float* dp = dns + kRows * DH;                 // [kRows][W]: the step's dpre
  float* part = dp + kRows * W;                 // [kRows][W]: part[b, g·DH + j] = Σ_k r[g, j, k]·dpre[b, g, k]
  T* Rt = reinterpret_cast<T*>(part + kRows * W);  // [4][DH − JR][DH]: Rt[(g·(DH − JR) + k − JR)·DH + j] = r[g, hd, j, k]
  const T* r = static_cast<const T*>(a.r);
  for (int64_t e = tid; e < 4 * (DH - JR) * DH; e += nthr) {
    const int64_t j = e % DH, gk = e / DH, g = gk / (DH - JR), k = JR + gk % (DH - JR);
    Rt[e] = r[a.r_at(g, hd, j, k)];
  }
  const bool col = tid < W;
  const int64_t g = tid / DH, j = tid % DH;  // this thread's (gate, row j of r)
  float rreg[JR > 0 ? JR : 1];
#pragma unroll
  for (int k = 0; k < JR; ++k) rreg[k] = col ? to_f32(r[a.r_at(g, hd, j, k)]) : 0.0f;
  for (int64_t e = tid; e < kRows * DH; e += nthr) {
    const int64_t bb = e / DH, s = a.state_at(b0 + bb, hd, e % DH);
    const bool in = bb < rows;
    dhs[e] = in && a.dh_last ? a.dh_last[s] : 0.0f;
    dcs[e] = in && a.dc_last ? a.dc_last[s] : 0.0f;
    dns[e] = in && a.dn_last ? a.dn_last[s] : 0.0f;
  }
  for (int64_t e = tid; e < kRows * W; e += nthr) dp[e] = 0.0f;  // rows past B: the product reads them
  __syncthreads();
  T* dwx = static_cast<T*>(a.dwx);
  const int64_t cells = a.cells();
  for (int64_t t = a.S - 1; t >= 0; --t) {
    for (int64_t e = tid; e < rows * DH; e += nthr) {
      const int64_t bb = e / DH, kk = e % DH, bi = b0 + bb, hi = a.h_at(bi, t, hd, kk);
      const float* tp = a.tape + hi;
      const float I = tp[kI * cells], F = tp[kF * cells], zt = tp[kZt * cells], og = tp[kOg * cells];
      const float c = tp[kC * cells], n = tp[kN * cells], h = tp[kH * cells];
      const float dh = a.upstream(hi) + dhs[e];
      const float dog = dh * c / n, dct = dcs[e] + dh * og / n, dnt = dns[e] - dh * h / n;
      const float dF = dct * tp[kCPrev * cells] + dnt * tp[kNPrev * cells], dI = dct * zt + dnt;
      const bool first = a.first(bi, t);
      const float d[4] = {dI * I, first ? 0.0f : dF * F * tp[kSfm * cells], dct * I * (1.0f - zt * zt),
                          dog * og * (1.0f - og)};
      dcs[e] = first ? 0.0f : dct * F;
      dns[e] = first ? 0.0f : dnt * F;
#pragma unroll
      for (int gg = 0; gg < 4; ++gg) {
        const int64_t wi = a.wx_at(bi, t, gg, hd, kk);
        dp[bb * W + gg * DH + kk] = d[gg];
        dwx[wi] = from_f32<T>(d[gg]);
        a.dpre[wi] = d[gg];
      }
    }
    __syncthreads();
    if (col) {
      float acc[kRows];
#pragma unroll
      for (int bb = 0; bb < kRows; ++bb) acc[bb] = 0.0f;
      const float* dg = dp + g * DH;
#pragma unroll
      for (int k = 0; k < JR; ++k)
#pragma unroll
        for (int bb = 0; bb < kRows; ++bb) acc[bb] = fmaf(rreg[k], dg[bb * W + k], acc[bb]);
      const T* rt = Rt + g * (DH - JR) * DH + j;
      for (int64_t k = JR; k < DH; ++k) {
        const float rv = to_f32(rt[(k - JR) * DH]);
#pragma unroll
        for (int bb = 0; bb < kRows; ++bb) acc[bb] = fmaf(rv, dg[bb * W + k], acc[bb]);
      }
#pragma unroll
      for (int bb = 0; bb < kRows; ++bb) part[bb * W + tid] = acc[bb];
    }
    __syncthreads();
    for (int64_t e = tid; e < rows * DH; e += nthr) {  // nothing flows to a zeroed (or absent) previous state
      const int64_t bb = e / DH, jj = e % DH;
      const float* q = part + bb * W + jj;
      dhs[e] = a.first(b0 + bb, t) ? 0.0f : (q[0] + q[DH]) + (q[2 * DH] + q[3 * DH]);
    }
    __syncthreads();
  }
  if (a.dh0)
    for (int64_t e = tid; e < rows * DH; e += nthr) {
      const int64_t s = a.state_at(b0 + e / DH, hd, e % DH);
      a.dh0[s] = dhs[e], a.dc0[s] = dcs[e], a.dn0[s] = dns[e];
    }
}

// dr[g, hd, j, k] = Σ_{b,t} h_{t−1}[b, t, hd, j]·dpre[b, t, g, hd, k]; db[g, hd, k] = Σ dpre (blockIdx.y == 0).
// Block (hd, kWeightJ rows j); thread per column c = g·DH + k; f32 accumulators, rows in order.
template <class T>
__global__ void slstm_weight_grads(const float* hprev, const float* dpre, int64_t rows, int64_t NH, int64_t DH, T* dr,
                                   T* db) {
  const int64_t hd = blockIdx.x, j0 = int64_t{blockIdx.y} * kWeightJ, W = 4 * DH;
  for (int64_t c = threadIdx.x; c < W; c += blockDim.x) {
    const int64_t g = c / DH, k = c % DH;
    float acc[kWeightJ], accb = 0.0f;
#pragma unroll
    for (int jj = 0; jj < kWeightJ; ++jj) acc[jj] = 0.0f;
    for (int64_t row = 0; row < rows; ++row) {
      const float d = dpre[((row * 4 + g) * NH + hd) * DH + k];
      const float* hp = hprev + (row * NH + hd) * DH + j0;
      accb += d;
#pragma unroll
      for (int jj = 0; jj < kWeightJ; ++jj)
        if (j0 + jj < DH) acc[jj] = fmaf(hp[jj], d, acc[jj]);
    }
#pragma unroll
    for (int jj = 0; jj < kWeightJ; ++jj)
      if (j0 + jj < DH) dr[((g * NH + hd) * DH + j0 + jj) * DH + k] = from_f32<T>(acc[jj]);
    if (blockIdx.y == 0) db[(g * NH + hd) * DH + k] = from_f32<T>(accb);
  }
}

}  // namespace tessera::slstm::cuda_kernels
