// Tessera internal: the SIMD tile kernels of the attention CPU backend.
//
// Implemented with Highway (cpu_simd.cc), dispatched at run time to the best instruction set of
// the machine. All arithmetic is f32. Tiles are row-major with row stride `ld`, a multiple of
// kPad floats, so that every row can be processed in whole vectors: the columns [n, round_up(n))
// of a row are padding that these functions may overwrite (and that no caller reads).
#pragma once

#include <cstdint>

#include "primitives/cpu_convert.h"

namespace tessera::attention::cpu_simd {

inline constexpr int64_t kPad = 16;  // tile row strides are multiples of this (>= any vector)
inline int64_t round_up(int64_t n) { return (n + kPad - 1) / kPad * kPad; }

// ---- the tile matrix products: a register-blocked Highway micro-kernel ----
// B operands are packed into column panels of two vectors (zero-padded); packed_floats(K, N)
// is the buffer size a pack needs on any target.
inline int64_t packed_floats(int64_t K, int64_t N) { return (N + 31) / 32 * 32 * K; }
// A packed matrix holds `panel_rows` rows (k) per panel; a pack or a product may cover rows
// [k0, k0 + K) of it (a q tile of a whole packed sequence), the default being all of it.
// Packs B (K × N) with B[k][n] = trans ? M[n·ld + k] : M[k·ld + n] into rows [k0, k0+K).
void pack_b(const float* M, int64_t ld, bool trans, int64_t K, int64_t N, float* Bp, int64_t panel_rows,
            int64_t k0);
inline void pack_b(const float* M, int64_t ld, bool trans, int64_t K, int64_t N, float* Bp) {
  pack_b(M, ld, trans, K, N, Bp, K, 0);
}
// C (M × N, row stride ldc) = alpha · op(A) · B[k0 : k0+K]  (+ C when accumulate), B packed by
// pack_b; op(A)[i][k] = trans_a ? A[k·lda + i] : A[i·lda + k]. f32 FMA accumulation over K in
// registers (6 rows × 2 vectors per step), in a fixed order.
void gemm_packed(const float* A, int64_t lda, bool trans_a, const float* Bp, int64_t panel_rows, int64_t k0,
                 int64_t M, int64_t N, int64_t K, float* C, int64_t ldc, float alpha, bool accumulate);

// dst[i] = f32(src[i]) for bf16 (is_bf16) or f16 source elements.
inline void half_to_f32(const uint16_t* src, bool is_bf16, float* dst, int64_t n) {
  cpu_convert::half_to_f32(src, is_bf16, dst, n);  // one implementation for every kernel
}

// s = c · tanh(s / c) over rows × n.
void softcap(float* S, int64_t rows, int64_t n, int64_t ld, float c);

// s[r][j] += b[r·ldb + j] for j < n (an f32 bias tile; b is never read past n).
void add_rows(float* S, int64_t rows, int64_t n, int64_t ld, const float* b, int64_t ldb);

// ALiBi: s[r][j] −= slope · |center0 + r − j| (center0: the first row's i + off − j0).
void alibi(float* S, int64_t rows, int64_t n, int64_t ld, float slope, float center0);

// The online-softmax step of a forward tile, per row r:
//   m' = max(m[r], max_j s[r][j]);  s[r][j] ← exp(s[r][j] − m');  alpha[r] = exp(m[r] − m');
//   l[r] ← l[r]·alpha[r] + Σ_j s[r][j];  m[r] ← m'.
// −inf entries (masked) become exactly 0. A row with m' = −inf (nothing seen yet) becomes all
// zeros with alpha 1. exp is a Cephes-style f32 exp (range reduction by ln 2 in two parts,
// degree-5 polynomial, < 2 ulp), exact 0 below −87.3.
// With P16 (bf16 tile, row stride ld): P goes there rounded to bf16 (nearest even, as
// cpu_convert::f32_to_bf16) instead of into S, and l still sums the f32 P.
void online_softmax(float* S, int64_t rows, int64_t n, int64_t ld, float* m, float* l, float* alpha,
                    uint16_t* P16 = nullptr);

// Backward: P[r][j] ← exp(P[r][j] − lse[r]) in place; 0 for −inf entries and for rows whose lse
// is −inf. With P16, also P rounded to bf16 there (row stride ld).
void exp_rows(float* P, int64_t rows, int64_t n, int64_t ld, const float* lse, uint16_t* P16 = nullptr);

// Backward: dS = P ∘ (dP − delta[r]) (∘ (1 − (T/c)²) when T, the soft-capped scores, is given),
// in place in dP; with dS16, dS rounded to bf16 goes there (row stride ld) instead, dP is kept.
void ds_rows(const float* P, float* dP, const float* T, int64_t rows, int64_t n, int64_t ld,
             const float* delta, float inv_c, uint16_t* dS16 = nullptr);

// Y[r][0..n) *= a[r].
void scale_rows(float* Y, int64_t rows, int64_t n, int64_t ld, const float* a);

// Σ a[i]·b[i] in f32 lanes.
float dot(const float* a, const float* b, int64_t n);

}  // namespace tessera::attention::cpu_simd
