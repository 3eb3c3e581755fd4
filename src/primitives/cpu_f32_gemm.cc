// Tessera primitives: f32 GEMM on packed panels (cpu_f32_gemm.h). The AVX-512 and AVX2 paths are
// compiled with target attributes and chosen at run time (isa()); the portable loop is the fallback.
#include "primitives/cpu_f32_gemm.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_ps() as their masked-off source, which
// -Wmaybe-uninitialized reports at every inlined use (a known false positive; cpu_bf16_gemm.cc too).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The same false positive as -Wuninitialized once the shared integer transpose inlines here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#define TESSERA_F32_TARGET __attribute__((target("avx512f")))
#define TESSERA_AVX2_TARGET __attribute__((target("avx2,fma")))
#include "primitives/cpu_avx512.h"
#endif

#include "core/env.h"
#include "primitives/cpu_convert.h"

namespace tessera::cpu_f32_gemm {
namespace {

int64_t panels_of(int64_t N) { return (N + kPanel - 1) / kPanel; }

// The k range a block of rows i0 .. i0 + rows takes (the causal shapes skip what is zero).
struct KRange {
  int64_t lo, hi;
};
KRange k_range(Tri tri, int64_t i0, int64_t rows, int64_t K) {
  if (tri == Tri::kLowerA) return {0, std::min(K, i0 + rows)};
  if (tri == Tri::kUpperA) return {std::min(K, i0), K};
  return {0, K};
}

// Row i of C keeps columns n < keep(i); kLowerC: n ≤ i.
int64_t keep_cols(Tri tri, int64_t i, int64_t N) { return tri == Tri::kLowerC ? std::min(N, i + 1) : N; }

constexpr int kMR = 6;  // rows of a register block (both SIMD kernels)

// Row block i0 .. i0 + rows (≤ kMR) of the panel at columns c0 .. c0 + width, as both SIMD walks
// take it: its k range, the columns it computes (kLowerC: up to its last row's diagonal), keep0
// (row i keeps the panel's columns < keep0 + i; ≥ width when all), where its A, C, Cin start.
struct RowBlock {
  int64_t rows;
  KRange kr;
  int64_t cols, keep0;
  const float* a;
  float* c;
  const float* ci;
};
inline RowBlock row_block(Tri tri, bool trans_a, int64_t M, int64_t K, int64_t i0, int64_t c0, int64_t width,
                          const float* A, int64_t lda, const float* Cin, int64_t ldci, float* C, int64_t ldc) {
  const int64_t rows = std::min<int64_t>(kMR, M - i0);
  const bool lower_c = tri == Tri::kLowerC;
  return {rows,
          k_range(tri, i0, rows, K),
          lower_c ? std::clamp<int64_t>(i0 + rows - c0, 0, width) : width,
          lower_c ? i0 + 1 - c0 : width,
          trans_a ? A + i0 : A + i0 * lda,
          C + i0 * ldc + c0,
          Cin + i0 * ldci + c0};
}

// walk(panel, c0, width) for every packed panel of B (K × N): both SIMD kernels' outer loop.
template <class Walk>
inline void each_panel(int64_t N, int64_t K, const float* packed, Walk&& walk) {
  for (int64_t p = 0; p < panels_of(N); ++p) walk(packed + p * K * kPanel, p * kPanel, std::min(kPanel, N - p * kPanel));
}

void gemm_portable(Tri tri, bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                   const float* packed, float beta, const float* Cin, int64_t ldci, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    const KRange kr = k_range(tri, i, 1, K);
    const int64_t keep = keep_cols(tri, i, N);
    for (int64_t n = 0; n < N; ++n) {
      float& c = C[i * ldc + n];
      if (n >= keep) {
        c = 0.0f;
        continue;
      }
      const float* b = packed + (n / kPanel) * K * kPanel + n % kPanel;
      float s = 0.0f;
      for (int64_t k = kr.lo; k < kr.hi; ++k) s += (trans_a ? A[k * lda + i] : A[i * lda + k]) * b[k * kPanel];
      c = alpha * s + (beta != 0.0f ? beta * Cin[i * ldci + n] : 0.0f);
    }
  }
}

#if defined(__x86_64__)
// Register block: MR rows × NV vectors of 16 columns (MR·NV zmm accumulators) of one panel, over
// k in kr. A at the block's first row (trans_a: its first column). Row i stores columns < cols,
// those ≥ keep0 + i as 0 (kLowerC; keep0 ≥ cols otherwise).
template <int MR, int NV, bool TA>
TESSERA_F32_TARGET void tile(KRange kr, const float* A, int64_t lda, const float* panel, int64_t cols, int64_t keep0,
                             float alpha, float beta, const float* Cin, int64_t ldci, float* C, int64_t ldc) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      acc[i][v] = _mm512_setzero_ps();
      // C's lines are loaded (beta ≠ 0) or written after the k loop: fetched meanwhile. A C of
      // strided rows (a large accumulator, one page per row) otherwise stalls every tile on DRAM.
      _mm_prefetch(reinterpret_cast<const char*>(C + i * ldc + 16 * v), _MM_HINT_T0);
    }
  for (int64_t k = kr.lo; k < kr.hi; ++k) {
    __m512 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(panel + k * kPanel + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(TA ? A[k * lda + i] : A[i * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int64_t left = cols - 16 * v;
    const __mmask16 m = cpu_avx512::lanes16(left);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      float* c = C + i * ldc + 16 * v;
      __m512 r = _mm512_mul_ps(acc[i][v], va);
      if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, Cin + i * ldci + 16 * v), r);
      const int64_t live = keep0 + i - 16 * v;  // lanes < live keep their value
      if (live < 16) r = _mm512_maskz_mov_ps(cpu_avx512::lanes16(live), r);
      _mm512_mask_storeu_ps(c, m, r);
    }
  }
}

