// Tessera: element types and the scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tessera {

// kF8E4M3: OCP FP8 E4M3 ("e4m3fn": PyTorch's float8_e4m3fn, ml_dtypes'/JAX's float8_e4m3fn):
// 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinities, NaN = S.1111.111, largest 448.
// A storage type only (paged_attention's KV caches); no kernel computes in it.
enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kF8E4M3 };

size_t dtype_size(DType t) noexcept;
const char* dtype_name(DType t) noexcept;  // "f32", "bf16", "f16", "i32", "i64", "f8e4m3"
DType parse_dtype(std::string_view name);  // throws Error(kInvalidArgument) on unknown names
inline bool is_float(DType t) noexcept {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}
inline bool is_integer(DType t) noexcept { return t == DType::kI32 || t == DType::kI64; }

// ---- f8e4m3 <-> f32: every f8e4m3 value is exact in f32; f32 -> f8e4m3 rounds to nearest
// even, and what rounds past 448 (Inf too) becomes NaN, as PyTorch's and ml_dtypes' casts. ----

inline float f8e4m3_to_f32(uint8_t c) noexcept {
  const uint32_t e = (c >> 3) & 0xfu, m = c & 0x7u;
  float a;
  if (e == 0xfu && m == 0x7u) {
    a = __builtin_nanf("");
  } else if (e == 0) {
    a = static_cast<float>(m) * 0x1p-9f;  // subnormal: m · 2^-9
  } else {
    const uint32_t u = ((e + 120u) << 23) | (m << 20);  // rebias 7 -> 127
    std::memcpy(&a, &u, 4);
  }
  return (c & 0x80u) ? -a : a;
}

inline uint8_t f32_to_f8e4m3(float f) noexcept {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN, Inf -> NaN
  if (a < 0x3c800000u) {  // below 2^-6: subnormal steps of 2^-9 (the step up to 2^-6 carries into it)
    float af;
    std::memcpy(&af, &a, 4);
    const float scaled = af * 512.0f;
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint8_t>(sign | m);
  }
  const uint32_t e = (a >> 23) - 120u;  // rebias 127 -> 7 (>= 1 here)
  uint32_t r = (e << 3) | ((a >> 20) & 0x7u);
  const uint32_t rest = a & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (r & 1u))) ++r;  // a carry into the exponent is right
  if (e > 15u || r >= 0x7fu) return static_cast<uint8_t>(sign | 0x7fu);  // past 448: NaN
  return static_cast<uint8_t>(sign | r);
}

// ---- bf16 / f16 <-> f32, round-to-nearest-even, NaN kept NaN, Inf kept Inf. ----

inline float bf16_to_f32(uint16_t h) noexcept {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) noexcept {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);  // Inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    u = sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) noexcept {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> Inf
  if (a < 0x38800000u) {                                              // subnormal or zero
    // value = a as float; f16 subnormal unit is 2^-24. Round to nearest even.
    float af;
    std::memcpy(&af, &a, 4);
    const float scaled = af * 16777216.0f;  // 2^24, exact
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0x0fffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

// Reads element i of a float buffer of dtype t as f32 (f32, bf16, f16, f8e4m3 only).
inline float load_as_f32(const void* p, DType t, int64_t i) noexcept {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF8E4M3: return f8e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
    default: return 0.0f;
  }
}

// Stores f32 value v as element i of a float buffer of dtype t (rounding to nearest even).
inline void store_from_f32(void* p, DType t, int64_t i, float v) noexcept {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::kF8E4M3: static_cast<uint8_t*>(p)[i] = f32_to_f8e4m3(v); break;
    default: break;
  }
}

// Reads element i of an integer buffer (i32 / i64) as int64.
inline int64_t load_as_i64(const void* p, DType t, int64_t i) noexcept {
  return t == DType::kI32 ? static_cast<const int32_t*>(p)[i] : static_cast<const int64_t*>(p)[i];
}

}  // namespace tessera
