#include "tune/verify.h"

#include <cmath>
#include <cstdio>

#include "tessera/dtype.h"
#include "tessera/error.h"

namespace tessera::tune {
namespace {

Tensor on_host(const Tensor& t) { return t.device().type == DeviceType::kCPU ? t : t.to(Device::cpu()); }

// Element i as a double (float dtypes through f32, integers exactly up to 2^53).
double load(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kI32: return static_cast<const int32_t*>(t.data())[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(t.data())[i]);
    default: return load_as_f32(t.data(), t.dtype(), i);
  }
}

double max_finite_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = std::fabs(load(t, i));
    if (std::isfinite(v) && v > m) m = v;
  }
  return m;
}

// |got - want|, where non-finite values match only themselves.
double deviation(double got, double want) {
  if (std::isfinite(want)) return std::isfinite(got) ? std::fabs(got - want) : INFINITY;
  const bool same = (std::isnan(got) && std::isnan(want)) || got == want;
  return same ? 0 : INFINITY;
}

// How far past its tolerance a deviation is (> 1: wrong), for picking the worst output.
double excess(const OutputDeviation& d) {
  if (d.max_abs <= 0) return 0;
  return d.tolerance > 0 ? d.max_abs / d.tolerance : INFINITY;
}

}  // namespace

double default_rtol(DType dtype) noexcept {
  switch (dtype) {
    case DType::kF32: return 1e-4;
    case DType::kBF16: return 1.0 / 64;   // 2^-6: two last-bit flips of the largest value
    case DType::kF16: return 1.0 / 512;   // 2^-9: the same for f16
    default: return 0;                    // integers: exact
  }
}

std::string OutputDeviation::str() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: max |dev| %.3g at [%lld] (got %.6g, want %.6g) %s tolerance %.3g",
                output.c_str(), max_abs, static_cast<long long>(index), got, want, ok() ? "<=" : ">", tolerance);
  return buf;
}

void OutputCheck::prepare() const {
  for (const Output& o : outputs_()) zero_fill(o.tensor.view());
}

void OutputCheck::take_reference() {
  ref_.clear();
  for (const Output& o : outputs_()) {
    Tensor host = o.tensor.to(Device::cpu());  // a deep copy, also on the host
    const double tol = (o.rtol > 0 ? o.rtol : default_rtol(host.dtype())) * max_finite_abs(host);
    ref_.push_back({o.name, std::move(host), tol});
  }
}

OutputDeviation OutputCheck::compare() const {
  const std::vector<Output> outs = outputs_();
  check(outs.size() == ref_.size(), ErrorCode::kInternal, "tune: the outputs changed between candidates");
  OutputDeviation worst;
  for (size_t k = 0; k < outs.size(); ++k) {
    const Ref& r = ref_[k];
    const Tensor got = on_host(outs[k].tensor);
    check(outs[k].name == r.name && got.dtype() == r.host.dtype() && got.numel() == r.host.numel() &&
              got.view().is_contiguous(),
          ErrorCode::kInternal, "tune: output " + outs[k].name + " changed between candidates");
    OutputDeviation d;
    d.output = r.name;
    d.tolerance = r.tolerance;
    for (int64_t i = 0; i < got.numel(); ++i) {
      const double g = load(got, i), w = load(r.host, i), dev = deviation(g, w);
      if (dev > d.max_abs || d.index < 0) d.max_abs = dev, d.index = i, d.got = g, d.want = w;
    }
    if (worst.output.empty() || excess(d) > excess(worst)) worst = d;
  }
  return worst;
}

}  // namespace tessera::tune
