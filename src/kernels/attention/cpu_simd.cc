// attention CPU backend: SIMD tile kernels (Highway, run-time dispatch). See cpu_simd.h.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention/cpu_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/attention/cpu_simd.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::attention::cpu_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// exp(x) in f32 for x in (−inf, 88]: n = round(x·log2 e), r = x − n·ln2 (ln 2 split in a part
// exact in f32 and a correction, Cody–Waite), exp(r) = 1 + r + r²·P(r) with the Cephes expf
// polynomial (|r| <= ln2/2, relative error < 2 ulp), times 2^n built in the exponent bits.
// Exact 0 below −87.3 (so −inf, a masked score, gives 0); no NaN for any non-NaN input.
HWY_INLINE VF Exp(DF d, VF x) {
  const auto lo = hn::Set(d, -87.3f);
  auto xc = hn::Min(hn::Max(x, lo), hn::Set(d, 88.0f));
  const auto n = hn::Round(hn::Mul(xc, hn::Set(d, 1.44269504088896341f)));
  auto r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), xc);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  auto p = hn::Set(d, 1.9875691500E-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507E-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073E-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894E-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459E-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201E-1f));
  const auto y = hn::MulAdd(p, hn::Mul(r, r), hn::Add(r, hn::Set(d, 1.0f)));
  const hn::RebindToSigned<DF> di;
  const auto e = hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127)));
  return hn::IfThenZeroElse(hn::Lt(x, lo), hn::Mul(y, hn::BitCast(d, e)));
}

void PackB(const float* Mx, int64_t ld, bool trans, int64_t K, int64_t N, float* Bp, int64_t panel_rows, int64_t k0) {
  const DF df;
  const int64_t W = 2 * static_cast<int64_t>(hn::Lanes(df));
  for (int64_t p0 = 0; p0 < N; p0 += W) {
    float* dst = Bp + (p0 / W) * panel_rows * W + k0 * W;
    const int64_t w = std::min(W, N - p0);
    if (trans) {  // column c of the panel is row p0 + c of M, contiguous over k
      for (int64_t c = 0; c < w; ++c) {
        const float* src = Mx + (p0 + c) * ld;
        for (int64_t k = 0; k < K; ++k) dst[k * W + c] = src[k];
      }
      for (int64_t c = w; c < W; ++c)
        for (int64_t k = 0; k < K; ++k) dst[k * W + c] = 0.0f;
    } else {
      for (int64_t k = 0; k < K; ++k) {
        float* d = dst + k * W;
        const float* src = Mx + k * ld + p0;
        for (int64_t c = 0; c < w; ++c) d[c] = src[c];
        for (int64_t c = w; c < W; ++c) d[c] = 0.0f;
      }
    }
  }
}

template <int MR, bool TA>
HWY_INLINE void Micro(const float* A, int64_t lda, const float* Bp, int64_t K, float* C, int64_t ldc, int64_t w,
                      float alpha, bool acc) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> c0[MR], c1[MR];
  for (int r = 0; r < MR; ++r) c0[r] = c1[r] = hn::Zero(df);
  for (int64_t k = 0; k < K; ++k) {
    const auto b0 = hn::Load(df, Bp + k * 2 * N), b1 = hn::Load(df, Bp + k * 2 * N + N);
    for (int r = 0; r < MR; ++r) {
      const auto a = hn::Set(df, TA ? A[k * lda + r] : A[r * lda + k]);
      c0[r] = hn::MulAdd(a, b0, c0[r]);
      c1[r] = hn::MulAdd(a, b1, c1[r]);
    }
  }
  const auto va = hn::Set(df, alpha);
  for (int r = 0; r < MR; ++r) {
    float* c = C + r * ldc;
    if (w == 2 * N) {
      auto x0 = hn::Mul(va, c0[r]), x1 = hn::Mul(va, c1[r]);
      if (acc) {
        x0 = hn::Add(hn::LoadU(df, c), x0);
        x1 = hn::Add(hn::LoadU(df, c + N), x1);
      }
      hn::StoreU(x0, df, c);
      hn::StoreU(x1, df, c + N);
    } else {
      HWY_ALIGN float buf[2 * hn::MaxLanes(df)];
      hn::Store(hn::Mul(va, c0[r]), df, buf);
      hn::Store(hn::Mul(va, c1[r]), df, buf + N);
      for (int64_t j = 0; j < w; ++j) c[j] = acc ? c[j] + buf[j] : buf[j];
    }
  }
}

