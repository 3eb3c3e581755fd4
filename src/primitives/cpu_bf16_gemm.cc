// Tessera primitives: bf16 GEMM on packed panels (cpu_bf16_gemm.h). The AVX512-BF16 path is
// compiled with target attributes and chosen at run time; the portable loop is the fallback.
#include "primitives/cpu_bf16_gemm.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
// GCC 12's AVX-512 unpack intrinsics pass _mm512_undefined_epi32() as their masked-off source,
// which -Wmaybe-uninitialized reports at every inlined use (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TESSERA_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#include "primitives/cpu_avx512.h"
#endif

#include "core/env.h"

namespace tessera::cpu_bf16_gemm {
namespace {

int64_t pairs_of(int64_t K) { return (K + 1) / 2; }
int64_t panels_of(int64_t N) { return (N + kPanel - 1) / kPanel; }

// The pair (v[2k], v[2k+1]) of a K-vector as one word; an odd K's last pair has a zero high half.
inline uint32_t pair(const uint16_t* v, int64_t k, int64_t K) {
  if (2 * k + 1 < K) {
    uint32_t w;
    std::memcpy(&w, v + 2 * k, sizeof w);  // little endian: v[2k] low, v[2k+1] high
    return w;
  }
  return v[2 * k];
}

float bf16_lo(uint32_t w) {
  const uint32_t u = w << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
float bf16_hi(uint32_t w) {
  const uint32_t u = w & 0xffff0000u;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The portable loop over the packed layout: pair sums in f32, as the instruction forms them.
void gemm_portable(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* packed,
                   float alpha, bool accumulate, float* C, int64_t ldc) {
  const int64_t K2 = pairs_of(K);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) {
      const uint32_t* b = packed + (n / kPanel) * K2 * kPanel + n % kPanel;
      float s = 0.0f;
      for (int64_t k = 0; k < K2; ++k) {
        const uint32_t a = pair(A + i * lda, k, K), w = b[k * kPanel];
        s += bf16_lo(a) * bf16_lo(w) + bf16_hi(a) * bf16_hi(w);
      }
      float& c = C[i * ldc + n];
      c = alpha * s + (accumulate ? c : 0.0f);
    }
}

#if defined(__x86_64__)
constexpr int64_t kPrefetchMinK = 128;  // K from which a tile prefetches its C lines

// Register block: MR rows × NV vectors of 16 columns (MR·NV zmm accumulators), columns c0 ..
// c0 + 16·NV of the packed B (those past N are zero in the panel and never stored).
template <int MR, int NV>
TESSERA_BF16_TARGET void tile(int64_t K, const uint16_t* A, int64_t lda, const uint32_t* packed, int64_t c0,
                              int64_t cols, float alpha, bool accumulate, float* C, int64_t ldc) {
  const int64_t K2 = pairs_of(K), full = K / 2;
  const uint32_t* bp[NV];
  for (int v = 0; v < NV; ++v) {
    const int64_t c = c0 + 16 * v;
    bp[v] = packed + (c / kPanel) * K2 * kPanel + c % kPanel;
  }
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < full; ++k) {
    __m512bh b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512(bp[v] + k * kPanel);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      uint32_t w;
      std::memcpy(&w, A + i * lda + 2 * k, sizeof w);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(w));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
    }
  }
  if (full < K2) {  // odd K: the last value alone (its pair's high half is zero in B and here)
    __m512bh b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512(bp[v] + full * kPanel);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(A[i * lda + K - 1]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int64_t left = cols - 16 * v;
    const __mmask16 m = cpu_avx512::lanes16(left);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float* c = C + i * ldc + c0 + 16 * v;
      __m512 r = _mm512_mul_ps(acc[i][v], va);
      if (accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, c));
      _mm512_mask_storeu_ps(c, m, r);
    }
  }
}

constexpr int kMR = 4, kNV = 4;  // 16 accumulators (docs/knowledge: ≤ ~16–20 on AVX-512)

