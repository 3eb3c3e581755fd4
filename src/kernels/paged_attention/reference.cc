// paged_attention: the reference — the oracle. Per query row and head, the visible keys are
// gathered from their pages one by one and the softmax is done in double with plain loops.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/paged_attention/impl.h"
#include "tessera/error.h"

namespace tessera::paged_attention {
namespace {

void row(const Problem& p, int64_t s, int64_t t, int64_t h, int64_t pos) {
  const int64_t g = h / p.group();
  std::vector<double> x;     // logits of the visible keys
  std::vector<int64_t> at;   // their cache rows
  for (int64_t j = p.key_lo(pos); j < p.key_hi(s, pos); ++j) {
    const int64_t r = p.cache_row(s, j);
    double dot = 0.0;
    for (int64_t d = 0; d < p.D; ++d)
      dot += static_cast<double>(load_as_f32(p.q, p.dtype, (t * p.Hq + h) * p.D + d)) *
             load_as_f32(p.k, p.cache_dtype, (r * p.Hkv + g) * p.D + d);
    double xj = p.scale * dot;
    if (p.softcap > 0.0) xj = p.softcap * std::tanh(xj / p.softcap);
    x.push_back(xj);
    at.push_back(r);
  }
  const double neg_inf = -std::numeric_limits<double>::infinity();
  double m = p.sinks ? static_cast<double>(p.sinks[h]) : neg_inf;
  for (double xj : x) m = std::max(m, xj);
  std::vector<double> o(static_cast<size_t>(p.Dv), 0.0);
  double lse = neg_inf;
  if (m != neg_inf) {
    double sum = p.sinks ? std::exp(p.sinks[h] - m) : 0.0;
    for (double xj : x) sum += std::exp(xj - m);
    lse = m + std::log(sum);
    for (size_t i = 0; i < x.size(); ++i) {
      const double w = std::exp(x[i] - lse);
      for (int64_t d = 0; d < p.Dv; ++d)
        o[static_cast<size_t>(d)] += w * p.v_scale * load_as_f32(p.v, p.cache_dtype, (at[i] * p.Hkv + g) * p.Dv + d);
    }
  }
  const DType od = p.o_f32 ? DType::kF32 : p.dtype;
  for (int64_t d = 0; d < p.Dv; ++d) store_from_f32(p.o, od, (t * p.Hq + h) * p.Dv + d, static_cast<float>(o[static_cast<size_t>(d)]));
  p.lse[t * p.Hq + h] = static_cast<float>(lse);
}

class Reference final : public Implementation {
 public:
  std::string name() const override { return "reference"; }
  std::string description() const override { return "per token: gather the visible keys from the pages, softmax in double"; }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU) return Availability::no("the reference runs on host memory");
    return Availability::yes();
  }
  void forward(const Problem& p) const override {
    for (int64_t s = 0; s < p.N; ++s)
      for (int64_t i = 0; i < p.q_len(s); ++i) {
        const int64_t t = p.cu_q[s] + i, pos = p.kv_len(s) - p.q_len(s) + i;
        for (int64_t h = 0; h < p.Hq; ++h) row(p, s, t, h, pos);
      }
  }
};

}  // namespace

std::unique_ptr<Implementation> make_reference_implementation() { return std::make_unique<Reference>(); }

}  // namespace tessera::paged_attention
