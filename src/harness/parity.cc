#include "harness/parity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tessera::harness {

std::string Deviation::str() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "max_abs=%.3g mean_abs=%.3g max_rel=%.3g mean_rel=%.3g (n=%lld, scale=%.3g, %lld outside tol%s)",
                max_abs, mean_abs, max_rel, mean_rel, static_cast<long long>(n), ref_scale,
                static_cast<long long>(violations), nonfinite ? ", NON-FINITE" : "");
  return buf;
}

std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[static_cast<size_t>(i)] = is_float(t.dtype()) ? load_as_f32(t.data(), t.dtype(), i)
                                                    : static_cast<double>(load_as_i64(t.data(), t.dtype(), i));
  return v;
}

Tensor nan_filled(DType dtype, const Shape& shape) {
  Tensor x = Tensor::empty(dtype, shape);
  for (int64_t i = 0; i < x.numel(); ++i) store_from_f32(x.data(), dtype, i, NAN);
  return x;
}

Deviation compare(const std::vector<double>& got, const std::vector<double>& want, Tolerance tol) {
  Deviation d;
  d.n = static_cast<int64_t>(std::min(got.size(), want.size()));
  if (got.size() != want.size()) d.violations += static_cast<int64_t>(got.size() > want.size() ? got.size() - want.size() : want.size() - got.size());
  // The scale of the finite expected values only: an expected −inf (a row that sees nothing)
  // must not make every tolerance infinite.
  for (int64_t i = 0; i < d.n; ++i)
    if (std::isfinite(want[i])) d.ref_scale = std::max(d.ref_scale, std::fabs(want[i]));
  const double atol = tol.atol_scale * d.ref_scale;
  const double tiny = 1e-30;
  double worst_excess = -1.0;
  for (int64_t i = 0; i < d.n; ++i) {
    const double g = got[i], w = want[i];
    if (!std::isfinite(w)) {  // a non-finite expected value is matched only by the same one
      const bool same = (std::isnan(w) && std::isnan(g)) || g == w;
      if (!same) {
        ++d.violations;
        if (worst_excess < INFINITY) {
          worst_excess = INFINITY;
          d.worst = i;
          d.worst_got = g;
          d.worst_want = w;
        }
      }
      continue;
    }
    if (!std::isfinite(g)) {
      ++d.nonfinite;
      if (worst_excess < INFINITY) {
        worst_excess = INFINITY;
        d.worst = i;
        d.worst_got = g;
        d.worst_want = w;
      }
      continue;
    }
    const double a = std::fabs(g - w);
    const double r = a / std::max(std::fabs(w), tiny);
    d.max_abs = std::max(d.max_abs, a);
    d.mean_abs += a;
    d.max_rel = std::max(d.max_rel, r);
    d.mean_rel += r;
    const double limit = atol + tol.rtol * std::fabs(w);
    if (a > limit) ++d.violations;
    if (a - limit > worst_excess) {
      worst_excess = a - limit;
      d.worst = i;
      d.worst_got = g;
      d.worst_want = w;
    }
  }
  if (d.n > 0) {
    d.mean_abs /= static_cast<double>(d.n);
    d.mean_rel /= static_cast<double>(d.n);
  }
  return d;
}

bool ParityReport::ok() const {
  if (!ran) return false;
  for (const auto& f : fields)
    if (!f.dev.ok()) return false;
  return true;
}

Deviation ParityReport::worst() const {
  Deviation w;
  for (const auto& f : fields) {
    w.max_abs = std::max(w.max_abs, f.dev.max_abs);
    w.mean_abs = std::max(w.mean_abs, f.dev.mean_abs);
    w.max_rel = std::max(w.max_rel, f.dev.max_rel);
    w.mean_rel = std::max(w.mean_rel, f.dev.mean_rel);
    w.violations += f.dev.violations;
    w.nonfinite += f.dev.nonfinite;
  }
  return w;
}

}  // namespace tessera::harness
