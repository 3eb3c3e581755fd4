#include "primitives/cpu_philox.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "primitives/philox.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tessera::cpu_philox {
namespace {

namespace philox = primitives::philox;
constexpr int kMaxSets = 4;  // AVX-512 vectors of 16 counters per batch, at most (256 keys)

// The 64·sets words of calls g0 .. g0 + 16·sets − 1 (counters (g, i, h, n)) in key order:
// out[4·l + w] = word w of call g0 + l. Portable: one call after another.
void batch_portable(int sets, uint32_t g0, uint32_t i, uint32_t h, uint32_t n, uint32_t k0, uint32_t k1,
                    uint32_t* out) {
  for (uint32_t l = 0; l < 16u * static_cast<uint32_t>(sets); ++l) {
    const philox::Words w = philox::philox4x32_10(philox::Words{{g0 + l, i, h, n}}, k0, k1);
    std::memcpy(out + 4 * l, w.w, sizeof w.w);
  }
}

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_epi32() as their masked-off source, which
// -W(maybe-)uninitialized reports at every inlined use (a known false positive; as in
// primitives/cpu_bf16_gemm.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The high and low 32 bits of m · x per 32-bit lane (m the same in every lane): vpmuludq takes
// the even lanes; the odd ones are shifted down, multiplied, and blended back.
__attribute__((target("avx512f"))) inline void mulhilo16(__m512i m, __m512i x, __m512i* hi, __m512i* lo) {
  const __mmask16 odd = 0xAAAA;
  const __m512i pe = _mm512_mul_epu32(x, m), po = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), m);
  *hi = _mm512_mask_blend_epi32(odd, _mm512_srli_epi64(pe, 32), po);
  *lo = _mm512_mask_blend_epi32(odd, pe, _mm512_slli_epi64(po, 32));
}

// batch_portable with the calls in the lanes of AVX-512 vectors, kSets vectors of 16 at once
// (independent chains: the multiplies of one round overlap; out 64-byte aligned).
template <int kSets>
__attribute__((target("avx512f"))) void batch_avx512(uint32_t g0, uint32_t i, uint32_t h, uint32_t n, uint32_t k0,
                                                     uint32_t k1, uint32_t* out) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u)), m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i c0[kSets], c1[kSets], c2[kSets], c3[kSets];
  for (int v = 0; v < kSets; ++v) {
    c0[v] = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(g0 + 16u * static_cast<uint32_t>(v))), iota);
    c1[v] = _mm512_set1_epi32(static_cast<int>(i));
    c2[v] = _mm512_set1_epi32(static_cast<int>(h));
    c3[v] = _mm512_set1_epi32(static_cast<int>(n));
  }
  for (int round = 0; round < 10; ++round) {
    const __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0)), key1 = _mm512_set1_epi32(static_cast<int>(k1));
    for (int v = 0; v < kSets; ++v) {
      __m512i hi0, lo0, hi1, lo1;
      mulhilo16(m0, c0[v], &hi0, &lo0);
      mulhilo16(m1, c2[v], &hi1, &lo1);
      c0[v] = _mm512_xor_si512(_mm512_xor_si512(hi1, c1[v]), key0);
      c1[v] = lo1;
      c2[v] = _mm512_xor_si512(_mm512_xor_si512(hi0, c3[v]), key1);
      c3[v] = lo0;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // Into key order: a 4 × 4 transpose of words inside each 128-bit lane (r_m lane q = call 4q + m),
  // then the lanes gathered so that output vector u holds calls 4u .. 4u+3.
  for (int v = 0; v < kSets; ++v) {
    const __m512i a0 = _mm512_unpacklo_epi32(c0[v], c1[v]), a1 = _mm512_unpackhi_epi32(c0[v], c1[v]);
    const __m512i b0 = _mm512_unpacklo_epi32(c2[v], c3[v]), b1 = _mm512_unpackhi_epi32(c2[v], c3[v]);
    const __m512i r0 = _mm512_unpacklo_epi64(a0, b0), r1 = _mm512_unpackhi_epi64(a0, b0);
    const __m512i r2 = _mm512_unpacklo_epi64(a1, b1), r3 = _mm512_unpackhi_epi64(a1, b1);
    const __m512i t0 = _mm512_shuffle_i32x4(r0, r1, 0x44), t1 = _mm512_shuffle_i32x4(r2, r3, 0x44);  // lanes 0, 1
    const __m512i t2 = _mm512_shuffle_i32x4(r0, r1, 0xEE), t3 = _mm512_shuffle_i32x4(r2, r3, 0xEE);  // lanes 2, 3
    uint32_t* o = out + 64 * v;
    _mm512_store_si512(o, _mm512_shuffle_i32x4(t0, t1, 0x88));
    _mm512_store_si512(o + 16, _mm512_shuffle_i32x4(t0, t1, 0xDD));
    _mm512_store_si512(o + 32, _mm512_shuffle_i32x4(t2, t3, 0x88));
    _mm512_store_si512(o + 48, _mm512_shuffle_i32x4(t2, t3, 0xDD));
  }
}

#pragma GCC diagnostic pop

bool have_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}
#endif

std::atomic<bool> g_portable{false};

// One batch of `sets` × 16 calls (sets in 1 .. kMaxSets).
void batch(int sets, uint32_t g0, uint32_t i, uint32_t h, uint32_t n, uint32_t k0, uint32_t k1, uint32_t* out) {
#if defined(__x86_64__)
  if (have_avx512() && !g_portable.load(std::memory_order_relaxed)) {
    if (sets == 1) return batch_avx512<1>(g0, i, h, n, k0, k1, out);
    if (sets == 2) return batch_avx512<2>(g0, i, h, n, k0, k1, out);
    return batch_avx512<kMaxSets>(g0, i, h, n, k0, k1, out);
  }
#endif
  batch_portable(sets, g0, i, h, n, k0, k1, out);
}

}  // namespace

bool vectorized() {
#if defined(__x86_64__)
  return have_avx512() && !g_portable.load();
#else
  return false;
#endif
}
void force_portable(bool on) { g_portable.store(on); }

void dropout_words_row(uint32_t seed0, uint32_t seed1, uint32_t n, uint32_t h, uint32_t i, int64_t j0, int64_t count,
                       uint32_t* words) {
  if (count <= 0) return;
  alignas(64) uint32_t buf[64 * kMaxSets];
  for (int64_t j = j0; j < j0 + count;) {
    const int64_t g0 = j / 4, first = 4 * g0;  // the batch's calls cover keys first .. first + 64·sets − 1
    const int64_t need = (j0 + count - first + 63) / 64;  // sets of 64 keys left; 3 runs as 4
    const int sets = need >= 3 ? kMaxSets : static_cast<int>(need);
    batch(sets, static_cast<uint32_t>(g0), i, h, n, seed0, seed1, buf);
    const int64_t end = std::min(j0 + count, first + 64 * sets);
    std::memcpy(words + (j - j0), buf + (j - first), static_cast<size_t>(end - j) * sizeof(uint32_t));
    j = end;
  }
}

}  // namespace tessera::cpu_philox
