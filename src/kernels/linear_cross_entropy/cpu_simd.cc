// linear_cross_entropy CPU backend: SIMD row kernels (Highway, run-time dispatch).
// Each function handles any n: full vectors, then one masked tail vector through a padded
// stack buffer, so tails take the same code path (and the same rounding) as the body.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/linear_cross_entropy/cpu_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/linear_cross_entropy/cpu_simd.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::linear_cross_entropy::cpu_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

template <class F>
HWY_INLINE void for_each_vec(float* z, int64_t n, const float* aux, F&& f) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    auto v = hn::LoadU(df, z + i);
    auto a = aux ? hn::LoadU(df, aux + i) : hn::Zero(df);
    hn::StoreU(f(v, a), df, z + i);
  }
  if (i < n) {
    HWY_ALIGN float buf[hn::MaxLanes(df)] = {};
    HWY_ALIGN float abuf[hn::MaxLanes(df)] = {};
    for (int64_t k = 0; k < n - i; ++k) {
      buf[k] = z[i + k];
      if (aux) abuf[k] = aux[i + k];
    }
    hn::Store(f(hn::Load(df, buf), hn::Load(df, abuf)), df, buf);
    for (int64_t k = 0; k < n - i; ++k) z[i + k] = buf[k];
  }
}

void BiasSoftcap(float* z, int64_t n, const float* bias, float cap) {
  const DF df;
  if (cap > 0.0f) {
    const auto c = hn::Set(df, cap);
    const auto inv_c = hn::Set(df, 1.0f / cap);
    for_each_vec(z, n, bias, [&](auto v, auto b) {
      return hn::Mul(c, hn::Tanh(df, hn::Mul(hn::Add(v, b), inv_c)));
    });
  } else if (bias) {
    for_each_vec(z, n, bias, [&](auto v, auto b) { return hn::Add(v, b); });
  }
}

// The max over the non-NaN values, from −inf (an all −inf tile gives −inf, a value it holds);
// *poisoned: some z is NaN or +inf (x86 max drops a NaN operand, so the max alone cannot say).
float MaxValue(const float* z, int64_t n, bool* poisoned) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto inf = hn::Set(df, std::numeric_limits<float>::infinity());
  auto m0 = hn::Set(df, -std::numeric_limits<float>::infinity());
  auto m1 = m0;
  auto bad = hn::FirstN(df, 0);
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto a = hn::LoadU(df, z + i), b = hn::LoadU(df, z + i + N);
    m0 = hn::Max(m0, a);
    m1 = hn::Max(m1, b);
    bad = hn::Or(bad, hn::Or(hn::Not(hn::Lt(a, inf)), hn::Not(hn::Lt(b, inf))));  // NaN, +inf: not < inf
  }
  for (; i + N <= n; i += N) {
    const auto a = hn::LoadU(df, z + i);
    m0 = hn::Max(m0, a);
    bad = hn::Or(bad, hn::Not(hn::Lt(a, inf)));
  }
  float m = hn::GetLane(hn::MaxOfLanes(df, hn::Max(m0, m1)));
  bool any = !hn::AllFalse(df, bad);
  for (; i < n; ++i) {
    any |= !(z[i] < std::numeric_limits<float>::infinity());
    m = z[i] > m ? z[i] : m;
  }
  *poisoned = any;
  return m;
}

// kSigma: a compile-time switch, so that the plain path (no class weights) is the loop it was.
template <bool kSigma>
HWY_INLINE void SumExpT(const float* z, int64_t n, float m, const float* sigma, float* sum_exp, float* sum_z) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto vm = hn::Set(df, m);
  const auto one = hn::Set(df, 1.0f);
  auto sig = [&](int64_t i) { return kSigma ? hn::LoadU(df, sigma + i) : one; };
  auto s0 = hn::Zero(df), s1 = hn::Zero(df), t0 = hn::Zero(df), t1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto a = hn::LoadU(df, z + i);
    const auto b = hn::LoadU(df, z + i + N);
    s0 = hn::Add(s0, hn::Exp(df, hn::Sub(a, vm)));
    s1 = hn::Add(s1, hn::Exp(df, hn::Sub(b, vm)));
    t0 = kSigma ? hn::MulAdd(sig(i), a, t0) : hn::Add(t0, a);
    t1 = kSigma ? hn::MulAdd(sig(i + N), b, t1) : hn::Add(t1, b);
  }
  for (; i + N <= n; i += N) {
    const auto a = hn::LoadU(df, z + i);
    s0 = hn::Add(s0, hn::Exp(df, hn::Sub(a, vm)));
    t0 = kSigma ? hn::MulAdd(sig(i), a, t0) : hn::Add(t0, a);
  }
  if (i < n) {
    HWY_ALIGN float buf[hn::MaxLanes(df)] = {};
    HWY_ALIGN float sbuf[hn::MaxLanes(df)] = {};
    for (int64_t k = 0; k < n - i; ++k) {
      buf[k] = z[i + k];
      sbuf[k] = kSigma ? sigma[i + k] : 1.0f;
    }
    const auto mask = hn::FirstN(df, static_cast<size_t>(n - i));
    const auto a = hn::Load(df, buf);
    s1 = hn::Add(s1, hn::IfThenElseZero(mask, hn::Exp(df, hn::Sub(a, vm))));
    t1 = kSigma ? hn::MulAdd(hn::Load(df, sbuf), a, t1) : hn::Add(t1, a);  // padding is 0
  }
  *sum_exp = hn::GetLane(hn::SumOfLanes(df, hn::Add(s0, s1)));
  *sum_z = hn::GetLane(hn::SumOfLanes(df, hn::Add(t0, t1)));
}

