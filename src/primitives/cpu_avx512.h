// Tessera primitives: AVX-512 pieces shared by cpu_f32_gemm and cpu_bf16_gemm — the mask of a
// tile's first lanes, and the 16 × 16 transpose of 32-bit lanes (f32 values; pairs of bf16 in one
// word). Compiled
// with a target attribute: include it only from x86-64 code that chooses the AVX-512 path at run
// time (the callers' own target attributes are supersets of avx512f, so it inlines).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

namespace tessera::cpu_avx512 {

// The first n of 16 lanes (none for n ≤ 0, all for n ≥ 16): a tile's edge.
inline __mmask16 lanes16(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
}

// r[i] = row i of a 16 × 16 block of 32-bit words; afterwards r[i] = column i.
__attribute__((target("avx512f"))) inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]), r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]), r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

}  // namespace tessera::cpu_avx512
#endif
