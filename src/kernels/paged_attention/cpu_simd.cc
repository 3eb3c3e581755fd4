// paged_attention CPU backend: SIMD tile routines (Highway, run-time dispatch). See cpu_simd.h.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/paged_attention/cpu_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/paged_attention/cpu_simd.h"
#include "primitives/cpu_convert.h"
#include "tessera/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::paged_attention::cpu_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

HWY_INLINE float Sum(DF df, hn::Vec<DF> v) { return hn::GetLane(hn::SumOfLanes(df, v)); }

void Scores(const float* Q, int64_t ldq, int64_t R, const float* K, int64_t ldk, int64_t n, int64_t D, float* S,
            int64_t lds) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), Dv = D / N * N;
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) {
    const float *q0 = Q + r * ldq, *q1 = q0 + ldq, *q2 = q1 + ldq, *q3 = q2 + ldq;
    for (int64_t j = 0; j < n; ++j) {
      const float* k = K + j * ldk;
      auto a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t d = 0; d < Dv; d += N) {
        const auto kv = hn::LoadU(df, k + d);
        a0 = hn::MulAdd(hn::LoadU(df, q0 + d), kv, a0);
        a1 = hn::MulAdd(hn::LoadU(df, q1 + d), kv, a1);
        a2 = hn::MulAdd(hn::LoadU(df, q2 + d), kv, a2);
        a3 = hn::MulAdd(hn::LoadU(df, q3 + d), kv, a3);
      }
      float s0 = Sum(df, a0), s1 = Sum(df, a1), s2 = Sum(df, a2), s3 = Sum(df, a3);
      for (int64_t d = Dv; d < D; ++d) s0 += q0[d] * k[d], s1 += q1[d] * k[d], s2 += q2[d] * k[d], s3 += q3[d] * k[d];
      S[r * lds + j] = s0, S[(r + 1) * lds + j] = s1, S[(r + 2) * lds + j] = s2, S[(r + 3) * lds + j] = s3;
    }
  }
  for (; r < R; ++r) {
    const float* q = Q + r * ldq;
    for (int64_t j = 0; j < n; ++j) {
      const float* k = K + j * ldk;
      auto a = hn::Zero(df);
      for (int64_t d = 0; d < Dv; d += N) a = hn::MulAdd(hn::LoadU(df, q + d), hn::LoadU(df, k + d), a);
      float s = Sum(df, a);
      for (int64_t d = Dv; d < D; ++d) s += q[d] * k[d];
      S[r * lds + j] = s;
    }
  }
}

void OnlineSoftmax(float* S, int64_t R, int64_t n, int64_t lds, float* m, float* l, float* alpha) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), nv = n / N * N;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < R; ++r) {
    float* s = S + r * lds;
    // NaN propagates (a NaN logit or sink makes the row NaN, as in the reference); only −inf
    // (masked) weighs 0.
    auto vmax = hn::Set(df, m[r]), vnan = hn::Zero(df);
    for (int64_t j = 0; j < nv; j += N) {
      const auto x = hn::LoadU(df, s + j);
      vmax = hn::Max(vmax, x);
      vnan = hn::Or(vnan, hn::VecFromMask(df, hn::IsNaN(x)));
    }
    float mt = hn::GetLane(hn::MaxOfLanes(df, vmax));
    bool nan = !hn::AllFalse(df, hn::MaskFromVec(vnan)) || std::isnan(m[r]);
    for (int64_t j = nv; j < n; ++j) mt = std::max(mt, s[j]), nan = nan || std::isnan(s[j]);
    const float mnew = nan ? std::numeric_limits<float>::quiet_NaN() : mt;
    if (mnew == ninf) {  // nothing seen yet
      std::fill(s, s + n, 0.0f);
      alpha[r] = 1.0f;
      continue;
    }
    const auto vm = hn::Set(df, mnew), vninf = hn::Set(df, ninf);
    auto acc = hn::Zero(df);
    int64_t j = 0;
    for (; j < nv; j += N) {
      const auto x = hn::LoadU(df, s + j);
      const auto p = hn::IfThenElseZero(hn::Ne(x, vninf), hn::Exp(df, hn::Sub(x, vm)));
      hn::StoreU(p, df, s + j);
      acc = hn::Add(acc, p);
    }
    float sum = Sum(df, acc);
    for (; j < n; ++j) {
      s[j] = s[j] == ninf ? 0.0f : std::exp(s[j] - mnew);
      sum += s[j];
    }
    const float a = m[r] == ninf ? 0.0f : std::exp(m[r] - mnew);
    l[r] = l[r] * a + sum;
    alpha[r] = a;
    m[r] = mnew;
  }
}

