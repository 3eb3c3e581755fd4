// paged_attention cpu: the bf16 decode row with AVX512-BF16 (see cpu_decode_bf16.h).
//
// Lane layout: a head group is up to 4 query heads of one kv head; a score vector holds 4 keys ×
// 4 heads, lane 4·key + head, and the softmax state m, l of the group lives in the same lanes
// (m repeated in every 128-bit block, l as 4 partial sums per head). A block is ≤ 16 keys of one
// page: 4 score vectors. Functions carry their target attribute (no pragma: std:: templates
// instantiated here must stay baseline code).
#include "kernels/paged_attention/cpu_decode_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/env.h"
#include "primitives/cpu_bf16_gemm.h"

namespace tessera::paged_attention::cpu_bf16 {

bool available() {
#if defined(__x86_64__)
  static const bool have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512bf16");
  return have && cpu_bf16_gemm::native();  // TESSERA_CPU_BF16_DOT=0 or =portable: the generic path
#else
  return false;
#endif
}

bool fits(const Problem& p) {
  const bool cache = p.cache_dtype == DType::kBF16 || p.cache_dtype == DType::kF8E4M3;
  return p.dtype == DType::kBF16 && cache && p.D % 32 == 0 && p.Dv % 32 == 0;
}

namespace {
constexpr int64_t kBlock = 16;  // keys per block: 4 score vectors of 4 keys × 4 heads
// v3: the block this many blocks after the one computed is asked into L2 while it computes
// (prefetcht1, spread over its steps): one thread from DRAM ~1.8× faster than without; 3 and 4
// measured alike or a little slower, 1 slower; all lines at a block's start only ~1.2× faster.
constexpr int64_t kL2Ahead = 2;
// v3: with pages of fewer slots than this, a block takes kBlock keys across pages, copied into a
// contiguous scratch block first (a block of one page paid the per-block work — 4-key score
// steps, the softmax step, o loaded and stored — for every key). One thread, bf16, Hkv 8, D 128:
// page_size 1 2.1× faster, 2 1.1×; the copy costs more than it saves from 4 slots on.
constexpr int64_t kGatherBelow = 3;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
int64_t groups(const Problem& p) { return (p.group() + 3) / 4; }
}  // namespace

// Per (kv head, head group): m and l vectors (32 floats), scores (64), P (64), alpha (16); a row (Dv);
// a gathered block of K and V rows (bf16, kBlock rows of Hkv·D and Hkv·Dv).
int64_t scratch_floats(const Problem& p) { return p.Hkv * groups(p) * 176 + p.Dv + kBlock * p.Hkv * (p.D + p.Dv) / 2; }

#if defined(__x86_64__)
// GCC 12's avx512fintrin.h reads an _mm512_undefined value in set1 and friends: a false alarm.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace {

#define TESSERA_BF16_FN __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma")))
#define TESSERA_BF16_TARGET TESSERA_BF16_FN __attribute__((always_inline)) inline

// e^x in f32 (Cody–Waite reduction, Cephes' expf polynomial, vscalefps: ≈ 1 ulp); −inf → 0.
// x is clamped at −104 first (e^−104 is 0 in f32): a huge negative gap left the reduction's r
// without precision and the polynomial at ±Inf. max(−104, x) keeps a NaN x (the second operand).
TESSERA_BF16_TARGET __m512 exp16(__m512 x) {
  const __mmask16 finite = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_NEQ_UQ);
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(finite, _mm512_scalef_ps(y, n));
}

// Sums each of 4 vectors' 16 lanes down to 4 partials, the vectors' in 128-bit blocks 0..3.
TESSERA_BF16_TARGET __m512 fold4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
}

// Four fold4 results (x, y, z, w) to one vector: block b, lane i = the full sum of vector b of
// the i-th argument.
TESSERA_BF16_TARGET __m512 fold_lanes(__m512 x, __m512 y, __m512 z, __m512 w) {
  const __m512 u = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
  const __m512 v = _mm512_add_ps(_mm512_unpacklo_ps(z, w), _mm512_unpackhi_ps(z, w));
  const __m512d ud = _mm512_castps_pd(u), vd = _mm512_castps_pd(v);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ud, vd)), _mm512_castpd_ps(_mm512_unpackhi_pd(ud, vd)));
}

