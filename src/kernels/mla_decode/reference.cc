// mla_decode: the reference — the oracle. Per query row: gather the visible cached entries,
// softmax and weighted sum in double. Plain loops, obviously correct.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/mla_decode/impl.h"

namespace tessera::mla_decode {
namespace {

void reference_row(const Problem& p, int64_t b, int64_t i, int64_t h) {
  const int64_t row = (b * p.Sq + i) * p.Hq + h;
  const int64_t n = p.visible(b, i);
  std::vector<double> s(static_cast<size_t>(n));
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t e = p.entry(b, j);
    double dot = 0.0;
    for (int64_t d = 0; d < p.D; ++d)
      dot += static_cast<double>(load_as_f32(p.q, p.dtype, row * p.D + d)) * load_as_f32(p.kv, p.cache_dtype, e + d);
    s[static_cast<size_t>(j)] = p.scale * dot;
    m = std::max(m, s[static_cast<size_t>(j)]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(s[static_cast<size_t>(j)] - m);
  const double lse = n == 0 ? -std::numeric_limits<double>::infinity() : m + std::log(sum);
  for (int64_t j = 0; j < n; ++j) s[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - lse);  // weights
  for (int64_t d = 0; d < p.Dv; ++d) {
    double acc = 0.0;
    for (int64_t j = 0; j < n; ++j)
      acc += s[static_cast<size_t>(j)] * p.v_scale * load_as_f32(p.kv, p.cache_dtype, p.entry(b, j) + d);
    store_from_f32(p.o, p.o_dtype, row * p.Dv + d, static_cast<float>(acc));
  }
  p.lse[row] = static_cast<float>(lse);
}

class Reference final : public Implementation {
 public:
  std::string name() const override { return "reference"; }
  std::string description() const override { return "per row: gather, softmax and sum in double; the oracle"; }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU) return Availability::no("the reference runs on host memory");
    return Availability::yes();
  }
  void forward(const Problem& p) const override {
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t i = 0; i < p.Sq; ++i)
        for (int64_t h = 0; h < p.Hq; ++h) reference_row(p, b, i, h);
  }
};

}  // namespace

std::unique_ptr<Implementation> make_reference_implementation() { return std::make_unique<Reference>(); }

}  // namespace tessera::mla_decode