void Accumulate(const float* P, int64_t ldp, int64_t R, const float* V, int64_t ldv, int64_t n, int64_t Dv,
                const float* alpha, float* O, int64_t ldo) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), dv = Dv / N * N;
  for (int64_t r = 0; r < R; ++r) {
    float* o = O + r * ldo;
    const float* p = P + r * ldp;
    if (alpha[r] != 1.0f)
      for (int64_t d = 0; d < Dv; ++d) o[d] *= alpha[r];
    int64_t d = 0;
    for (; d + 2 * N <= dv; d += 2 * N) {
      auto a0 = hn::LoadU(df, o + d), a1 = hn::LoadU(df, o + d + N);
      for (int64_t j = 0; j < n; ++j) {
        const auto pj = hn::Set(df, p[j]);
        a0 = hn::MulAdd(pj, hn::LoadU(df, V + j * ldv + d), a0);
        a1 = hn::MulAdd(pj, hn::LoadU(df, V + j * ldv + d + N), a1);
      }
      hn::StoreU(a0, df, o + d), hn::StoreU(a1, df, o + d + N);
    }
    for (; d < dv; d += N) {
      auto a0 = hn::LoadU(df, o + d);
      for (int64_t j = 0; j < n; ++j) a0 = hn::MulAdd(hn::Set(df, p[j]), hn::LoadU(df, V + j * ldv + d), a0);
      hn::StoreU(a0, df, o + d);
    }
    for (; d < Dv; ++d) {
      float a = o[d];
      for (int64_t j = 0; j < n; ++j) a += p[j] * V[j * ldv + d];
      o[d] = a;
    }
  }
}

template <class D>
HWY_INLINE hn::Vec<D> Widen(D df, const uint16_t* src, bool bf16) {
  if (bf16) {
    const hn::RebindToUnsigned<D> du32;
    const hn::Rebind<uint16_t, D> du16;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, src))));
  }
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(src)));
}

void GatherRows(const void* src, int kind, int64_t n, int64_t heads, int64_t width, int64_t row_stride, float* dst) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), wv = width / N * N;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < n; ++j) {
      float* out = dst + (h * n + j) * width;
      const int64_t at = j * row_stride + h * width;
      if (kind == 0) {
        const float* in = static_cast<const float*>(src) + at;
        for (int64_t d = 0; d < wv; d += N) hn::StoreU(hn::LoadU(df, in + d), df, out + d);
        for (int64_t d = wv; d < width; ++d) out[d] = in[d];
        continue;
      }
      if (kind == 3) {  // f8e4m3: the shared table conversion
        cpu_convert::f8e4m3_to_f32(static_cast<const uint8_t*>(src) + at, out, width);
        continue;
      }
      const uint16_t* in = static_cast<const uint16_t*>(src) + at;
      for (int64_t d = 0; d < wv; d += N) hn::StoreU(Widen(df, in + d, kind == 1), df, out + d);
      for (int64_t d = wv; d < width; ++d) out[d] = load_as_f32(in, kind == 1 ? DType::kBF16 : DType::kF16, d);
    }
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::paged_attention::cpu_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::paged_attention::cpu_simd {

HWY_EXPORT(Scores);
HWY_EXPORT(OnlineSoftmax);
HWY_EXPORT(Accumulate);
HWY_EXPORT(GatherRows);

void gather_rows(const void* src, int kind, int64_t n, int64_t heads, int64_t width, int64_t row_stride, float* dst) {
  HWY_DYNAMIC_DISPATCH(GatherRows)(src, kind, n, heads, width, row_stride, dst);
}

void scores(const float* Q, int64_t ldq, int64_t R, const float* K, int64_t ldk, int64_t n, int64_t D, float* S,
            int64_t lds) {
  HWY_DYNAMIC_DISPATCH(Scores)(Q, ldq, R, K, ldk, n, D, S, lds);
}
void online_softmax(float* S, int64_t R, int64_t n, int64_t lds, float* m, float* l, float* alpha) {
  HWY_DYNAMIC_DISPATCH(OnlineSoftmax)(S, R, n, lds, m, l, alpha);
}
void accumulate(const float* P, int64_t ldp, int64_t R, const float* V, int64_t ldv, int64_t n, int64_t Dv,
                const float* alpha, float* O, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(Accumulate)(P, ldp, R, V, ldv, n, Dv, alpha, O, ldo);
}

}  // namespace tessera::paged_attention::cpu_simd
#endif  // HWY_ONCE