void SumExp(const float* z, int64_t n, float m, const float* sigma, float* sum_exp, float* sum_z) {
  if (sigma)
    SumExpT<true>(z, n, m, sigma, sum_exp, sum_z);
  else
    SumExpT<false>(z, n, m, sigma, sum_exp, sum_z);
}

template <bool kSigma>
HWY_INLINE void SoftmaxGradT(float* z, int64_t n, float lse, float coef, float offset, const float* sigma,
                             float scale, float cap) {
  const DF df;
  const auto vl = hn::Set(df, lse);
  const auto vc = hn::Set(df, coef);
  const auto vo = hn::Set(df, offset);
  const auto vs = hn::Set(df, scale);
  // sigma rides in for_each_vec's aux lane (zero when null, so the offset is selected instead).
  auto off = [&](auto s) { return kSigma ? hn::Mul(vo, s) : vo; };
  // p = exp(z − lse), NaN where z − lse is (Highway's Exp returns 0 there): a NaN logit or lse
  // reaches the gradient, as in the reference.
  auto prob = [&](auto v) {
    const auto a = hn::Sub(v, vl);
    return hn::IfThenElse(hn::IsNaN(a), a, hn::Exp(df, a));
  };
  if (cap > 0.0f) {
    const auto inv_c = hn::Set(df, 1.0f / cap);
    const auto one = hn::Set(df, 1.0f);
    for_each_vec(z, n, sigma, [&](auto v, auto s) {
      const auto g = hn::Mul(vs, hn::MulSub(vc, prob(v), off(s)));
      const auto r = hn::Mul(v, inv_c);
      return hn::Mul(g, hn::NegMulAdd(r, r, one));  // g * (1 - r^2)
    });
  } else {
    for_each_vec(z, n, sigma, [&](auto v, auto s) {
      return hn::Mul(vs, hn::MulSub(vc, prob(v), off(s)));
    });
  }
}

void SoftmaxGrad(float* z, int64_t n, float lse, float coef, float offset, const float* sigma, float scale,
                 float cap) {
  if (sigma)
    SoftmaxGradT<true>(z, n, lse, coef, offset, sigma, scale, cap);
  else
    SoftmaxGradT<false>(z, n, lse, coef, offset, sigma, scale, cap);
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::linear_cross_entropy::cpu_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::linear_cross_entropy::cpu_simd {

HWY_EXPORT(BiasSoftcap);
HWY_EXPORT(MaxValue);
HWY_EXPORT(SumExp);
HWY_EXPORT(SoftmaxGrad);

void bias_softcap(float* z, int64_t n, const float* bias, float cap) {
  HWY_DYNAMIC_DISPATCH(BiasSoftcap)(z, n, bias, cap);
}
float max_value(const float* z, int64_t n, bool* poisoned) { return HWY_DYNAMIC_DISPATCH(MaxValue)(z, n, poisoned); }
void sum_exp(const float* z, int64_t n, float m, const float* sigma, float* sum_exp, float* sum_z) {
  HWY_DYNAMIC_DISPATCH(SumExp)(z, n, m, sigma, sum_exp, sum_z);
}
void softmax_grad(float* z, int64_t n, float lse, float coef, float offset, const float* sigma, float scale,
                  float cap) {
  HWY_DYNAMIC_DISPATCH(SoftmaxGrad)(z, n, lse, coef, offset, sigma, scale, cap);
}

}  // namespace tessera::linear_cross_entropy::cpu_simd
#endif  // HWY_ONCE