constexpr int kNV = int(kPanel / 16);  // 24 accumulators + 4 B vectors + 1 broadcast of 32 zmm

// Rows `rows` (≤ MR) of one panel: columns 0 .. cols of it computed (vectors as needed), the
// panel's columns cols .. width set to 0 (kLowerC's blocks past the diagonal).
template <int MR, bool TA>
TESSERA_F32_TARGET void rows_tile(KRange kr, const float* A, int64_t lda, const float* panel, int64_t cols,
                                  int64_t width, int64_t keep0, float alpha, float beta, const float* Cin, int64_t ldci,
                                  float* C, int64_t ldc) {
  static_assert(kNV == 4, "the switch covers 1..4 vectors");
  switch ((cols + 15) / 16) {
    case 0: break;
    case 1: tile<MR, 1, TA>(kr, A, lda, panel, cols, keep0, alpha, beta, Cin, ldci, C, ldc); break;
    case 2: tile<MR, 2, TA>(kr, A, lda, panel, cols, keep0, alpha, beta, Cin, ldci, C, ldc); break;
    case 3: tile<MR, 3, TA>(kr, A, lda, panel, cols, keep0, alpha, beta, Cin, ldci, C, ldc); break;
    default: tile<MR, kNV, TA>(kr, A, lda, panel, cols, keep0, alpha, beta, Cin, ldci, C, ldc); break;
  }
  if (cols < width)
    for (int i = 0; i < MR; ++i) std::fill(C + i * ldc + cols, C + i * ldc + width, 0.0f);
}

template <int MR, bool TA>
TESSERA_F32_TARGET void tail_rows(int64_t rows, KRange kr, const float* A, int64_t lda, const float* panel, int64_t cols,
                                  int64_t width, int64_t keep0, float alpha, float beta, const float* Cin, int64_t ldci,
                                  float* C, int64_t ldc) {
  if constexpr (MR > 0) {
    if (rows == MR) return rows_tile<MR, TA>(kr, A, lda, panel, cols, width, keep0, alpha, beta, Cin, ldci, C, ldc);
    tail_rows<MR - 1, TA>(rows, kr, A, lda, panel, cols, width, keep0, alpha, beta, Cin, ldci, C, ldc);
  }
}

