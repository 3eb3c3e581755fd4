// slstm cuda, version 1: a persistent kernel in the FlashRNN style, one block per (head, block of
// kRows batch rows), looping over all S steps with block-level synchronization (the block owns
// its rows' whole recurrence: no grid-wide barrier).
//   forward (slstm_forward): the head's recurrent weights stay resident for the whole sequence —
//     in shared memory in the inputs' dtype, with the first kRegRows rows j of each column in
//     registers when all of r does not fit (f32 at DH > 112 on an H100); thread c = g·DH + k owns column c
//     (gate g, unit k): per step pre[b, c] = Σ_j h[b, j]·r[g, j, k] + wx + b for the block's rows
//     (h broadcast from shared memory), then the cells' pointwise gates in f32 (stable sigmoid,
//     logsigmoid, tanh; the first-step rule m = ī), state (h, c, n, m) in shared memory.
//   backward (slstm_backward): the same block, steps in reverse, from the forward's tape (11 f32
//     per cell in device scratch): the gates' gradients per cell (dwx written, dpre kept in f32
//     scratch), then dh_{t−1} = Σ_{g,k} r[g, j, k]·dpre[g, k] by thread (g, j) from rᵀ resident the
//     same way (its first kRegRows columns k in registers), summed over the gates.
//   dr, db (slstm_weight_grads): Σ over B·S of h_{t−1}ᵀ·dpre and dpre, f32 accumulators per thread
//     (deterministic: no atomics), rounded once to the inputs' dtype.
// DH ≤ 128 (kMaxDH), and the shared memory a block needs must fit the device's opt-in limit
// (f32 DH = 128 needs 208 KiB forward, 214 KiB backward: H100 / H200 227 KiB). Resets are host
// memory (Problem): copied to the device once per call. Compiled in CI for sm_90a + PTX; NOT run
// on a GPU yet (docs/kernels/slstm.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "core/trace_nvtx.h"
#include "kernels/slstm/cuda_plan.h"
#include "kernels/slstm/impl.h"
#include "primitives/cuda_available.h"
#include "tessera/error.h"

namespace tessera::slstm {
namespace {

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
  float *h, *h_last, *c_last, *n_last, *m_last;    // null when not asked for
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
  __device__ float upstream(int64_t i) const {
    if (dh_dtype == 0) return static_cast<const float*>(dh)[i];
    if (dh_dtype == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(dh)[i]);
    return __half2float(static_cast<const __half*>(dh)[i]);
  }
};

template <class T, int JR>
__global__ void __launch_bounds__(kMaxThreads) slstm_forward(Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
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
      if (a.h) a.h[hi] = h;
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
  extern __shared__ __align__(16) unsigned char smem[];
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

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, std::string(kKernelName) + " (cuda): " + msg);
}

constexpr const char* kResetsCopy = "slstm (cuda) copies the resets mask to the device";

size_t optin_smem(int dev) {
  int v = 0;
  cuda::check(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
              "slstm (cuda): cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  return static_cast<size_t>(v);
}

template <class K>
void launch(K kernel, const char* name, const Args& a, size_t smem, cudaStream_t st) {
  cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), name);
  const dim3 grid(static_cast<unsigned>(a.NH), static_cast<unsigned>((a.B + kRows - 1) / kRows));
  kernel<<<grid, threads_for(a.DH), smem, st>>>(a);
  cuda::check_launch(name, st);
}

template <class T, int JR>
void run_typed(const Problem& p, Args a, cudaStream_t st) {
  const size_t esz = sizeof(T);
  {
    TESSERA_NVTX_RANGE("slstm.cuda.forward");
    launch(slstm_forward<T, JR>, "slstm_forward", a, forward_smem(p.DH, esz, JR), st);
  }
  if (!p.backward) return;
  {
    TESSERA_NVTX_RANGE("slstm.cuda.backward");
    launch(slstm_backward<T, JR>, "slstm_backward", a, backward_smem(p.DH, esz, JR), st);
  }
  TESSERA_NVTX_RANGE("slstm.cuda.weight_grads");
  const dim3 grid(static_cast<unsigned>(p.NH), static_cast<unsigned>((p.DH + kWeightJ - 1) / kWeightJ));
  slstm_weight_grads<T><<<grid, std::min(threads_for(p.DH), kMaxThreads), 0, st>>>(
      a.tape + kHPrev * p.B * p.S * p.NH * p.DH, a.dpre, p.B * p.S, p.NH, p.DH, static_cast<T*>(p.dr),
      static_cast<T*>(p.db));
  cuda::check_launch("slstm_weight_grads", st);
}

template <class T>
void run_dtype(const Problem& p, const Args& a, int jr, cudaStream_t st) {
  if (jr == 0) return run_typed<T, 0>(p, a, st);
  return run_typed<T, kRegRows>(p, a, st);
}

