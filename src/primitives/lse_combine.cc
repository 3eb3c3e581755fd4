#include "primitives/lse_combine.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tessera::primitives {

void lse_combine_row(int64_t splits, int64_t dv, const float* o_partial, int64_t o_stride,
                     const float* lse_partial, float* o, float* lse) {
  const float ninf = -std::numeric_limits<float>::infinity();
  float m = ninf;
  bool nan = false;
  for (int64_t s = 0; s < splits; ++s) {
    nan |= std::isnan(lse_partial[s]);
    m = std::max(m, lse_partial[s]);
  }
  std::fill(o, o + dv, 0.0f);
  if (nan || m == ninf) {  // NaN propagates; no key anywhere: o = 0, lse = -inf
    *lse = nan ? std::numeric_limits<float>::quiet_NaN() : ninf;
    if (nan) std::fill(o, o + dv, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  float total = 0.0f;
  for (int64_t s = 0; s < splits; ++s) total += std::exp(lse_partial[s] - m);  // exp(-inf) = 0
  for (int64_t s = 0; s < splits; ++s) {
    const float w = std::exp(lse_partial[s] - m) / total;
    if (w == 0.0f) continue;  // also skips a partial whose o holds garbage because it saw nothing
    const float* os = o_partial + s * o_stride;
    for (int64_t j = 0; j < dv; ++j) o[j] += w * os[j];
  }
  *lse = m + std::log(total);
}

}  // namespace tessera::primitives
