// Tessera internal: dtype conversion of the CPU backends (Highway, run-time dispatch; built with
// TESSERA_CPU_BACKEND). One implementation for every kernel.
#pragma once

#include <cstdint>

namespace tessera::cpu_convert {

// dst[i] = f32(src[i]) for n bf16 (is_bf16) or f16 source elements: exact (both widen to f32
// without rounding), f16 subnormals, infinities and NaN included.
void half_to_f32(const uint16_t* src, bool is_bf16, float* dst, int64_t n);

// dst[i] = f32(src[i]) for n f8e4m3 (OCP E4M3, "e4m3fn") elements: exact, subnormals and NaN
// included, bit for bit tessera/dtype.h's f8e4m3_to_f32 (integer arithmetic: no flush-to-zero mode
// can touch a subnormal).
void f8e4m3_to_f32(const uint8_t* src, float* dst, int64_t n);
// dst[i] = bf16(src[i]) for n f8e4m3 elements: exact (every f8e4m3 value is a bf16), NaN quiet.
void f8e4m3_to_bf16(const uint8_t* src, uint16_t* dst, int64_t n);

// dst[i] = f16(src[i]) for n elements, rounded to nearest even as tessera/dtype.h's f32_to_f16
// (overflow to ±inf, subnormals kept, NaN stays NaN).
void f32_to_f16(const float* src, uint16_t* dst, int64_t n);
// dst[i] = bf16(src[i]), bit for bit tessera/dtype.h's f32_to_bf16 (nearest even; NaN quieted).
void f32_to_bf16(const float* src, uint16_t* dst, int64_t n);

}  // namespace tessera::cpu_convert
