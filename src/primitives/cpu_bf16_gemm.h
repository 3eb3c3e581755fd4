// Tessera primitives: a bf16 GEMM on packed panels, for the small repeated tile products inside
// fused CPU kernels (issue #24's shared micro-kernels; the first one).
//
//   C[M × N] = alpha · A[M × K] · B[K × N]   (+ C when accumulate)
//
// A and B bf16 (raw uint16 bits), C f32. Products of two bf16 are exact in f32; sums are f32.
// B is packed once (pack_rows / pack_cols) and then multiplied by any number of A: kernels pack
// the operand that many rows share (mla_decode: the keys and values of a block, shared by every
// query row). Packed layout: panels of kPanel columns; panel p holds, for each pair of rows
// (2k, 2k+1) of B, kPanel words (B[2k][c] | B[2k+1][c] << 16), which is what the AVX512-BF16
// instruction vdpbf16ps multiplies against a broadcast pair (A[i][2k], A[i][2k+1]); an odd K's
// last pair and the columns past N are zero.
//
// gemm runs a register-blocked vdpbf16ps micro-kernel (4 rows × 64 columns; 8 rows × 16 columns
// where N ≤ 16) where the CPU has AVX512-BF16 (runtime check) and a portable loop over the same
// layout elsewhere (the same values up to the order of the f32 sums). TESSERA_CPU_BF16_DOT=portable forces the
// portable loop (mode() below).
#pragma once

#include <cstdint>

namespace tessera::cpu_bf16_gemm {

inline constexpr int64_t kPanel = 32;  // columns of B per packed panel

// How the kernels' bf16 dot routes run, read per call from TESSERA_CPU_BF16_DOT:
//   kNative    AVX512-BF16 present (and the variable unset or on): the vdpbf16ps micro-kernel;
//   kPortable  TESSERA_CPU_BF16_DOT=portable: the routes run on any CPU, through the portable
//              loops (slow; the same values up to the order of the f32 sums) — so that the routes'
//              bookkeeping is tested on CPUs without AVX512-BF16 (CI's);
//   kOff       no AVX512-BF16, or TESSERA_CPU_BF16_DOT=0: the kernels take their f32 routes.
enum class Mode { kOff, kNative, kPortable };
Mode mode();
// A kernel takes its bf16 dot route (mode() != kOff).
bool available();
// The AVX512-BF16 instructions run (mode() == kNative): a kernel's own AVX-512 code on the route
// (attention's transposes) checks this one.
bool native();

// uint32 words of a packed B with K rows and N columns: ceil(N / kPanel) · ceil(K / 2) · kPanel.
int64_t packed_words(int64_t K, int64_t N);

// Pack B [K × N] given by its rows: row k is rows[k][0 .. N).
void pack_rows(const uint16_t* const* rows, int64_t K, int64_t N, uint32_t* packed);
// Pack B [K × N] given by its columns: column n is cols[n][0 .. K) (the rows of Bᵀ: keys for Q·Kᵀ).
void pack_cols(const uint16_t* const* cols, int64_t K, int64_t N, uint32_t* packed);

// C = alpha·A·B (+ C when accumulate). A: row i at A + i·lda, K values. C: row i at C + i·ldc,
// N values; nothing else of C is touched. M, N or K ≤ 0: K ≤ 0 gives C = 0 (or C kept when
// accumulating), M or N ≤ 0 nothing.
void gemm(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* packed, float alpha,
          bool accumulate, float* C, int64_t ldc);

}  // namespace tessera::cpu_bf16_gemm