class Cuda final : public Implementation {
 public:
  std::string name() const override { return "cuda"; }
  std::string description() const override {
    return "NVIDIA GPUs: persistent kernel, one block per (head, 4 batch rows) over all steps, recurrent weights "
           "resident in shared memory (and registers), backward through time from a device tape (v1, DH <= 128)";
  }
  DeviceType device_type() const override { return DeviceType::kCUDA; }
  Availability available() const override { return primitives::cuda_available(); }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCUDA) return Availability::no("the cuda backend runs on CUDA device memory");
    if (const Availability a = available(); !a.ok) return a;
    if (p.DH > kMaxDH)
      return Availability::no("DH=" + std::to_string(p.DH) + " is over the cuda limit of " + std::to_string(kMaxDH) +
                              " (a head's recurrent weights stay resident in one block)");
    if ((p.B + kRows - 1) / kRows > 65535 || p.NH > 65535)
      return Availability::no("B must be <= 262140 and NH <= 65535 on the cuda backend (grid dimensions)");
    const size_t optin = optin_smem(p.device.index), esz = dtype_size(p.dtype);
    if (register_rows(p.DH, esz, optin) < 0)
      return Availability::no("DH=" + std::to_string(p.DH) + " in " + dtype_name(p.dtype) + " needs " +
                              std::to_string(backward_smem(p.DH, esz, kRegRows)) + " bytes of shared memory per block; " +
                              p.device.str() + " gives " + std::to_string(optin));
    if (p.resets)
      if (const std::string why = cuda::capture_refusal(static_cast<cudaStream_t>(p.stream), kResetsCopy); !why.empty())
        return Availability::no(why);
    return Availability::yes();
  }

  void run(const Problem& p) const override {
    const int dev = p.device.index;
    cuda::DeviceGuard guard(dev);
    const std::string who = std::string(kKernelName) + " (cuda)";
    for (const auto& [ptr, what] : {std::pair<const void*, const char*>{p.wx, "wx"}, {p.r, "r"}, {p.b, "b"}})
      cuda::require_accessible(ptr, dev, who, what);
    for (const auto& [ptr, what] :
         {std::pair<const void*, const char*>{p.h0, "h0"}, {p.c0, "c0"}, {p.n0, "n0"}, {p.m0, "m0"}, {p.h, "h"},
          {p.h_last, "h_last"}, {p.c_last, "c_last"}, {p.n_last, "n_last"}, {p.m_last, "m_last"}, {p.dh_given, "dh"},
          {p.dh_last, "dh_last"}, {p.dc_last, "dc_last"}, {p.dn_last, "dn_last"}, {p.dwx, "dwx"}, {p.dr, "dr"},
          {p.db, "db"}, {p.dh0, "dh0"}, {p.dc0, "dc0"}, {p.dn0, "dn0"}})
      if (ptr) cuda::require_accessible(ptr, dev, who, what);
    const int jr = register_rows(p.DH, dtype_size(p.dtype), optin_smem(dev));
    if (jr < 0) fail(ErrorCode::kUnsupported, "DH=" + std::to_string(p.DH) + " does not fit this device's shared memory");
    const auto st = static_cast<cudaStream_t>(p.stream);
    cuda::DeviceBuffer resets;
    if (p.resets) {
      if (const std::string why = cuda::capture_refusal(st, kResetsCopy); !why.empty()) fail(ErrorCode::kUnsupported, why);
      resets = cuda::DeviceBuffer(size_t(p.B * p.S), st, dev);
      cuda::copy_host_to_device(resets.get(), p.resets, resets.bytes(), st, dev, "slstm (cuda): copy of the resets");
    }
    const size_t cells = size_t(p.B * p.S * p.NH * p.DH);
    cuda::DeviceBuffer tape, dpre;
    if (p.backward) {
      tape = cuda::DeviceBuffer(sizeof(float) * kTapeFields * cells, st, dev);
      dpre = cuda::DeviceBuffer(sizeof(float) * 4 * cells, st, dev);
    }
    const int dh_code = p.dh_dtype == DType::kF32 ? 0 : p.dh_dtype == DType::kBF16 ? 1 : 2;
    const Args a{p.wx, p.r, p.b, static_cast<const uint8_t*>(resets.get()), p.h0, p.c0, p.n0, p.m0, p.h, p.h_last,
                 p.c_last, p.n_last, p.m_last, static_cast<float*>(tape.get()), p.dh_given, dh_code, p.dh_last,
                 p.dc_last, p.dn_last, p.dwx, static_cast<float*>(dpre.get()), p.dh0, p.dc0, p.dn0, p.B, p.S, p.NH,
                 p.DH};
    switch (p.dtype) {
      case DType::kF32: return run_dtype<float>(p, a, jr, st);
      case DType::kBF16: return run_dtype<__nv_bfloat16>(p, a, jr, st);
      case DType::kF16: return run_dtype<__half>(p, a, jr, st);
      default: fail(ErrorCode::kInternal, "dtype");
    }
    // resets, tape and dpre are released stream-ordered when they go out of scope.
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cuda_implementation() {
  cuda::register_allocator();
  cuda::register_device_hooks();
  return std::make_unique<Cuda>();
}

// The CUDA module registers this implementation when it is loaded, in place of the "cuda"
// placeholder declared in implementations.cc.
TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cuda_implementation()); });

}  // namespace tessera::slstm