// Lines to prefetch during a P·V: the next block's V bytes of this kv head's share, a few per key,
// so that the requests never queue up in a burst.
struct Pf {
  const char* v = nullptr;
  int64_t v_lines = 0;
};
// The 64-byte lines of `bytes` bytes from a: a moved down to its line's start, the count returned
// (rows of a 1-byte cache may start mid-line).
inline int64_t lines_from(const char*& a, int64_t bytes) {
  const int64_t off = static_cast<int64_t>(reinterpret_cast<uintptr_t>(a) % 64);
  a -= off;
  return (off + bytes + 63) / 64;
}
inline void prefetch_lines(const char* a, int64_t from, int64_t to) {
  for (int64_t i = from; i < to; ++i) _mm_prefetch(a + 64 * i, _MM_HINT_T0);
}

// Lines [k0, k1) of `k` and [v0, v1) of `v` into L2, alternating K and V (1.2× faster than all K
// lines, then all V lines). prefetcht1: on Zen 4 it fills L2, not L1, so the requests neither
// evict the block being computed nor wait on L1's few miss buffers; a prefetch never faults.
// asm volatile: GCC 12 at -O3 dropped a loop of _mm_prefetch(.., _MM_HINT_T1) here.
inline void prefetch_l2(const char* k, int64_t k0, int64_t k1, const char* v, int64_t v0, int64_t v1) {
  for (int64_t i = 0; i < std::max(k1 - k0, v1 - v0); ++i) {
    if (k0 + i < k1) asm volatile("prefetcht1 %0" : : "m"(k[64 * (k0 + i)]));
    if (v0 + i < v1) asm volatile("prefetcht1 %0" : : "m"(v[64 * (v0 + i)]));
  }
}

// The block asked into L2 while another computes (v3): keys [j, j + n) of sequence s (n = 0:
// none), in `parts` equal shares so that the requests spread over that compute. A block within a
// page is kl lines of K from k and vl of V from v; one that spans pages (`per_key`: gathered
// small pages) is asked row by row.
struct AheadBlock {
  const Problem* p = nullptr;
  int64_t s = 0, j = 0, n = 0, parts = 1;
  bool per_key = false;
  const char *k = nullptr, *v = nullptr;
  int64_t kl = 0, vl = 0;
  int64_t esz = 2;  // bytes per cache element (bf16 2, f8e4m3 1)
  AheadBlock(const Problem& pr, int64_t s_, int64_t j_, int64_t n_, int64_t parts_, bool per_key_)
      : p(&pr), s(s_), j(j_), n(n_), parts(parts_), per_key(per_key_),
        esz(static_cast<int64_t>(dtype_size(pr.cache_dtype))) {
    const int64_t row = n > 0 ? p->cache_row(s, j) : 0, rows = per_key ? 1 : n;
    k = row_of(p->k, p->Hkv * p->D, row), v = row_of(p->v, p->Hkv * p->Dv, row);
    kl = lines_from(k, rows * p->Hkv * p->D * esz), vl = lines_from(v, rows * p->Hkv * p->Dv * esz);
  }
  const char* row_of(const void* cache, int64_t ld, int64_t row) const {
    return static_cast<const char*>(cache) + row * ld * esz;
  }
  void ask(int64_t part) const {
    if (!per_key) {
      prefetch_l2(k, kl * part / parts, kl * (part + 1) / parts, v, vl * part / parts, vl * (part + 1) / parts);
      return;
    }
    for (int64_t i = j + n * part / parts; i < j + n * (part + 1) / parts; ++i) {
      const int64_t row = p->cache_row(s, i);
      const char *kr = row_of(p->k, p->Hkv * p->D, row), *vr = row_of(p->v, p->Hkv * p->Dv, row);
      const int64_t kn = lines_from(kr, p->Hkv * p->D * esz), vn = lines_from(vr, p->Hkv * p->Dv * esz);
      prefetch_l2(kr, 0, kn, vr, 0, vn);
    }
  }
};

