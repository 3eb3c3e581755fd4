#include "kernels/linear_cross_entropy/cpu_rows.h"

#include <cmath>

#include "kernels/linear_cross_entropy/cpu_simd.h"

namespace tessera::linear_cross_entropy::cpu_rows {

void class_weighted_grad(const Problem& p, int64_t t, double lse, float up, int64_t v0, int64_t n, float* z) {
  const GradCoefs g = grad_coefs(p, t, lse);
  const double cap = p.softcap;
  const int64_t y = p.label(t);
  const bool has_y = y >= v0 && y < v0 + n;
  const double zy = has_y ? z[y - v0] : 0.0;
  cpu_simd::softmax_grad(z, n, static_cast<float>(lse), static_cast<float>(g.coef), static_cast<float>(g.offset),
                         p.class_weights + v0, up, static_cast<float>(cap));
  if (!has_y) return;
  // coef·p_y − offset·σ_y − label, with the label part w(1−ε)·(p_y − 1) kept exact:
  //   coef·p_y − label = w(1−ε)·(p_y − 1) + (coef − w(1−ε))·p_y.
  const double py_m1 = std::expm1(zy - lse), py = py_m1 + 1.0;
  double d = g.label * py_m1 + (g.coef - g.label) * py - g.offset * static_cast<double>(p.class_weights[y]);
  d *= static_cast<double>(up);
  if (cap > 0.0) d *= 1.0 - (zy / cap) * (zy / cap);
  z[y - v0] = static_cast<float>(d);
}

void row_stats(const Problem& p, const float* biasf, bool need_stats, RowPartial& s, float* z, int64_t n,
               int64_t v0, int64_t t) {
  cpu_simd::bias_softcap(z, n, biasf ? biasf + v0 : nullptr, static_cast<float>(p.softcap));
  if (!need_stats) return;
  bool poisoned = false;
  const float tm = cpu_simd::max_value(z, n, &poisoned);
  s.poisoned |= poisoned;
  if (tm > s.m) {  // tm is then one of the z (the max starts at −inf, as s.m)
    if (p.want_argmax) {
      int64_t k = 0;
      while (k + 1 < n && z[k] != tm) ++k;
      s.amax = v0 + k;
    }
    s.s *= std::exp(static_cast<double>(s.m) - static_cast<double>(tm));  // exp(−inf) = 0
    s.m = tm;
  }
  float se = 0.0f, sz = 0.0f;
  cpu_simd::sum_exp(z, n, s.m, p.class_weights ? p.class_weights + v0 : nullptr, &se, &sz);
  s.s += se;
  s.sumz += sz;
  const int64_t y = p.label(t);
  if (y >= v0 && y < v0 + n) s.zy = z[y - v0];
}

}  // namespace tessera::linear_cross_entropy::cpu_rows
