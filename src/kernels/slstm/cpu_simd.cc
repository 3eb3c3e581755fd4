// slstm CPU backend: the fused pointwise gates (Highway, run-time dispatch). Each loop handles
// any DH: full vectors, then one tail through padded stack buffers (the same code path).
#include <cmath>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/slstm/cpu_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/slstm/cpu_simd.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::slstm::cpu_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
constexpr int kMaxArrays = 16;

// Runs body(offset, lanes-vector loader/storer) over [0, DH): `in` arrays are read, `out`
// arrays written; the tail goes through zero-padded buffers.
template <class Body>
HWY_INLINE void over_lanes(int64_t DH, const float* const* in, int nin, float* const* out, int nout, Body&& body) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  using V = hn::Vec<DF>;
  int64_t k = 0;
  for (; k + N <= DH; k += N) {
    V vi[kMaxArrays], vo[kMaxArrays];
    for (int a = 0; a < nin; ++a) vi[a] = in[a] ? hn::LoadU(df, in[a] + k) : hn::Zero(df);
    body(vi, vo);
    for (int a = 0; a < nout; ++a)
      if (out[a]) hn::StoreU(vo[a], df, out[a] + k);
  }
  if (k == DH) return;
  HWY_ALIGN float buf[kMaxArrays][hn::MaxLanes(df)];
  V vi[kMaxArrays], vo[kMaxArrays];
  for (int a = 0; a < nin; ++a) {
    for (size_t l = 0; l < hn::MaxLanes(df); ++l) buf[a][l] = (in[a] && k + int64_t(l) < DH) ? in[a][k + l] : 0.0f;
    vi[a] = hn::Load(df, buf[a]);
  }
  body(vi, vo);
  for (int a = 0; a < nout; ++a) {
    hn::Store(vo[a], df, buf[a]);
    if (out[a])
      for (int64_t l = 0; k + l < DH; ++l) out[a][k + l] = buf[a][l];
  }
}

