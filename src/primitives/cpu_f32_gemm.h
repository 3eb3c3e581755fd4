// Tessera primitives: an f32 GEMM on packed panels, for the small repeated tile products inside
// fused CPU kernels (issue #24's shared micro-kernels; the f32 one, beside cpu_bf16_gemm).
//
//   C[M × N] = alpha · op(A)[M × K] · B[K × N] + beta · C      (beta = 0: C is not read)
//
// B is packed once (pack) and then multiplied by any number of A: a kernel packs the operand
// that several products share (mlstm: V, the keys, a chunk state). Packed layout: panels of
// kPanel columns; panel p holds, for each row k of B, kPanel floats (B[k][p·kPanel + c]); the
// columns past N are zero. op(A) is A (row i at A + i·lda) or, with trans_a, Aᵀ (A is K × M,
// row k at A + k·lda): both are read in place, one broadcast per value, so A is never packed.
//
// Causal shapes (Tri), for the L × L tiles of chunkwise recurrences, skip the work that is zero:
//   kLowerA   op(A) is lower triangular (op(A)[i][k] = 0 for k > i): row block i0 .. i0 + r takes
//             k < i0 + r only. The zeros must be there: a block reads up to its last row's diagonal.
//   kUpperA   op(A) is upper triangular (0 for k < i): row block i0 .. takes k ≥ i0 only (the
//             zeros below the diagonal within a block must be there).
//   kLowerC   only C[i][n] for n ≤ i is computed; C[i][n] for i < n < N is set to 0 (beta must be 0).
//
// gemm runs a register-blocked FMA micro-kernel chosen at run time by the CPU (isa()): AVX-512
// (6 rows × 64 columns, fewer column vectors at the edges) where the CPU has AVX-512F, AVX2
// (6 rows × 16 columns, each panel in four column blocks) where it has AVX2 and FMA, and a
// portable loop over the same layout elsewhere. The two SIMD kernels give the same bits (each
// element is one FMA chain over k in order, then the same epilogue); the portable loop sums per
// element in the same order, so it differs by the FMA's single rounding only.
// TESSERA_CPU_F32_GEMM=0 (or =portable) forces the portable loop, =avx2 the AVX2 kernel at most
// (triage, side-by-side timing, and the tests of each path on one machine).
#pragma once

#include <cstdint>

namespace tessera::cpu_f32_gemm {

inline constexpr int64_t kPanel = 64;  // columns of B per packed panel

enum class Tri { kNone, kLowerA, kUpperA, kLowerC };

// Which kernel gemm, pack and transpose run (read per call, so a test can switch it).
enum class Isa { kPortable, kAvx2, kAvx512 };
Isa isa();
const char* isa_name(Isa isa);  // "portable", "avx2", "avx512"

// The AVX-512 kernel runs (isa() == kAvx512). The routes of callers that were tuned and measured
// on it, or that run AVX-512 code of their own beside it, ask this; a caller that wants any SIMD
// kernel asks isa() != Isa::kPortable (knowledge: capability-flag-read-as-an-isa).
bool available();

// Floats of a packed B with K rows and N columns: ceil(N / kPanel) · K · kPanel.
int64_t packed_floats(int64_t K, int64_t N);

// Pack B [K × N]: B[k][n] at B + k·ldb + n, or with trans_b at B + n·ldb + k (B given as its
// transpose, N rows of K: the keys for Q·Kᵀ).
void pack(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb, float* packed);

// pack of a bf16 (is_bf16) or f16 B, widened to f32 on the way (exact): the same floats, bit for
// bit, as pack of the f32 copy of B, without that copy (16-bit weights on the f32 micro-kernel:
// linear_cross_entropy's w, grouped_matmul's rhs). trans_b widens a panel's ≤ kPanel rows of K
// values at a time into `scratch` (pack_half_scratch floats; none without trans_b: may be null).
int64_t pack_half_scratch(bool trans_b, int64_t K);
void pack_half(bool trans_b, int64_t K, int64_t N, const uint16_t* B, int64_t ldb, bool is_bf16, float* packed,
               float* scratch);

// C = alpha·op(A)·B + beta·C with B packed by pack(·, K, N' ≥ N, ...) (its first N columns).
// C: row i at C + i·ldc, N values; nothing else of C is touched. M or N ≤ 0: nothing; K ≤ 0:
// C = beta·C (0 for beta = 0).
void gemm(Tri tri, bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* packed, float beta, float* C, int64_t ldc);

// C = alpha·op(A)·B + beta·Cin: gemm with the beta term read from another matrix of C's shape
// (row i at Cin + i·ldci) — C_out = b·ΔC + a·C_in in one pass instead of a product and an axpy
// (mlstm's chain step). Each element is formed exactly as gemm forms it from the old value, so
// gemm_from(…, C, ldc, C, ldc) is gemm, and gemm_from into C equals gemm on a copy of Cin, bit for bit. Cin is C itself or does not overlap it; beta = 0: Cin is not
// read. kLowerC's zeros as in gemm.
void gemm_from(Tri tri, bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* packed, float beta, const float* Cin, int64_t ldci, float* C, int64_t ldc);

// dst[c][r] = src[r][c] for r < rows, c < cols (src row r at src + r·lds, dst row c at dst + c·ldd):
// a product's output wanted the other way round (mlstm: Xᵀ = C·dNumᵀ formed, X read).
void transpose(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst, int64_t ldd);

}  // namespace tessera::cpu_f32_gemm