// Rows i0 .. i0 + rows (rows ≤ kMR) against columns c0 .. c0 + cols (cols ≤ 16·kNV).
template <int MR>
TESSERA_BF16_TARGET void rows_tile(int64_t K, const uint16_t* A, int64_t lda, const uint32_t* packed, int64_t c0,
                                   int64_t cols, float alpha, bool accumulate, float* C, int64_t ldc) {
  // The tile's C lines now, so that its epilogue does not wait on memory (a C far larger than
  // the caches: linear_cross_entropy's dw accumulator and logits slab). Not for a short K, where
  // C is usually hot; here rather than in tile(), whose code stays as it was measured.
  if (K >= kPrefetchMinK)
    for (int i = 0; i < MR; ++i)
      for (int64_t c = 0; c < cols; c += 16)
        _mm_prefetch(reinterpret_cast<const char*>(C + i * ldc + c0 + c), _MM_HINT_T0);
  switch ((cols + 15) / 16) {
    case 1: return tile<MR, 1>(K, A, lda, packed, c0, cols, alpha, accumulate, C, ldc);
    case 2: return tile<MR, 2>(K, A, lda, packed, c0, cols, alpha, accumulate, C, ldc);
    case 3: return tile<MR, 3>(K, A, lda, packed, c0, cols, alpha, accumulate, C, ldc);
    default: return tile<MR, kNV>(K, A, lda, packed, c0, cols, alpha, accumulate, C, ldc);
  }
}

// The last `rows` (< MR) rows of a row panel, one instantiation per count.
template <int MR>
TESSERA_BF16_TARGET void tail_rows(int64_t rows, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* packed,
                                   int64_t c0, int64_t cols, float alpha, bool accumulate, float* C, int64_t ldc) {
  if constexpr (MR > 0) {
    if (rows == MR) return rows_tile<MR>(K, A, lda, packed, c0, cols, alpha, accumulate, C, ldc);
    tail_rows<MR - 1>(rows, K, A, lda, packed, c0, cols, alpha, accumulate, C, ldc);
  }
}

// Columns c0 .. c0 + cols of every row, MR rows at a time.
template <int MR>
TESSERA_BF16_TARGET void column_block(int64_t M, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* packed,
                                      int64_t c0, int64_t cols, float alpha, bool accumulate, float* C, int64_t ldc) {
  int64_t i = 0;
  for (; i + MR <= M; i += MR) rows_tile<MR>(K, A + i * lda, lda, packed, c0, cols, alpha, accumulate, C + i * ldc, ldc);
  tail_rows<MR - 1>(M - i, K, A + i * lda, lda, packed, c0, cols, alpha, accumulate, C + i * ldc, ldc);
}

// 4 rows × 4 vectors; a block one vector wide (N ≤ 16) takes 8 rows, so that 8 independent
// accumulators hide the dot product's latency (4 ran at 67 % of the peak, measured).
TESSERA_BF16_TARGET void gemm_avx512(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                                     const uint32_t* packed, float alpha, bool accumulate, float* C, int64_t ldc) {
  static_assert(kNV == 4 && kPanel % 16 == 0, "rows_tile's switch covers 1..4 vectors");
  for (int64_t c0 = 0; c0 < N; c0 += 16 * kNV) {
    const int64_t cols = std::min<int64_t>(16 * kNV, N - c0);
    if (cols <= 16) column_block<2 * kMR>(M, K, A, lda, packed, c0, cols, alpha, accumulate, C, ldc);
    else column_block<kMR>(M, K, A, lda, packed, c0, cols, alpha, accumulate, C, ldc);
  }
}

using cpu_avx512::transpose16;  // primitives/cpu_avx512.h

// pack_cols: 16 columns × 16 whole pairs at a time through transpose16; an odd K's last pair
// (whose high half lies past the column) word by word.
TESSERA_BF16_TARGET void pack_cols_avx512(const uint16_t* const* cols, int64_t K, int64_t N, uint32_t* packed) {
  const int64_t K2 = pairs_of(K), full = K / 2;
  for (int64_t c0 = 0; c0 < panels_of(N) * kPanel; c0 += 16) {
    uint32_t* dst = packed + (c0 / kPanel) * K2 * kPanel + c0 % kPanel;
    const int64_t ncols = std::clamp<int64_t>(N - c0, 0, 16);
    for (int64_t k0 = 0; k0 < full; k0 += 16) {
      const __mmask16 m = cpu_avx512::lanes16(full - k0);
      __m512i r[16];
      for (int c = 0; c < 16; ++c)
        r[c] = c < ncols ? _mm512_maskz_loadu_epi32(m, cols[c0 + c] + 2 * k0) : _mm512_setzero_si512();
      transpose16(r);
      for (int64_t k = 0; k < std::min<int64_t>(16, full - k0); ++k) _mm512_storeu_si512(dst + (k0 + k) * kPanel, r[k]);
    }
    if (full < K2)
      for (int64_t c = 0; c < 16; ++c) dst[full * kPanel + c] = c < ncols ? cols[c0 + c][K - 1] : 0u;
  }
}

