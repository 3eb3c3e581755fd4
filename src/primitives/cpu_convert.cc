// Tessera CPU backends: dtype conversion (Highway, run-time dispatch). See cpu_convert.h.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "primitives/cpu_convert.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "primitives/cpu_convert.h"
#include "tessera/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu_convert {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// One vector of src (N elements) widened to f32.
template <class D>
HWY_INLINE hn::Vec<D> Widen(D df, const uint16_t* src, bool is_bf16) {
  if (is_bf16) {
    const hn::RebindToUnsigned<D> du32;
    const hn::Rebind<uint16_t, D> du16;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, src))));
  }
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(src)));
}

// x86 targets below AVX2 have no F16C: Highway 1.0's emulated f16 conversions there truncate
// instead of rounding to nearest even and map ±Inf, NaN and values past 65504 to finite ones.
// They take dtype.h's scalar conversions instead (the same bits as the F16C targets).
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX2
constexpr bool kScalarF16 = true;
#else
constexpr bool kScalarF16 = false;
#endif

void HalfToF32(const uint16_t* src, bool is_bf16, float* dst, int64_t n) {
  if (kScalarF16 && !is_bf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = tessera::f16_to_f32(src[i]);
    return;
  }
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(Widen(df, src + i, is_bf16), df, dst + i);
  if (i < n) {  // the tail through padded buffers
    HWY_ALIGN uint16_t in[hn::MaxLanes(df)] = {};
    HWY_ALIGN float out[hn::MaxLanes(df)];
    for (int64_t k = 0; k < n - i; ++k) in[k] = src[i + k];
    hn::Store(Widen(df, in, is_bf16), df, out);
    for (int64_t k = 0; k < n - i; ++k) dst[i + k] = out[k];
  }
}

// N f8e4m3 codes widened to f32 by integer arithmetic (no float operation on a subnormal, so a
// caller's flush-to-zero / denormals-are-zero mode changes nothing): a normal code (e >= 1) is
// its 7 magnitude bits shifted into f32's exponent and mantissa and rebiased by 120 (exponent
// e + 120, mantissa m << 20); a subnormal (e = 0) is m · 2^-9; S.1111.111 is NaN; then the sign.
template <class D>
HWY_INLINE hn::Vec<D> WidenF8(D df, const uint8_t* src) {
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<uint8_t, D> du8;
  const auto u = hn::PromoteTo(du, hn::LoadU(du8, src));
  const auto mag = hn::And(u, hn::Set(du, 0x7fu));
  const auto normal = hn::BitCast(df, hn::Add(hn::ShiftLeft<20>(mag), hn::Set(du, 120u << 23)));
  const auto sub = hn::Mul(hn::ConvertTo(df, hn::BitCast(hn::RebindToSigned<D>(), mag)), hn::Set(df, 0x1p-9f));
  auto r = hn::IfThenElse(hn::RebindMask(df, hn::Lt(mag, hn::Set(du, 8u))), sub, normal);
  r = hn::IfThenElse(hn::RebindMask(df, hn::Eq(mag, hn::Set(du, 0x7fu))), hn::NaN(df), r);
  return hn::BitCast(df, hn::Or(hn::BitCast(du, r), hn::ShiftLeft<24>(hn::And(u, hn::Set(du, 0x80u)))));
}

void F8E4M3ToF32(const uint8_t* src, float* dst, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(WidenF8(df, src + i), df, dst + i);
  for (; i < n; ++i) dst[i] = tessera::f8e4m3_to_f32(src[i]);
}

// Exact as well (every f8e4m3 value is a bf16): the f32 widening's upper halves.
void F8E4M3ToBf16(const uint8_t* src, uint16_t* dst, int64_t n) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto hi = hn::ShiftRight<16>(hn::BitCast(du, WidenF8(df, src + i)));  // <= 0xffff: no saturation
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, hi)), du16, dst + i);
  }
  for (; i < n; ++i) dst[i] = tessera::f32_to_bf16(tessera::f8e4m3_to_f32(src[i]));
}

void F32ToF16(const float* src, uint16_t* dst, int64_t n) {
  if (kScalarF16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = tessera::f32_to_f16(src[i]);
    return;
  }
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto* out = reinterpret_cast<hwy::float16_t*>(dst);
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh, out + i);
  if (i < n) {
    HWY_ALIGN float in[hn::MaxLanes(df)] = {};
    HWY_ALIGN hwy::float16_t tail[hn::MaxLanes(df)];
    for (int64_t k = 0; k < n - i; ++k) in[k] = src[i + k];
    hn::Store(hn::DemoteTo(dh, hn::Load(df, in)), dh, tail);
    for (int64_t k = 0; k < n - i; ++k) out[i + k] = tail[k];
  }
}

// The rounding of dtype.h's f32_to_bf16 on whole vectors: u + 0x7fff + ((u >> 16) & 1), high
// half; a NaN keeps its high half with the quiet bit set.
void F32ToBf16(const float* src, uint16_t* dst, int64_t n) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto one = hn::Set(du, 1u), bias = hn::Set(du, 0x7fffu), abs_mask = hn::Set(du, 0x7fffffffu);
  const auto inf = hn::Set(du, 0x7f800000u), quiet = hn::Set(du, 0x00400000u);
  auto convert = [&](const float* in, uint16_t* out, bool aligned_tail) {
    const auto u = hn::BitCast(du, hn::LoadU(df, in));
    const auto rounded = hn::Add(u, hn::Add(bias, hn::And(hn::ShiftRight<16>(u), one)));
    const auto is_nan = hn::Gt(hn::And(u, abs_mask), inf);
    const auto r = hn::ShiftRight<16>(hn::IfThenElse(is_nan, hn::Or(u, quiet), rounded));
    if (aligned_tail)
      hn::Store(hn::TruncateTo(d16, r), d16, out);
    else
      hn::StoreU(hn::TruncateTo(d16, r), d16, out);
  };
  int64_t i = 0;
  for (; i + N <= n; i += N) convert(src + i, dst + i, false);
  if (i < n) {
    HWY_ALIGN float in[hn::MaxLanes(df)] = {};
    HWY_ALIGN uint16_t out[hn::MaxLanes(df)];
    for (int64_t k = 0; k < n - i; ++k) in[k] = src[i + k];
    convert(in, out, true);
    for (int64_t k = 0; k < n - i; ++k) dst[i + k] = out[k];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::cpu_convert
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::cpu_convert {

HWY_EXPORT(HalfToF32);
HWY_EXPORT(F32ToF16);
HWY_EXPORT(F32ToBf16);
HWY_EXPORT(F8E4M3ToF32);
HWY_EXPORT(F8E4M3ToBf16);

void half_to_f32(const uint16_t* src, bool is_bf16, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(HalfToF32)(src, is_bf16, dst, n);
}

void f8e4m3_to_f32(const uint8_t* src, float* dst, int64_t n) { HWY_DYNAMIC_DISPATCH(F8E4M3ToF32)(src, dst, n); }
void f8e4m3_to_bf16(const uint8_t* src, uint16_t* dst, int64_t n) { HWY_DYNAMIC_DISPATCH(F8E4M3ToBf16)(src, dst, n); }
void f32_to_f16(const float* src, uint16_t* dst, int64_t n) { HWY_DYNAMIC_DISPATCH(F32ToF16)(src, dst, n); }
void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) { HWY_DYNAMIC_DISPATCH(F32ToBf16)(src, dst, n); }

}  // namespace tessera::cpu_convert
#endif  // HWY_ONCE