template <bool TA>
void GemmT(const float* A, int64_t lda, const float* Bp, int64_t panel_rows, int64_t k0, int64_t M, int64_t N,
           int64_t K, float* C, int64_t ldc, float alpha, bool acc) {
  const DF df;
  const int64_t W = 2 * static_cast<int64_t>(hn::Lanes(df));
  // Row offset i of op(A): A + i·lda (plain) or A + i (transposed).
  auto a_at = [&](int64_t i) { return TA ? A + i : A + i * lda; };
  for (int64_t p0 = 0; p0 < N; p0 += W) {
    const float* bp = Bp + (p0 / W) * panel_rows * W + k0 * W;
    const int64_t w = std::min(W, N - p0);
    int64_t i = 0;
    for (; i + 6 <= M; i += 6) Micro<6, TA>(a_at(i), lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc);
    switch (M - i) {
      case 5: Micro<5, TA>(a_at(i), lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc); break;
      case 4: Micro<4, TA>(a_at(i), lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc); break;
      case 3: Micro<3, TA>(a_at(i), lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc); break;
      case 2: Micro<2, TA>(a_at(i), lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc); break;
      case 1: Micro<1, TA>(a_at(i), lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc); break;
      default: break;
    }
  }
}

void GemmPacked(const float* A, int64_t lda, bool trans_a, const float* Bp, int64_t panel_rows, int64_t k0, int64_t M,
                int64_t N, int64_t K, float* C, int64_t ldc, float alpha, bool acc) {
  if (trans_a)
    GemmT<true>(A, lda, Bp, panel_rows, k0, M, N, K, C, ldc, alpha, acc);
  else
    GemmT<false>(A, lda, Bp, panel_rows, k0, M, N, K, C, ldc, alpha, acc);
}

// bf16(v) stored as Lanes(df) uint16 at dst (aligned with the f32 tile: ld is a multiple of
// kPad): the rounding of cpu_convert::f32_to_bf16 (u + 0x7fff + ((u >> 16) & 1), high half; a
// NaN keeps its high half with the quiet bit set).
HWY_INLINE void StoreBf16(DF, VF v, uint16_t* dst) {
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  const auto u = hn::BitCast(du, v);
  const auto rounded = hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
  const auto is_nan = hn::Gt(hn::And(u, hn::Set(du, 0x7fffffffu)), hn::Set(du, 0x7f800000u));
  const auto r = hn::ShiftRight<16>(hn::IfThenElse(is_nan, hn::Or(u, hn::Set(du, 0x00400000u)), rounded));
  hn::StoreU(hn::TruncateTo(d16, r), d16, dst);
}

// Number of floats processed per row: n rounded up to whole vectors (within the padding).
HWY_INLINE int64_t Cols(DF df, int64_t n) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  return (n + N - 1) / N * N;
}

void AddRows(float* S, int64_t rows, int64_t n, int64_t ld, const float* b, int64_t ldb) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = 0; r < rows; ++r) {
    float* s = S + r * ld;
    const float* br = b + r * ldb;
    int64_t j = 0;
    for (; j + N <= n; j += N) hn::Store(hn::Add(hn::Load(df, s + j), hn::LoadU(df, br + j)), df, s + j);
    for (; j < n; ++j) s[j] += br[j];  // the tail (this Highway has no LoadN)
  }
}

void Softcap(float* S, int64_t rows, int64_t n, int64_t ld, float c) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), cols = Cols(df, n);
  const auto vc = hn::Set(df, c), inv = hn::Set(df, 1.0f / c);
  for (int64_t r = 0; r < rows; ++r) {
    float* s = S + r * ld;
    for (int64_t j = 0; j < cols; j += N) hn::Store(hn::Mul(vc, hn::Tanh(df, hn::Mul(hn::Load(df, s + j), inv))), df, s + j);
  }
}

void Alibi(float* S, int64_t rows, int64_t n, int64_t ld, float slope, float center0) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), cols = Cols(df, n);
  const auto vs = hn::Set(df, slope);
  const auto iota = hn::Iota(df, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* s = S + r * ld;
    const float c = center0 + static_cast<float>(r);
    for (int64_t j = 0; j < cols; j += N) {
      const auto dist = hn::Abs(hn::Sub(hn::Set(df, c - static_cast<float>(j)), iota));
      hn::Store(hn::NegMulAdd(vs, dist, hn::Load(df, s + j)), df, s + j);
    }
  }
}