// Lane indices for _mm512_permutex2var_epi16(a, idx, b) that interleave a and b: 16-bit lane
// 2c takes a[c0 + c], lane 2c + 1 takes b[c0 + c] (b's lanes are 32 .. 63).
struct Interleave {
  alignas(64) uint16_t idx[2][32];
  Interleave() {
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 32; ++j) idx[h][j] = static_cast<uint16_t>(16 * h + j / 2 + (j % 2 ? 32 : 0));
  }
};

// pack_rows: per pair of rows, 32 columns as two vectors of interleaved 16-bit lanes.
TESSERA_BF16_TARGET void pack_rows_avx512(const uint16_t* const* rows, int64_t K, int64_t N, uint32_t* packed) {
  static const Interleave lanes;
  const __m512i i0 = _mm512_load_si512(lanes.idx[0]), i1 = _mm512_load_si512(lanes.idx[1]);
  const int64_t K2 = pairs_of(K);
  // Pairs of rows outer, panels inner: each row is read front to back (a strided w far larger
  // than the caches streams at the prefetcher's rate; panel-outer touched one line per row).
  for (int64_t k = 0; k < K2; ++k)
    for (int64_t p = 0; p < panels_of(N); ++p) {
      const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
      const __mmask32 m = cols >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << cols) - 1u);
      if (2 * k + 3 < K) {  // the next pair of rows, one pair ahead
        _mm_prefetch(reinterpret_cast<const char*>(rows[2 * k + 2] + n0), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(rows[2 * k + 3] + n0), _MM_HINT_T0);
      }
      const __m512i a = _mm512_maskz_loadu_epi16(m, rows[2 * k] + n0);
      const __m512i b = 2 * k + 1 < K ? _mm512_maskz_loadu_epi16(m, rows[2 * k + 1] + n0) : _mm512_setzero_si512();
      uint32_t* dst = packed + (p * K2 + k) * kPanel;
      _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(a, i0, b));
      _mm512_storeu_si512(dst + 16, _mm512_permutex2var_epi16(a, i1, b));
    }
}
#endif

}  // namespace

Mode mode() {
#if defined(__x86_64__)
  static const bool have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
#else
  static const bool have = false;
#endif
  const std::string v = env::get("TESSERA_CPU_BF16_DOT").value_or("");
  if (v.size() == 8 && std::equal(v.begin(), v.end(), "portable", [](char a, char b) { return std::tolower(a) == b; }))
    return Mode::kPortable;
  return have && env::flag("TESSERA_CPU_BF16_DOT", true) ? Mode::kNative : Mode::kOff;
}

bool available() { return mode() != Mode::kOff; }
bool native() { return mode() == Mode::kNative; }

int64_t packed_words(int64_t K, int64_t N) { return panels_of(N) * pairs_of(K) * kPanel; }

void pack_rows(const uint16_t* const* rows, int64_t K, int64_t N, uint32_t* packed) {
#if defined(__x86_64__)
  if (native()) return pack_rows_avx512(rows, K, N, packed);
#endif
  const int64_t K2 = pairs_of(K);
  static const uint16_t zero_row[kPanel] = {};
  for (int64_t p = 0; p < panels_of(N); ++p) {
    const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
    for (int64_t k = 0; k < K2; ++k) {
      const uint16_t* lo = rows[2 * k] + n0;
      const uint16_t* hi = 2 * k + 1 < K ? rows[2 * k + 1] + n0 : zero_row;
      uint32_t* dst = packed + (p * K2 + k) * kPanel;
      int64_t c = 0;
      for (; c < cols; ++c) dst[c] = uint32_t{lo[c]} | uint32_t{hi[c]} << 16;
      for (; c < kPanel; ++c) dst[c] = 0u;
    }
  }
}

void pack_cols(const uint16_t* const* cols, int64_t K, int64_t N, uint32_t* packed) {
#if defined(__x86_64__)
  if (native()) return pack_cols_avx512(cols, K, N, packed);
#endif
  const int64_t K2 = pairs_of(K);
  for (int64_t p = 0; p < panels_of(N); ++p) {
    uint32_t* dst = packed + p * K2 * kPanel;
    const int64_t n0 = p * kPanel, ncols = std::min(kPanel, N - n0);
    for (int64_t c = 0; c < kPanel; ++c)
      for (int64_t k = 0; k < K2; ++k) dst[k * kPanel + c] = c < ncols ? pair(cols[n0 + c], k, K) : 0u;
  }
}

void gemm(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* packed, float alpha,
          bool accumulate, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return;
  }
#if defined(__x86_64__)
  if (native()) return gemm_avx512(M, N, K, A, lda, packed, alpha, accumulate, C, ldc);
#endif
  gemm_portable(M, N, K, A, lda, packed, alpha, accumulate, C, ldc);
}

}  // namespace tessera::cpu_bf16_gemm