// 32 f8e4m3 codes widened to bf16 (exact; tessera/dtype.h's values, the NaN quiet): a normal code's
// 7 magnitude bits shifted into bf16's exponent and mantissa and rebiased by 120, a subnormal's
// (m · 2^-9, m < 8) from an 8-entry table, S.1111.111 NaN, then the sign. Integer operations only.
TESSERA_BF16_TARGET __m512i f8x32_to_bf16(const uint8_t* src) {
  const __m512i u = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi16(0x7f));
  __m512i r = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(120 << 7));
  // (mag + 1) & 0x7f < 9: a subnormal or zero (mag < 8) or NaN (0x7f); rare in a scaled cache, so
  // the table and the blends run only when a lane needs them.
  const __m512i t = _mm512_and_si512(_mm512_add_epi16(mag, _mm512_set1_epi16(1)), _mm512_set1_epi16(0x7f));
  if (_mm512_cmplt_epu16_mask(t, _mm512_set1_epi16(9)) != 0) {
    const __m512i sub = _mm512_permutexvar_epi16(  // index: mag's low 5 bits; entries 8.. unused
        mag, _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x3c60, 0x3c40,
                              0x3c20, 0x3c00, 0x3bc0, 0x3b80, 0x3b00, 0));
    r = _mm512_mask_mov_epi16(r, _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8)), sub);
    r = _mm512_mask_mov_epi16(r, _mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x7f)), _mm512_set1_epi16(0x7fc0));
  }
  return _mm512_or_si512(r, _mm512_slli_epi16(_mm512_and_si512(u, _mm512_set1_epi16(0x80)), 8));
}

// 32 cache elements from e as bf16: loaded (bf16) or widened (f8e4m3, in registers).
template <class E>
TESSERA_BF16_TARGET __m512i load32(const E* e) {
  if constexpr (sizeof(E) == 1)
    return f8x32_to_bf16(e);
  else
    return _mm512_loadu_si512(e);
}

// The K and V rows of keys [j, j + n) of sequence s copied into gk and gv, one after the other
// (as the rows of one page are), in the cache's element type E.
template <class E>
void gather_block(const Problem& p, int64_t s, int64_t j, int64_t n, E* gk, E* gv) {
  const int64_t ldk = p.Hkv * p.D, ldv = p.Hkv * p.Dv;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = p.cache_row(s, j + i);
    std::memcpy(gk + i * ldk, static_cast<const E*>(p.k) + r * ldk, static_cast<size_t>(ldk) * sizeof(E));
    std::memcpy(gv + i * ldv, static_cast<const E*>(p.v) + r * ldv, static_cast<size_t>(ldv) * sizeof(E));
  }
}

// Dot products of GH query heads (q + h·D) with nk ≤ 4 keys (K + key·ldk), lane 4·key + head;
// lanes of keys ≥ nk and heads ≥ GH are garbage-free zeros or repeats (masked by the caller).
template <int GH, class E>
TESSERA_BF16_TARGET __m512 scores4x4(const uint16_t* q, int64_t D, const E* K, int64_t ldk, int64_t nk) {
  const E* kr[4];
  for (int b = 0; b < 4; ++b) kr[b] = K + (b < nk ? b : nk - 1) * ldk;  // a repeat stays in bounds
  __m512 acc[4][4];
  for (int h = 0; h < 4; ++h)
    for (int b = 0; b < 4; ++b) acc[h][b] = _mm512_setzero_ps();
  for (int64_t c = 0; c < D; c += 32) {
    __m512bh kv[4];
    for (int b = 0; b < 4; ++b) kv[b] = (__m512bh)load32(kr[b] + c);
    for (int h = 0; h < GH; ++h) {
      const __m512bh qv = (__m512bh)_mm512_loadu_si512(q + h * D + c);
      for (int b = 0; b < 4; ++b) acc[h][b] = _mm512_dpbf16_ps(acc[h][b], qv, kv[b]);
    }
  }
  __m512 per_head[4];
  for (int h = 0; h < 4; ++h) per_head[h] = fold4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
  return fold_lanes(per_head[0], per_head[1], per_head[2], per_head[3]);
}