// Every row of one panel (columns c0 .. c0 + width), kMR rows at a time.
template <bool TA>
TESSERA_F32_TARGET void panel_rows(Tri tri, int64_t M, int64_t K, const float* A, int64_t lda, const float* panel,
                                   int64_t c0, int64_t width, float alpha, float beta, const float* Cin, int64_t ldci,
                                   float* C, int64_t ldc) {
  for (int64_t i0 = 0; i0 < M; i0 += kMR) {
    const RowBlock r = row_block(tri, TA, M, K, i0, c0, width, A, lda, Cin, ldci, C, ldc);
    if (r.rows == kMR) rows_tile<kMR, TA>(r.kr, r.a, lda, panel, r.cols, width, r.keep0, alpha, beta, r.ci, ldci, r.c, ldc);
    else tail_rows<kMR - 1, TA>(r.rows, r.kr, r.a, lda, panel, r.cols, width, r.keep0, alpha, beta, r.ci, ldci, r.c, ldc);
  }
}

TESSERA_F32_TARGET void gemm_avx512(Tri tri, bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                                    int64_t lda, const float* packed, float beta, const float* Cin, int64_t ldci, float* C,
                                    int64_t ldc) {
  each_panel(N, K, packed, [&](const float* panel, int64_t c0, int64_t width) {
    if (trans_a) panel_rows<true>(tri, M, K, A, lda, panel, c0, width, alpha, beta, Cin, ldci, C, ldc);
    else panel_rows<false>(tri, M, K, A, lda, panel, c0, width, alpha, beta, Cin, ldci, C, ldc);
  });
}

// A 16 × 16 block transposed: rows [0, nr) of src (row stride lds; columns [0, nc), the rest read
// as 0; rows past nr read as 0) become rows [0, nc) of dst (row stride ldd), each stored under
// `store` (the lanes written: all 16 when dst is a zero-padded panel, the first nr otherwise).
TESSERA_F32_TARGET inline void transpose_block(const float* src, int64_t lds, int64_t nr, int64_t nc, float* dst,
                                               int64_t ldd, __mmask16 store) {
  const __mmask16 mc = cpu_avx512::lanes16(nc);
  __m512i r[16];
  for (int i = 0; i < 16; ++i)
    r[i] = i < nr ? _mm512_castps_si512(_mm512_maskz_loadu_ps(mc, src + i * lds)) : _mm512_setzero_si512();
  cpu_avx512::transpose16(r);
  for (int64_t c = 0; c < nc; ++c) _mm512_mask_storeu_ps(dst + c * ldd, store, _mm512_castsi512_ps(r[c]));
}

// pack with trans_b: 16 columns × 16 values of k at a time (the panel's padding columns get 0).
TESSERA_F32_TARGET void pack_trans_avx512(int64_t K, int64_t N, const float* B, int64_t ldb, float* packed) {
  for (int64_t c0 = 0; c0 < panels_of(N) * kPanel; c0 += 16) {
    float* dst = packed + (c0 / kPanel) * K * kPanel + c0 % kPanel;
    const int64_t ncols = std::clamp<int64_t>(N - c0, 0, 16);
    for (int64_t k0 = 0; k0 < K; k0 += 16)
      transpose_block(B + c0 * ldb + k0, ldb, ncols, std::min<int64_t>(16, K - k0), dst + k0 * kPanel, kPanel,
                      __mmask16(0xffff));
  }
}

// transpose: 16 × 16 blocks, masked at the edges.
TESSERA_F32_TARGET void transpose_avx512(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst, int64_t ldd) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t nr = std::min<int64_t>(16, rows - r0);
    const __mmask16 mr = cpu_avx512::lanes16(nr);
    for (int64_t c0 = 0; c0 < cols; c0 += 16)
      transpose_block(src + r0 * lds + c0, lds, nr, std::min<int64_t>(16, cols - c0), dst + c0 * ldd + r0, ldd, mr);
  }
}
// ---------------------------------------------------------------- AVX2 (+ FMA)
// Register block: MR rows × NV vectors of 8 columns (MR·NV ymm accumulators, ≤ 12 of 16 with the
// B vectors and the broadcast), at `panel` = the block's first column within its panel. Each
// element is the same FMA chain and the same epilogue as the AVX-512 tile, so both give the same
// bits. Whole blocks store plainly; an edge block (columns < 8·NV, or kLowerC's diagonal) goes
// through a row buffer: Zen microcodes vmaskmovps stores (about one per 12 cycles).
template <int MR, int NV, bool TA>
TESSERA_AVX2_TARGET void tile2(KRange kr, const float* A, int64_t lda, const float* panel, int64_t cols, int64_t keep0,
                               float alpha, float beta, const float* Cin, int64_t ldci, float* C, int64_t ldc) {
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      acc[i][v] = _mm256_setzero_ps();
      _mm_prefetch(reinterpret_cast<const char*>(C + i * ldc + 8 * v), _MM_HINT_T0);
    }