void OnlineSoftmax(float* S, int64_t rows, int64_t n, int64_t ld, float* m, float* l, float* alpha, uint16_t* P16) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), cols = Cols(df, n);
  const float ninf = -std::numeric_limits<float>::infinity();  // −inf
  for (int64_t r = 0; r < rows; ++r) {
    float* s = S + r * ld;
    for (int64_t j = n; j < cols; ++j) s[j] = ninf;
    auto m0 = hn::Set(df, ninf), m1 = m0, nan = hn::Zero(df);  // nan: lanes that met a NaN score
    int64_t j = 0;
    for (; j + 2 * N <= cols; j += 2 * N) {
      const auto x0 = hn::Load(df, s + j), x1 = hn::Load(df, s + j + N);
      m0 = hn::Max(m0, x0), m1 = hn::Max(m1, x1);
      nan = hn::Or(nan, hn::Or(hn::VecFromMask(df, hn::IsNaN(x0)), hn::VecFromMask(df, hn::IsNaN(x1))));
    }
    if (j < cols) {
      const auto x0 = hn::Load(df, s + j);
      m0 = hn::Max(m0, x0);
      nan = hn::Or(nan, hn::VecFromMask(df, hn::IsNaN(x0)));
    }
    const float mt = hn::GetLane(hn::MaxOfLanes(df, hn::Max(m0, m1)));
    const float mnew = mt > m[r] ? mt : m[r];
    uint16_t* p16 = P16 ? P16 + r * ld : nullptr;
    // A NaN or +Inf score (a non-finite q or k: inputs are scanned only with check_finite) makes
    // the row NaN, as in the reference (exp(Inf − Inf)); Max and Exp would drop it.
    const bool poisoned = !hn::AllFalse(df, hn::MaskFromVec(nan)) || mt == -ninf;
    if (poisoned || !(mnew > ninf)) {  // nothing seen yet: P row 0, state unchanged (l NaN if poisoned)
      for (j = 0; j < cols; j += N) {
        hn::Store(hn::Zero(df), df, s + j);
        if (p16) StoreBf16(df, hn::Zero(df), p16 + j);
      }
      alpha[r] = 1.0f;
      if (poisoned) l[r] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const auto vm = hn::Set(df, mnew);
    auto a0 = hn::Zero(df), a1 = hn::Zero(df);
    for (j = 0; j + 2 * N <= cols; j += 2 * N) {
      const auto p0 = Exp(df, hn::Sub(hn::Load(df, s + j), vm));
      const auto p1 = Exp(df, hn::Sub(hn::Load(df, s + j + N), vm));
      if (p16) {
        StoreBf16(df, p0, p16 + j);
        StoreBf16(df, p1, p16 + j + N);
      } else {
        hn::Store(p0, df, s + j);
        hn::Store(p1, df, s + j + N);
      }
      a0 = hn::Add(a0, p0);
      a1 = hn::Add(a1, p1);
    }
    if (j < cols) {
      const auto p0 = Exp(df, hn::Sub(hn::Load(df, s + j), vm));
      if (p16)
        StoreBf16(df, p0, p16 + j);
      else
        hn::Store(p0, df, s + j);
      a0 = hn::Add(a0, p0);
    }
    const float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1)));
    const float a = m[r] > ninf ? hn::GetLane(Exp(df, hn::Set(df, m[r] - mnew))) : 0.0f;
    l[r] = l[r] * a + sum;
    alpha[r] = a;
    m[r] = mnew;
  }
}

void ExpRows(float* P, int64_t rows, int64_t n, int64_t ld, const float* lse, uint16_t* P16) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), cols = Cols(df, n);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    float* p = P + r * ld;
    uint16_t* p16 = P16 ? P16 + r * ld : nullptr;
    if (!(lse[r] > ninf)) {
      for (int64_t j = 0; j < cols; j += N) {
        hn::Store(hn::Zero(df), df, p + j);
        if (p16) StoreBf16(df, hn::Zero(df), p16 + j);
      }
      continue;
    }
    for (int64_t j = n; j < cols; ++j) p[j] = ninf;
    const auto vl = hn::Set(df, lse[r]);
    for (int64_t j = 0; j < cols; j += N) {
      const auto e = Exp(df, hn::Sub(hn::Load(df, p + j), vl));
      hn::Store(e, df, p + j);
      if (p16) StoreBf16(df, e, p16 + j);
    }
  }
}