// G[r, c] = Σ_j h[r, j]·R[j, c] for ROWS rows and a block of V vectors of columns at c0: R is
// read in its row-major [DH, W] layout (the packed R_h), h broadcast one element at a time.
template <int ROWS, int V>
HWY_INLINE void GemmBlock(const float* h, int64_t DH, const float* R, int64_t W, float* G, int64_t c0) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> acc[ROWS][V];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = hn::Zero(df);
  for (int64_t j = 0; j < DH; ++j) {
    hn::Vec<DF> rv[V];
    for (int v = 0; v < V; ++v) rv[v] = hn::LoadU(df, R + j * W + c0 + v * N);
    for (int r = 0; r < ROWS; ++r) {
      const auto hb = hn::Set(df, h[r * DH + j]);
      for (int v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(hb, rv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < V; ++v) hn::StoreU(acc[r][v], df, G + r * W + c0 + v * N);
}

template <int ROWS>
HWY_INLINE void GemmRows(const float* h, int64_t DH, const float* R, int64_t W, float* G) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t c = 0;
  for (; c + 4 * N <= W; c += 4 * N) GemmBlock<ROWS, 4>(h, DH, R, W, G, c);
  for (; c + N <= W; c += N) GemmBlock<ROWS, 1>(h, DH, R, W, G, c);
  for (; c < W; ++c)  // column tail: scalar, same order of the sum over j
    for (int r = 0; r < ROWS; ++r) {
      float s = 0.0f;
      for (int64_t j = 0; j < DH; ++j) s += h[r * DH + j] * R[j * W + c];
      G[r * W + c] = s;
    }
}

void GemmStep(const float* h, int64_t Bb, int64_t DH, const float* R, int64_t W, float* G) {
  int64_t r = 0;
  for (; r + 4 <= Bb; r += 4) GemmRows<4>(h + r * DH, DH, R, W, G + r * W);
  for (; r + 2 <= Bb; r += 2) GemmRows<2>(h + r * DH, DH, R, W, G + r * W);
  for (; r < Bb; ++r) GemmRows<1>(h + r * DH, DH, R, W, G + r * W);
}

// sigmoid(x) from e = exp(−|x|): 1/(1+e) for x ≥ 0, e/(1+e) below; relative error of a few ulp for
// every finite x (0.5 + 0.5·tanh(x/2) flushed to 0 below x ≈ −17: 1 − tanh cancels).
template <class V>
HWY_INLINE V SigmoidOfExp(DF df, V x, V e) {
  const auto one = hn::Set(df, 1.0f);
  return hn::Div(hn::IfThenElse(hn::Ge(x, hn::Zero(df)), one, e), hn::Add(one, e));
}
template <class V>
HWY_INLINE V Sigmoid(DF df, V x) {
  return SigmoidOfExp(df, x, hn::Exp(df, hn::Neg(hn::Abs(x))));
}

// kTape: also compute what the backward reads (I, F, tanh z̄, sigmoid ō, sigmoid(−f̄)): off in a forward-only call.
template <bool kTape>
HWY_INLINE void ForwardRowT(const float* pre, int64_t DH, bool first, float* m, float* c, float* n, float* h,
                            const Act& act) {
  const DF df;
  const auto one = hn::Set(df, 1.0f), zero = hn::Zero(df);
  const float* in[] = {pre, pre + DH, pre + 2 * DH, pre + 3 * DH, m, c, n};
  float* out[] = {m, c, n, h, act.I, act.F, act.zt, act.og, act.sfm};
  over_lanes(DH, in, 7, out, kTape ? 9 : 4, [&](auto* v, auto* o) {
    const auto i = v[0], f = v[1], z = v[2], og_pre = v[3];
    const auto ef = hn::Exp(df, hn::Neg(hn::Abs(f)));  // exp(−|f̄|) in (0, 1]: no overflow
    const auto lsf = hn::Sub(hn::Min(f, zero), hn::Log1p(df, ef));
    auto mt = i, I = one, F = zero;
    if (!first) {
      // One of I, F is exp(0) = 1 (the max); the other exp(−|ī − (m + logsigmoid f̄)|): one exp.
      const auto mf = hn::Add(v[4], lsf);
      const auto d = hn::Sub(i, mf);
      const auto e = hn::Exp(df, hn::Neg(hn::Abs(d)));
      const auto i_wins = hn::Ge(d, zero);
      mt = hn::Max(i, mf);
      I = hn::IfThenElse(i_wins, one, e);
      F = hn::IfThenElse(i_wins, e, one);
    }
    const auto zt = hn::Tanh(df, z);
    const auto og = Sigmoid(df, og_pre);
    auto ct = hn::MulAdd(F, v[5], hn::Mul(I, zt));
    auto nt = hn::MulAdd(F, v[6], I);
    // A NaN pre-activation (or ī = +inf: exp(ī − m) with m = +inf) makes the cell NaN, as in the
    // reference: Max, Min, Ge and the clamped Exp above would turn it into finite gates.
    const auto bad = hn::Or(hn::Or(hn::IsNaN(i), hn::IsNaN(f)), hn::Or(hn::IsNaN(hn::Add(z, og_pre)), hn::Eq(i, hn::Set(df, HUGE_VALF))));
    const auto nan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
    mt = hn::IfThenElse(bad, nan, mt), ct = hn::IfThenElse(bad, nan, ct), nt = hn::IfThenElse(bad, nan, nt);
    o[0] = mt, o[1] = ct, o[2] = nt, o[3] = hn::Div(hn::Mul(og, ct), nt);
    if (kTape) {
      o[4] = I, o[5] = F, o[6] = zt, o[7] = og;
      o[8] = SigmoidOfExp(df, hn::Neg(f), ef);  // sigmoid(−f̄) from exp(−|f̄|): no second exp
    }
  });
}

void ForwardRow(const float* pre, int64_t DH, bool first, float* m, float* c, float* n, float* h, const Act& act) {
  if (act.I)
    ForwardRowT<true>(pre, DH, first, m, c, n, h, act);
  else
    ForwardRowT<false>(pre, DH, first, m, c, n, h, act);
}

void BackwardRow(const float* dh, float* dc, float* dn, const Act& act, const float* c, const float* n, const float* h,
                 const float* cprev, const float* nprev, int64_t DH, bool first, float* dpre) {
  const DF df;
  const auto one = hn::Set(df, 1.0f), zero = hn::Zero(df);
  const float* in[] = {dh, dc, dn, act.I, act.F, act.zt, act.og, act.sfm, c, n, h, cprev, nprev};
  float* out[] = {dpre, dpre + DH, dpre + 2 * DH, dpre + 3 * DH, dc, dn};
  over_lanes(DH, in, 13, out, 6, [&](auto* v, auto* o) {
    const auto g = v[0], I = v[3], F = v[4], zt = v[5], og = v[6], sfm = v[7], ct = v[8], nt = v[9], ht = v[10];
    const auto inv_n = hn::Div(one, nt);
    const auto dog = hn::Mul(hn::Mul(g, ct), inv_n);
    const auto dct = hn::MulAdd(hn::Mul(g, og), inv_n, v[1]);
    const auto dnt = hn::NegMulAdd(hn::Mul(g, ht), inv_n, v[2]);
    const auto dF = hn::MulAdd(dct, v[11], hn::Mul(dnt, v[12]));
    const auto dI = hn::MulAdd(dct, zt, dnt);
    o[0] = hn::Mul(dI, I);
    o[1] = first ? zero : hn::Mul(hn::Mul(dF, F), sfm);
    o[2] = hn::Mul(hn::Mul(dct, I), hn::NegMulAdd(zt, zt, one));
    o[3] = hn::Mul(hn::Mul(dog, og), hn::Sub(one, og));
    o[4] = first ? zero : hn::Mul(dct, F);
    o[5] = first ? zero : hn::Mul(dnt, F);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::slstm::cpu_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::slstm::cpu_simd {

HWY_EXPORT(ForwardRow);
HWY_EXPORT(BackwardRow);
HWY_EXPORT(GemmStep);

void gemm_step(const float* h, int64_t Bb, int64_t DH, const float* R, int64_t W, float* G) {
  HWY_DYNAMIC_DISPATCH(GemmStep)(h, Bb, DH, R, W, G);
}

void forward_row(const float* pre, int64_t DH, bool first, float* m, float* c, float* n, float* h, const Act& act) {
  HWY_DYNAMIC_DISPATCH(ForwardRow)(pre, DH, first, m, c, n, h, act);
}

void backward_row(const float* dh, float* dc, float* dn, const Act& act, const float* c, const float* n, const float* h,
                  const float* cprev, const float* nprev, int64_t DH, bool first, float* dpre) {
  HWY_DYNAMIC_DISPATCH(BackwardRow)(dh, dc, dn, act, c, n, h, cprev, nprev, DH, first, dpre);
}

}  // namespace tessera::slstm::cpu_simd
#endif  // HWY_ONCE