// o (even/odd order, head h at O + h·Dv) = alpha_h·o + Σ_{j<n} P[4j + h]·v_j.
template <int GH, class E>
TESSERA_BF16_FN void accumulate(const float* P, const float* alpha, const E* V, int64_t ldv, int64_t n, int64_t Dv,
                                float* O, const Pf& pf) {
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t per = (pf.v_lines + n - 1) / n;  // lines to prefetch per key
  int64_t c = 0;
  for (; c + 64 <= Dv; c += 64) {
    __m512 acc[GH][4];
    for (int h = 0; h < GH; ++h)
      for (int i = 0; i < 4; ++i) acc[h][i] = _mm512_mul_ps(_mm512_loadu_ps(O + h * Dv + c + 16 * i), _mm512_set1_ps(alpha[h]));
    for (int64_t j = 0; j < n; ++j) {
      if (c == 0) prefetch_lines(pf.v, std::min(j * per, pf.v_lines), std::min((j + 1) * per, pf.v_lines));
      const __m512i v0 = load32(V + j * ldv + c), v1 = load32(V + j * ldv + c + 32);
      const __m512 w[4] = {_mm512_castsi512_ps(_mm512_slli_epi32(v0, 16)), _mm512_castsi512_ps(_mm512_and_si512(v0, hi)),
                           _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16)), _mm512_castsi512_ps(_mm512_and_si512(v1, hi))};
      for (int h = 0; h < GH; ++h) {
        const __m512 pj = _mm512_set1_ps(P[4 * j + h]);
        for (int i = 0; i < 4; ++i) acc[h][i] = _mm512_fmadd_ps(pj, w[i], acc[h][i]);
      }
    }
    for (int h = 0; h < GH; ++h)
      for (int i = 0; i < 4; ++i) _mm512_storeu_ps(O + h * Dv + c + 16 * i, acc[h][i]);
  }
  if (c < Dv) {  // Dv ≡ 32 (mod 64): one last chunk of 32
    __m512 acc[GH][2];
    for (int h = 0; h < GH; ++h)
      for (int i = 0; i < 2; ++i) acc[h][i] = _mm512_mul_ps(_mm512_loadu_ps(O + h * Dv + c + 16 * i), _mm512_set1_ps(alpha[h]));
    for (int64_t j = 0; j < n; ++j) {
      const __m512i v0 = load32(V + j * ldv + c);
      const __m512 w[2] = {_mm512_castsi512_ps(_mm512_slli_epi32(v0, 16)), _mm512_castsi512_ps(_mm512_and_si512(v0, hi))};
      for (int h = 0; h < GH; ++h) {
        const __m512 pj = _mm512_set1_ps(P[4 * j + h]);
        for (int i = 0; i < 2; ++i) acc[h][i] = _mm512_fmadd_ps(pj, w[i], acc[h][i]);
      }
    }
    for (int h = 0; h < GH; ++h)
      for (int i = 0; i < 2; ++i) _mm512_storeu_ps(O + h * Dv + c + 16 * i, acc[h][i]);
  }
}

// Scores of units [u0, u1) (unit u: kv head u / ng, query heads h0(u) .. + GH) against the nk ≤ 4
// cache rows from row K (first kv head's): scaled, soft capped, lanes of missing keys −inf; unit
// u's into S + u·64. Every unit of the range has GH heads.
template <int GH, class E>
TESSERA_BF16_FN void quad_scores(const Problem& p, const uint16_t* q, const E* K, int64_t nk, int64_t u0,
                                 int64_t u1, int64_t ng, float* S) {
  const int64_t ld = p.Hkv * p.D, G = p.group();
  const __m512 scale = _mm512_set1_ps(static_cast<float>(p.scale));
  const __mmask16 valid = static_cast<__mmask16>(nk >= 4 ? 0xFFFFu : (1u << (4 * nk)) - 1);
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t g = u / ng, h0 = g * G + 4 * (u % ng);
    __m512 s = _mm512_mul_ps(scores4x4<GH, E>(q + h0 * p.D, p.D, K + g * p.D, ld, nk < 4 ? nk : 4), scale);
    if (p.softcap > 0.0) {
      const float c = static_cast<float>(p.softcap);
      alignas(64) float t[16];
      _mm512_store_ps(t, s);
      for (float& v : t) v = c * std::tanh(v / c);
      s = _mm512_load_ps(t);
    }
    _mm512_storeu_ps(S + u * 64, _mm512_mask_mov_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), valid, s));
  }
}

