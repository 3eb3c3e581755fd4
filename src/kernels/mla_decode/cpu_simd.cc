// mla_decode cpu: the online softmax's row operations on whole vectors (Highway, run-time
// dispatch): the running max and exp(s − m) with its sum (cpu_stages.h).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/mla_decode/cpu_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/mla_decode/cpu_stages.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::mla_decode::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

float RowMax(const float* s, int64_t n, float init) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto mx = hn::Set(df, init);
  int64_t j = 0;
  for (; j + N <= n; j += N) mx = hn::Max(mx, hn::LoadU(df, s + j));
  float m = hn::GetLane(hn::MaxOfLanes(df, mx));
  for (; j < n; ++j) m = std::max(m, s[j]);
  return m;
}

float ExpShifted(float* s, int64_t n, float m) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto vm = hn::Set(df, m);
  auto acc = hn::Zero(df);
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    const auto p = hn::Exp(df, hn::Sub(hn::LoadU(df, s + j), vm));
    hn::StoreU(p, df, s + j);
    acc = hn::Add(acc, p);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
  return sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::mla_decode::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::mla_decode::cpu {
HWY_EXPORT(RowMax);
HWY_EXPORT(ExpShifted);

float row_max(const float* s, int64_t n, float init) { return HWY_DYNAMIC_DISPATCH(RowMax)(s, n, init); }
float exp_shifted(float* s, int64_t n, float m) { return HWY_DYNAMIC_DISPATCH(ExpShifted)(s, n, m); }
}  // namespace tessera::mla_decode::cpu
#endif