void DsRows(const float* P, float* dP, const float* T, int64_t rows, int64_t n, int64_t ld, const float* delta,
            float inv_c, uint16_t* dS16) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), cols = Cols(df, n);
  const auto one = hn::Set(df, 1.0f), vinv = hn::Set(df, inv_c);
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = P + r * ld;
    float* dp = dP + r * ld;
    const auto vd = hn::Set(df, delta[r]);
    uint16_t* ds16 = dS16 ? dS16 + r * ld : nullptr;
    if (T) {
      const float* t = T + r * ld;
      for (int64_t j = 0; j < cols; j += N) {
        const auto u = hn::Mul(hn::Load(df, t + j), vinv);
        const auto g = hn::Mul(hn::Load(df, p + j), hn::Sub(hn::Load(df, dp + j), vd));
        const auto ds = hn::Mul(g, hn::NegMulAdd(u, u, one));
        if (ds16)
          StoreBf16(df, ds, ds16 + j);
        else
          hn::Store(ds, df, dp + j);
      }
    } else {
      for (int64_t j = 0; j < cols; j += N) {
        const auto ds = hn::Mul(hn::Load(df, p + j), hn::Sub(hn::Load(df, dp + j), vd));
        if (ds16)
          StoreBf16(df, ds, ds16 + j);
        else
          hn::Store(ds, df, dp + j);
      }
    }
  }
}

void ScaleRows(float* Y, int64_t rows, int64_t n, int64_t ld, const float* a) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = 0; r < rows; ++r) {
    if (a[r] == 1.0f) continue;
    float* y = Y + r * ld;
    const auto va = hn::Set(df, a[r]);
    int64_t j = 0;
    for (; j + N <= n; j += N) hn::StoreU(hn::Mul(hn::LoadU(df, y + j), va), df, y + j);
    for (; j < n; ++j) y[j] *= a[r];
  }
}

float Dot(const float* a, const float* b, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto s0 = hn::Zero(df);
  int64_t i = 0;
  for (; i + N <= n; i += N) s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
  float s = hn::GetLane(hn::SumOfLanes(df, s0));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::attention::cpu_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::attention::cpu_simd {

HWY_EXPORT(PackB);
HWY_EXPORT(GemmPacked);
HWY_EXPORT(AddRows);
HWY_EXPORT(Softcap);
HWY_EXPORT(Alibi);
HWY_EXPORT(OnlineSoftmax);
HWY_EXPORT(ExpRows);
HWY_EXPORT(DsRows);
HWY_EXPORT(ScaleRows);
HWY_EXPORT(Dot);

void pack_b(const float* M, int64_t ld, bool trans, int64_t K, int64_t N, float* Bp, int64_t panel_rows, int64_t k0) {
  HWY_DYNAMIC_DISPATCH(PackB)(M, ld, trans, K, N, Bp, panel_rows, k0);
}
void gemm_packed(const float* A, int64_t lda, bool trans_a, const float* Bp, int64_t panel_rows, int64_t k0,
                 int64_t M, int64_t N, int64_t K, float* C, int64_t ldc, float alpha, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(GemmPacked)(A, lda, trans_a, Bp, panel_rows, k0, M, N, K, C, ldc, alpha, accumulate);
}
void softcap(float* S, int64_t rows, int64_t n, int64_t ld, float c) { HWY_DYNAMIC_DISPATCH(Softcap)(S, rows, n, ld, c); }
void add_rows(float* S, int64_t rows, int64_t n, int64_t ld, const float* b, int64_t ldb) {
  HWY_DYNAMIC_DISPATCH(AddRows)(S, rows, n, ld, b, ldb);
}
void alibi(float* S, int64_t rows, int64_t n, int64_t ld, float slope, float center0) {
  HWY_DYNAMIC_DISPATCH(Alibi)(S, rows, n, ld, slope, center0);
}
void online_softmax(float* S, int64_t rows, int64_t n, int64_t ld, float* m, float* l, float* alpha, uint16_t* P16) {
  HWY_DYNAMIC_DISPATCH(OnlineSoftmax)(S, rows, n, ld, m, l, alpha, P16);
}
void exp_rows(float* P, int64_t rows, int64_t n, int64_t ld, const float* lse, uint16_t* P16) {
  HWY_DYNAMIC_DISPATCH(ExpRows)(P, rows, n, ld, lse, P16);
}
void ds_rows(const float* P, float* dP, const float* T, int64_t rows, int64_t n, int64_t ld, const float* delta,
             float inv_c, uint16_t* dS16) {
  HWY_DYNAMIC_DISPATCH(DsRows)(P, dP, T, rows, n, ld, delta, inv_c, dS16);
}
void scale_rows(float* Y, int64_t rows, int64_t n, int64_t ld, const float* a) {
  HWY_DYNAMIC_DISPATCH(ScaleRows)(Y, rows, n, ld, a);
}
float dot(const float* a, const float* b, int64_t n) { return HWY_DYNAMIC_DISPATCH(Dot)(a, b, n); }

}  // namespace tessera::attention::cpu_simd
#endif  // HWY_ONCE