#pragma GCC unroll 4
  for (int64_t k = kr.lo; k < kr.hi; ++k) {
    __m256 b[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) b[v] = _mm256_loadu_ps(panel + k * kPanel + 8 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(TA ? A + k * lda + i : A + i * lda + k);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  const bool whole = cols == 8 * NV && keep0 >= 8 * NV;
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    alignas(32) float row[8 * NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      __m256 r = _mm256_mul_ps(acc[i][v], va);
      if (whole) {
        if (beta != 0.0f) r = _mm256_fmadd_ps(vb, _mm256_loadu_ps(Cin + i * ldci + 8 * v), r);
        _mm256_storeu_ps(C + i * ldc + 8 * v, r);
      } else {
        _mm256_store_ps(row + 8 * v, r);
      }
    }
    if (whole) continue;
    for (int64_t c = 0; c < cols; ++c) {  // the vector path's arithmetic, one lane at a time
      const float r = beta != 0.0f ? std::fma(beta, Cin[i * ldci + c], row[c]) : row[c];
      C[i * ldc + c] = c < keep0 + i ? r : 0.0f;
    }
  }
}

// One MR-row, 16-column block of a panel: its first n columns computed (none for n ≤ 0), the rest
// of its w columns set to 0 (kLowerC's columns past the diagonal).
template <int MR, bool TA>
TESSERA_AVX2_TARGET void block2(KRange kr, const float* A, int64_t lda, const float* panel, int64_t n, int64_t w,
                                int64_t keep0, float alpha, float beta, const float* Cin, int64_t ldci, float* C,
                                int64_t ldc) {
  if (n > 8)
    tile2<MR, 2, TA>(kr, A, lda, panel, n, keep0, alpha, beta, Cin, ldci, C, ldc);
  else if (n > 0)
    tile2<MR, 1, TA>(kr, A, lda, panel, n, keep0, alpha, beta, Cin, ldci, C, ldc);
  const int64_t z0 = std::max<int64_t>(n, 0);
  if (z0 < w)
    for (int i = 0; i < MR; ++i) std::fill(C + i * ldc + z0, C + i * ldc + w, 0.0f);
}

template <int MR, bool TA>
TESSERA_AVX2_TARGET void tail_block2(int64_t rows, KRange kr, const float* A, int64_t lda, const float* panel,
                                     int64_t n, int64_t w, int64_t keep0, float alpha, float beta, const float* Cin,
                                     int64_t ldci, float* C, int64_t ldc) {
  if constexpr (MR > 0) {
    if (rows == MR) return block2<MR, TA>(kr, A, lda, panel, n, w, keep0, alpha, beta, Cin, ldci, C, ldc);
    tail_block2<MR - 1, TA>(rows, kr, A, lda, panel, n, w, keep0, alpha, beta, Cin, ldci, C, ldc);
  }
}

// Every row of one panel: a 16-column block of it at a time, kMR rows at a time within it, so
// that the block's K × 16 values of B stay in L1 while the rows of A stream past (the other order
// re-reads the whole K × 64 panel from L2 for every 6 rows: 73 against 86 GFLOP/s at K = 256).
template <bool TA>
TESSERA_AVX2_TARGET void panel_rows2(Tri tri, int64_t M, int64_t K, const float* A, int64_t lda, const float* panel,
                                     int64_t c0, int64_t width, float alpha, float beta, const float* Cin, int64_t ldci,
                                     float* C, int64_t ldc) {
  for (int64_t b0 = 0; b0 < width; b0 += 16) {
    const int64_t w = std::min<int64_t>(16, width - b0);
    for (int64_t i0 = 0; i0 < M; i0 += kMR) {
      const RowBlock r = row_block(tri, TA, M, K, i0, c0, width, A, lda, Cin, ldci, C, ldc);
      const int64_t n = std::min(r.cols - b0, w), keep0 = r.keep0 - b0;
      if (r.rows == kMR) block2<kMR, TA>(r.kr, r.a, lda, panel + b0, n, w, keep0, alpha, beta, r.ci + b0, ldci, r.c + b0, ldc);
      else tail_block2<kMR - 1, TA>(r.rows, r.kr, r.a, lda, panel + b0, n, w, keep0, alpha, beta, r.ci + b0, ldci, r.c + b0, ldc);
    }
  }
}

