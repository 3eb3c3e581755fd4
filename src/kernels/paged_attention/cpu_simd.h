// Tessera internal: the SIMD tile routines of the paged_attention CPU backend (Highway, run-time
// dispatch to the machine's best instruction set). All arithmetic is f32; rows need no padding
// (tails are done lane by lane).
#pragma once

#include <cstdint>

namespace tessera::paged_attention::cpu_simd {

// S[r·lds + j] = Σ_d Q[r·ldq + d] · K[j·ldk + d] for r < R, j < n (f32 FMA lanes, 4 rows a step).
void scores(const float* Q, int64_t ldq, int64_t R, const float* K, int64_t ldk, int64_t n, int64_t D, float* S,
            int64_t lds);

// The online-softmax step, per row r < R over s = S[r·lds .. + n):
//   m' = max(m[r], max_j s_j);  s_j ← exp(s_j − m');  alpha[r] = exp(m[r] − m');
//   l[r] ← l[r]·alpha[r] + Σ_j s_j;  m[r] ← m'.
// −inf entries (masked) become exactly 0; a row with m' = −inf (nothing seen yet) becomes zeros
// with alpha 1 and its state unchanged.
void online_softmax(float* S, int64_t R, int64_t n, int64_t lds, float* m, float* l, float* alpha);

// O[r·ldo + d] = alpha[r] · O[r·ldo + d] + Σ_j P[r·ldp + j] · V[j·ldv + d] for r < R, d < Dv.
void accumulate(const float* P, int64_t ldp, int64_t R, const float* V, int64_t ldv, int64_t n, int64_t Dv,
                const float* alpha, float* O, int64_t ldo);

// Repacks n cache rows of `heads` kv heads into head-major f32: dst[(h·n + j)·width + d] =
// src[j·row_stride + h·width + d] for src of `kind` 0 f32, 1 bf16, 2 f16, 3 f8e4m3 (row_stride in
// elements).
// Head-major rows are contiguous: a cache row stride of Hkv·width (often 4 KiB) would alias in
// the L1 cache on every key.
void gather_rows(const void* src, int kind, int64_t n, int64_t heads, int64_t width, int64_t row_stride, float* dst);

}  // namespace tessera::paged_attention::cpu_simd