// The online softmax step of one head group over a block's 4 score vectors S (16 keys × 4 heads):
// state ml (m vector, then l vector) updated; P (64: P[4·key + head]) and alpha (16) written.
TESSERA_BF16_FN void softmax_block(const float* S, float* ml, float* P, float* alpha_out) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 s[4];
  for (int b = 0; b < 4; ++b) s[b] = _mm512_loadu_ps(S + 16 * b);
  __m512 M = _mm512_max_ps(_mm512_max_ps(s[0], s[1]), _mm512_max_ps(s[2], s[3]));
  M = _mm512_max_ps(M, _mm512_shuffle_f32x4(M, M, 0x4E));
  M = _mm512_max_ps(M, _mm512_shuffle_f32x4(M, M, 0xB1));
  const __m512 m_old = _mm512_loadu_ps(ml), m_new = _mm512_max_ps(m_old, M);
  const __m512 alpha = exp16(_mm512_sub_ps(m_old, m_new));  // m_old = −inf: −inf − m_new → 0
  __m512 sum = _mm512_setzero_ps();
  for (int b = 0; b < 4; ++b) {
    const __m512 pb = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s[b], ninf, _CMP_NEQ_UQ), exp16(_mm512_sub_ps(s[b], m_new)));
    _mm512_storeu_ps(P + 16 * b, pb);
    sum = _mm512_add_ps(sum, pb);
  }
  _mm512_storeu_ps(ml, m_new);
  _mm512_storeu_ps(ml + 16, _mm512_fmadd_ps(_mm512_loadu_ps(ml + 16), alpha, sum));
  _mm512_storeu_ps(alpha_out, alpha);
}

// The score and P·V functions of 1..4 heads a unit, for cache elements E.
template <class E>
struct Fns {
  using Quad = void (*)(const Problem&, const uint16_t*, const E*, int64_t, int64_t, int64_t, int64_t, float*);
  using Acc = void (*)(const float*, const float*, const E*, int64_t, int64_t, int64_t, float*, const Pf&);
  static constexpr Quad quads[4] = {quad_scores<1, E>, quad_scores<2, E>, quad_scores<3, E>, quad_scores<4, E>};
  static constexpr Acc accs[4] = {accumulate<1, E>, accumulate<2, E>, accumulate<3, E>, accumulate<4, E>};
};