TESSERA_AVX2_TARGET void gemm_avx2(Tri tri, bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                                   int64_t lda, const float* packed, float beta, const float* Cin, int64_t ldci, float* C,
                                   int64_t ldc) {
  each_panel(N, K, packed, [&](const float* panel, int64_t c0, int64_t width) {
    if (trans_a) panel_rows2<true>(tri, M, K, A, lda, panel, c0, width, alpha, beta, Cin, ldci, C, ldc);
    else panel_rows2<false>(tri, M, K, A, lda, panel, c0, width, alpha, beta, Cin, ldci, C, ldc);
  });
}

// r[i] = row i of an 8 × 8 block of floats; afterwards r[i] = column i.
TESSERA_AVX2_TARGET inline void transpose8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44), r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44), r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
    t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
  }
  for (int i = 0; i < 8; ++i) r[i] = t[i];
}

// dst[c][r] = src[r][c] over an nr × nc block (≤ 8 × 8): whole blocks in registers, edges one
// value at a time (dst row stride ldd).
TESSERA_AVX2_TARGET inline void transpose_block8(const float* src, int64_t lds, int64_t nr, int64_t nc, float* dst,
                                                 int64_t ldd) {
  if (nr < 8 || nc < 8) {
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t c = 0; c < nc; ++c) dst[c * ldd + r] = src[r * lds + c];
    return;
  }
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  transpose8(r);
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + i * ldd, r[i]);
}

// pack with trans_b: 8 columns × 8 values of k at a time; the panel's padding columns get 0.
TESSERA_AVX2_TARGET void pack_trans_avx2(int64_t K, int64_t N, const float* B, int64_t ldb, float* packed) {
  for (int64_t c0 = 0; c0 < panels_of(N) * kPanel; c0 += 8) {
    float* dst = packed + (c0 / kPanel) * K * kPanel + c0 % kPanel;
    const int64_t ncols = std::clamp<int64_t>(N - c0, 0, 8);
    if (ncols < 8)  // the panel's last columns: zeros where no column of B is
      for (int64_t k = 0; k < K; ++k) std::fill(dst + k * kPanel + ncols, dst + k * kPanel + 8, 0.0f);
    for (int64_t k0 = 0; k0 < K; k0 += 8)
      transpose_block8(B + c0 * ldb + k0, ldb, ncols, std::min<int64_t>(8, K - k0), dst + k0 * kPanel, kPanel);
  }
}

TESSERA_AVX2_TARGET void transpose_avx2(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst,
                                        int64_t ldd) {
  for (int64_t r0 = 0; r0 < rows; r0 += 8)
    for (int64_t c0 = 0; c0 < cols; c0 += 8)
      transpose_block8(src + r0 * lds + c0, lds, std::min<int64_t>(8, rows - r0), std::min<int64_t>(8, cols - c0),
                       dst + c0 * ldd + r0, ldd);
}
#endif

}  // namespace

