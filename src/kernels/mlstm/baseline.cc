// mlstm: the bench's baseline, the parallel (quadratic) form through the BLAS, per head:
// D [S, S] = cum_t − cum_s + i_s (s ≤ t), m_t = max(cum_t, max_s D_ts) (the zero initial state's
// m = 0 decayed), P = (Q̂Kᵀ) ∘ e^{D − m}, h = P·V / (max(|rowsum P|, e^{−m}) + eps): two S×S sgemms,
// S² floats of memory per head. f32 host inputs in the kernel's layout; h is thrown away.
#include <algorithm>
#include <cmath>
#include <vector>

#include "harness/blas.h"
#include "tessera/tensor.h"

namespace tessera::mlstm {

void quadratic_baseline(const Tensor& Q, const Tensor& K, const Tensor& V, const Tensor& I, const Tensor& F) {
  const int64_t heads = Q.shape()[0] * Q.shape()[1], S = Q.shape()[2], DK = Q.shape()[3], DV = V.shape()[3];
  std::vector<float> P(size_t(S * S)), qs(size_t(S * DK)), h(size_t(S * DV));
  std::vector<double> cum(static_cast<size_t>(S)), m(static_cast<size_t>(S));
  for (int64_t bh = 0; bh < heads; ++bh) {
    const float *q = Q.data_as<float>() + bh * S * DK, *k = K.data_as<float>() + bh * S * DK;
    const float *v = V.data_as<float>() + bh * S * DV, *ig = I.data_as<float>() + bh * S, *fg = F.data_as<float>() + bh * S;
    double acc = 0.0;
    for (int64_t t = 0; t < S; ++t) {
      acc += std::min(double(fg[t]), 0.0) - std::log1p(std::exp(-std::fabs(double(fg[t]))));
      cum[size_t(t)] = acc;
    }
    for (int64_t j = 0; j < S * DK; ++j) qs[size_t(j)] = q[j] / std::sqrt(float(DK));
    harness::blas::sgemm(false, true, S, S, DK, 1.f, qs.data(), DK, k, DK, 0.f, P.data(), S);
    for (int64_t t = 0; t < S; ++t) {
      double mt = cum[size_t(t)];
      for (int64_t s = 0; s <= t; ++s) mt = std::max(mt, cum[size_t(t)] - cum[size_t(s)] + ig[s]);
      m[size_t(t)] = mt;
      for (int64_t s = 0; s < S; ++s)
        P[size_t(t * S + s)] *= s <= t ? float(std::exp(cum[size_t(t)] - cum[size_t(s)] + ig[s] - mt)) : 0.f;
    }
    harness::blas::sgemm(false, false, S, DV, S, 1.f, P.data(), S, v, DV, 0.f, h.data(), DV);
    for (int64_t t = 0; t < S; ++t) {
      float den = 0.f;
      for (int64_t s = 0; s <= t; ++s) den += P[size_t(t * S + s)];
      den = std::max(std::fabs(den), float(std::exp(-m[size_t(t)]))) + 1e-6f;
      for (int64_t y = 0; y < DV; ++y) h[size_t(t * DV + y)] /= den;
    }
  }
}

}  // namespace tessera::mlstm