// decode_row for a cache of E: bf16 (uint16_t) or f8e4m3 (uint8_t, widened to bf16 in registers).
template <class E>
void decode_row_of(const Problem& p, int64_t s, int64_t tq, int64_t k0, int64_t k1, float* m, float* l, float* o,
                   float* scratch) {
  const auto& kQuads = Fns<E>::quads;
  const auto& kAccs = Fns<E>::accs;
  const int64_t G = p.group(), ng = groups(p), units = p.Hkv * ng;  // a unit: (kv head g, head group k)
  float *state = scratch, *S = scratch + units * 32, *P = S + units * 64, *alpha = P + units * 64;
  for (int64_t u = 0; u < units; ++u) {
    const int64_t g = u / ng, k = u % ng;
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t h = g * G + 4 * k + i % 4;
      const bool real = 4 * k + i % 4 < G;
      state[u * 32 + i] = real ? m[h] : 0.0f;
      state[u * 32 + 16 + i] = real && i < 4 ? l[h] : 0.0f;
    }
  }
  std::fill(o, o + p.Hq * p.Dv, 0.0f);
  const auto* q = static_cast<const uint16_t*>(p.q) + tq * p.Hq * p.D;
  const auto* K = static_cast<const E*>(p.k);
  const auto* V = static_cast<const E*>(p.v);
  // v3: the block kL2Ahead blocks ahead of the one computed is asked into L2 during this one
  // (prefetch_l2); small pages are gathered (kGatherBelow). TESSERA_PAGED_DECODE_L2_PREFETCH=0
  // turns both off (v2's loop exactly, kept for side-by-side timing).
  const bool l2_ahead = env::flag("TESSERA_PAGED_DECODE_L2_PREFETCH", true);
  const bool gather = l2_ahead && p.page_size < kGatherBelow;
  const int64_t ldk = p.Hkv * p.D, ldv = p.Hkv * p.Dv;  // elements per cache row
  auto* gk = reinterpret_cast<E*>(scratch + units * 176 + p.Dv);
  E* gv = gk + kBlock * ldk;
  auto block_len = [&](int64_t j) {
    return std::min({k1, gather ? k1 : (j / p.page_size + 1) * p.page_size, j + kBlock}) - j;
  };
  auto gh = [&](int64_t u) { return std::min<int64_t>(4, G - 4 * (u % ng)); };
  for (int64_t j = k0; j < k1;) {
    const int64_t n = block_len(j), next = j + n;
    const E *Kblk = gk, *Vblk = gv;  // the block's rows, contiguous
    if (gather) {
      gather_block(p, s, j, n, gk, gv);
    } else {
      const int64_t row0 = p.cache_row(s, j);
      Kblk = K + row0 * ldk, Vblk = V + row0 * ldv;
    }
    // The block kL2Ahead blocks on, in 4 + units shares: one before each step of 4 score rows and
    // one before each unit's P·V (only before the P·V: 1.2× slower, measured).
    int64_t ahead = next;
    for (int64_t i = 1; i < kL2Ahead && ahead < k1; ++i) ahead += block_len(ahead);
    const AheadBlock pre(p, s, ahead, l2_ahead && ahead < k1 ? block_len(ahead) : 0, 4 + units, gather);
    const int64_t next_n = next < k1 ? block_len(next) : 0, next_row = next_n > 0 && !gather ? p.cache_row(s, next) : 0;
    const char* next_v = reinterpret_cast<const char*>(V + next_row * p.Hkv * p.Dv);
    const int64_t v_lines = lines_from(next_v, next_n * p.Hkv * p.Dv * static_cast<int64_t>(sizeof(E)));
    // Scores, 4 cache rows at a time for every kv head: the K rows are read in memory order (the
    // hardware prefetcher follows them within a page; a software prefetch of the next block's K
    // measured ~4 % slower, one of its V ~10 % faster).
    for (int64_t b = 0; b < 4; ++b) {
      pre.ask(b);
      const int64_t nk = n - 4 * b;
      if (nk <= 0) {
        for (int64_t u = 0; u < units; ++u) std::fill(S + u * 64 + 16 * b, S + u * 64 + 16 * b + 16, kNegInf);
        continue;
      }
      const E* Kb = Kblk + 4 * b * ldk;
      if (G % 4 == 0)  // every unit has 4 heads: one call for all
        kQuads[3](p, q, Kb, nk, 0, units, ng, S + 16 * b);
      else
        for (int64_t u = 0; u < units; ++u) kQuads[gh(u) - 1](p, q, Kb, nk, u, u + 1, ng, S + 16 * b);
    }
    for (int64_t u = 0; u < units; ++u) softmax_block(S + u * 64, state + u * 32, P + u * 64, alpha + u * 16);
    // P·V kv head by kv head (V in memory order would reload o every 4 rows: slower, measured).
    for (int64_t u = 0; u < units; ++u) {
      const int64_t g = u / ng, h0 = g * G + 4 * (u % ng);
      pre.ask(4 + u);
      Pf pf;
      if (!gather && u % ng == 0 && next_n > 0)  // a gathered next block is not contiguous
        pf.v = next_v + 64 * (v_lines * g / p.Hkv), pf.v_lines = v_lines * (g + 1) / p.Hkv - v_lines * g / p.Hkv;
      kAccs[gh(u) - 1](P + u * 64, alpha + u * 16, Vblk + g * p.Dv, ldv, n, p.Dv, o + h0 * p.Dv, pf);
    }
    j = next;
  }
  float* row = alpha + units * 16;
  for (int64_t h = 0; h < p.Hq; ++h) {
    const int64_t u = (h / G) * ng + (h % G) / 4, i = (h % G) % 4;
    const float* ml = state + u * 32;
    m[h] = ml[i];
    l[h] = ml[16 + i] + ml[20 + i] + ml[24 + i] + ml[28 + i];
    float* oh = o + h * p.Dv;  // even/odd order back to dimension order
    std::memcpy(row, oh, static_cast<size_t>(p.Dv) * sizeof(float));
    for (int64_t c = 0; c < p.Dv; c += 32)
      for (int64_t d = 0; d < 16; ++d) oh[c + 2 * d] = row[c + d], oh[c + 2 * d + 1] = row[c + 16 + d];
  }
}

}  // namespace

void decode_row(const Problem& p, int64_t s, int64_t tq, int64_t k0, int64_t k1, float* m, float* l, float* o,
                float* scratch) {
  if (p.cache_dtype == DType::kF8E4M3)
    decode_row_of<uint8_t>(p, s, tq, k0, k1, m, l, o, scratch);
  else
    decode_row_of<uint16_t>(p, s, tq, k0, k1, m, l, o, scratch);
}

#pragma GCC diagnostic pop
#else
void decode_row(const Problem&, int64_t, int64_t, int64_t, int64_t, float*, float*, float*, float*) {}
#endif

}  // namespace tessera::paged_attention::cpu_bf16