void transpose(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst, int64_t ldd) {
#if defined(__x86_64__)
  const Isa which = isa();
  if (which == Isa::kAvx512) return transpose_avx512(rows, cols, src, lds, dst, ldd);
  if (which == Isa::kAvx2) return transpose_avx2(rows, cols, src, lds, dst, ldd);
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

Isa isa() {
#if defined(__x86_64__)
  static const Isa have = __builtin_cpu_supports("avx512f")                                   ? Isa::kAvx512
                          : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Isa::kAvx2
                                                                                             : Isa::kPortable;
  std::string v = env::get("TESSERA_CPU_F32_GEMM").value_or("");
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (v == "portable") return Isa::kPortable;  // isa_name's spellings cap the kernel
  if (v == "avx2") return std::min(have, Isa::kAvx2);
  if (v == "avx512") return have;
  return env::flag("TESSERA_CPU_F32_GEMM", true) ? have : Isa::kPortable;
#else
  return Isa::kPortable;
#endif
}

const char* isa_name(Isa isa) {
  return isa == Isa::kAvx512 ? "avx512" : isa == Isa::kAvx2 ? "avx2" : "portable";
}

bool available() { return isa() == Isa::kAvx512; }

int64_t packed_floats(int64_t K, int64_t N) { return panels_of(N) * std::max<int64_t>(K, 0) * kPanel; }

void pack(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb, float* packed) {
  if (K <= 0 || N <= 0) return;
#if defined(__x86_64__)
  if (trans_b && isa() == Isa::kAvx512) return pack_trans_avx512(K, N, B, ldb, packed);
  if (trans_b && isa() == Isa::kAvx2) return pack_trans_avx2(K, N, B, ldb, packed);
#endif
  if (!trans_b) {  // row by row, front to back: a strided B (rows of a large matrix) is read once, in order
    for (int64_t k = 0; k < K; ++k)
      for (int64_t p = 0; p < panels_of(N); ++p) {
        const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
        float* dst = packed + (p * K + k) * kPanel;
        std::memcpy(dst, B + k * ldb + n0, size_t(cols) * sizeof(float));
        std::fill(dst + cols, dst + kPanel, 0.0f);
      }
    return;
  }
  for (int64_t p = 0; p < panels_of(N); ++p) {
    const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
    float* dst = packed + p * K * kPanel;
    for (int64_t k = 0; k < K; ++k, dst += kPanel) {
      for (int64_t c = 0; c < cols; ++c) dst[c] = B[(n0 + c) * ldb + k];
      std::fill(dst + cols, dst + kPanel, 0.0f);
    }
  }
}

int64_t pack_half_scratch(bool trans_b, int64_t K) { return trans_b ? kPanel * std::max<int64_t>(K, 0) : 0; }

void pack_half(bool trans_b, int64_t K, int64_t N, const uint16_t* B, int64_t ldb, bool is_bf16, float* packed,
               float* scratch) {
  if (K <= 0 || N <= 0) return;
  if (!trans_b) {  // row by row as pack: each panel's piece of row k widened into place
    for (int64_t k = 0; k < K; ++k)
      for (int64_t p = 0; p < panels_of(N); ++p) {
        const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
        float* dst = packed + (p * K + k) * kPanel;
        cpu_convert::half_to_f32(B + k * ldb + n0, is_bf16, dst, cols);
        std::fill(dst + cols, dst + kPanel, 0.0f);
      }
    return;
  }
  for (int64_t p = 0; p < panels_of(N); ++p) {  // a panel's rows of B widened into scratch [cols × K], then packed
    const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
    for (int64_t c = 0; c < cols; ++c) cpu_convert::half_to_f32(B + (n0 + c) * ldb, is_bf16, scratch + c * K, K);
    pack(true, K, cols, scratch, K, packed + p * K * kPanel);  // one panel: its layout at its offset
  }
}

void gemm_from(Tri tri, bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* packed, float beta, const float* Cin, int64_t ldci, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t n = 0; n < N; ++n)
        C[i * ldc + n] = beta != 0.0f && n < keep_cols(tri, i, N) ? beta * Cin[i * ldci + n] : 0.0f;
    return;
  }
#if defined(__x86_64__)
  const Isa which = isa();
  if (which == Isa::kAvx512) return gemm_avx512(tri, trans_a, M, N, K, alpha, A, lda, packed, beta, Cin, ldci, C, ldc);
  if (which == Isa::kAvx2) return gemm_avx2(tri, trans_a, M, N, K, alpha, A, lda, packed, beta, Cin, ldci, C, ldc);
#endif
  gemm_portable(tri, trans_a, M, N, K, alpha, A, lda, packed, beta, Cin, ldci, C, ldc);
}

void gemm(Tri tri, bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* packed, float beta, float* C, int64_t ldc) {
  gemm_from(tri, trans_a, M, N, K, alpha, A, lda, packed, beta, C, ldc, C, ldc);
}

}  // namespace tessera::cpu_f32_gemm
