// Tessera internal: the SIMD row kernels of the linear_cross_entropy CPU backend.
//
// Implemented with Highway (cpu_simd.cc) and dispatched at run time to the best instruction set
// of the machine (SSE2 ... AVX2 ... AVX-512). All arithmetic is f32; exp / tanh are Highway's
// contrib/math (max error 1-2 ULP in f32 over the whole range used here).
#pragma once

#include <cstdint>

#include "primitives/cpu_convert.h"

namespace tessera::linear_cross_entropy::cpu_simd {

// dst[i] = f32(src[i]) for bf16 (is_bf16) or f16 source elements.
inline void half_to_f32(const uint16_t* src, bool is_bf16, float* dst, int64_t n) {
  cpu_convert::half_to_f32(src, is_bf16, dst, n);  // one implementation for every kernel
}

// In place: z[i] += bias[i] (bias may be null); then, if cap > 0, z[i] = cap * tanh(z[i] / cap).
void bias_softcap(float* z, int64_t n, const float* bias, float cap);

// max_i z[i] over the non-NaN z (−inf when all are −inf); *poisoned: some z[i] is NaN or +inf.
float max_value(const float* z, int64_t n, bool* poisoned);

// *sum_exp = sum_i exp(z[i] - m); *sum_z = sum_i sigma[i] * z[i], sigma = 1 when null (f32
// lanes, fixed order).
void sum_exp(const float* z, int64_t n, float m, const float* sigma, float* sum_exp, float* sum_z);

// In place: z[i] := scale * (coef * exp(z[i] - lse) - offset * sigma[i]) * (cap > 0 ? 1 - (z[i]/cap)^2 : 1),
// sigma = 1 when null; NaN where z[i] - lse is NaN (a NaN logit or lse), as in the reference. (The label column's "- (1 - eps)" is applied by the caller, after this.)
void softmax_grad(float* z, int64_t n, float lse, float coef, float offset, const float* sigma, float scale,
                  float cap);

}  // namespace tessera::linear_cross_entropy::cpu_simd
