// attention: the optimized CPU backend ("cpu").
//
// Design (docs/kernels/attention.md, "cpu backend"):
//
//   Forward, FlashAttention-style. A work item is (sequence, query head, super-block of R
//   consecutive blocks of q query rows). It walks the tiles of kv keys its rows may see (causal
//   and window limits cut the walk to the allowed span, so masked-out tiles cost nothing); each
//   kv tile is converted and packed once for the super-block, and per (q block, kv tile):
//     S = scale · Q_blk · K_tileᵀ                      micro-kernel (K = D)
//     soft cap, ALiBi, mask (only tiles that cross a mask edge, or with segment ids)
//     online softmax in f32 (row max, P = exp(S − m), running sum, rescale factor)
//     O_acc = alpha ∘ O_acc + P · V_tile               micro-kernel (K = kv tile)
//   and stores O_acc / l (rounded to o's dtype only here) and lse = m + log l.
//
//   The f32 tile products run on primitives/cpu_f32_gemm where the CPU has AVX-512F (6-8 %
//   faster than the Highway kernel, devlog v1.2), else on the Highway register-blocked
//   micro-kernel (cpu_simd.cc), measured 1.5-2x faster than OpenBLAS sgemm (devlog v1);
//   TESSERA_ATTENTION_CPU_GEMM=hwy / =blas select those, for side-by-side timing.
//
//   Backward, FlashAttention-2-style: P is recomputed from the saved lse. A work item is
//   (sequence, kv head[, kv chunk]); it owns dk and dv of its kv head and dq of the query heads
//   that share it, so no two items write the same memory and no atomics are needed. Per kv block
//   (dK, dV accumulated in f32 tiles) and per query head of the group and q block:
//     S = scale·Q·Kᵀ, P = exp(S' − lse)   (S' = soft-capped, biased, masked S)
//     dV += Pᵀ·dO;  dP = dO·Vᵀ;  dS = P ∘ (dP − Δ) [∘ (1 − (t/c)²)]
//     dK += scale·dSᵀ·Q;  dQ += scale·dS·K
//   with Δ_i = Σ dO_i·o_i from the saved o. Five products per tile, the minimum for FA2.
//   When there are fewer (sequence, kv head) items than threads, each is split into C chunks:
//   over the query heads of the group when it has several (each chunk owns its heads' dq and
//   accumulates f32 dk/dv partials of Sk × (D + Dv)), else over the kv blocks (each chunk owns
//   its blocks' dk/dv and accumulates an f32 dq partial of Sq × D). Partials are summed in
//   chunk order afterwards. C depends only on the shape and the thread count.
//
//   Dropout (p > 0): the tile's mask comes from primitives/philox.h (four keys per call) right
//   after the softmax step; forward zeroes the dropped P before P·V (l sums the undropped P) and
//   scales by 1 / (1 − p) at the store; backward zeroes them in the P of dV (a copy; the bf16 P on
//   that route) and in dP, scaling both products by 1 / (1 − p); dS takes the undropped P.
//
//   Bias (docs/kernels/attention.md, "bias"): a tile of it is added after ALiBi in both passes.
//   dbias is written by the backward as it computes each dS tile where every dbias element has one
//   term (no broadcast) and there is no soft cap (direct_dbias); otherwise by BiasGrad, a pass of
//   its own (recomputing S and dP per tile; f32 partial tiles when a tile's pairs are sliced, at most
//   63·q·kv floats, summed in order).
//
//   Determinism: every sum has a fixed order for a fixed thread count (an item's work does not
//   depend on which thread runs it; chunk partials are reduced in chunk order), so results are
//   bitwise reproducible for a fixed num_threads. In forward and in backward without chunking
//   they do not even depend on the thread count.
//
//   Memory: per thread, a few q × kv f32 tiles, kv × D accumulators, packed operands and
//   conversion buffers; forward the f32 O accumulator of a q super-block; backward also
//   Sq × (Hq/Hkv) floats for Δ, Q and dO of the item's heads packed (<= 8 MiB, else per tile)
//   and, when dq is not f32, an f32 dq accumulator of Sq × (Hq/Hkv) × D; chunked items add the
//   partials above. Never Sq × Sk.
//
//   f16 inputs (and bf16 where the bf16 dot route below is off) are converted to f32 tile by
//   tile (Q, dO per q block; K, V per kv block); all arithmetic is f32 and rounding to the
//   storage dtype happens only when storing.
//
//   bf16 dot route (default for bf16 inputs where the CPU has AVX512-BF16, runtime check;
//   TESSERA_ATTENTION_CPU_BF16_DOT=0 selects the f32 route above): the tile products run on
//   primitives/cpu_bf16_gemm (vdpbf16ps: bf16 × bf16 products exact in f32, f32 sums). Q, K, V
//   and dO are read as bf16 straight from the inputs; P (forward and backward) and dS (backward)
//   are rounded to bf16 (nearest even) after the f32 softmax / dS step, as FlashAttention does
//   on tensor cores; m, l, lse, Δ and every accumulator stay f32 (l sums the unrounded P). The
//   backward keeps its accumulators transposed (dKᵀ += Qᵀ·dS, dVᵀ += dOᵀ·P) so that P and dS
//   are packed by rows and never transposed per tile; Qᵀ and dOᵀ of the item's heads are built
//   once per item (bf16, <= 8 MiB per thread, else the f32 route; backward also needs dO in
//   bf16).
//
// Threads: the shared worker threads (primitives/cpu_threads.h), work items handed out by an atomic counter (heaviest first). On the
// sgemm path, OpenBLAS is switched to one thread while a call runs (process-wide,
// reference-counted, restored afterwards), because each worker calls sgemm on its own tiles —
// the linear_cross_entropy backend's rule; its guard is a separate counter, so concurrent calls
// of both kernels could restore OpenBLAS's thread count early (harmless: slower, not wrong).

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/env.h"
#include "core/memory.h"
#include "core/trace.h"
#include "kernels/attention/cpu_simd.h"
#include "kernels/attention/impl.h"
#if defined(__x86_64__)
#include <immintrin.h>

#include "primitives/cpu_avx512.h"
#endif
#include "primitives/cpu_bf16_gemm.h"
#include "primitives/cpu_blas.h"
#include "primitives/cpu_convert.h"
#include "primitives/cpu_f32_gemm.h"
#include "primitives/cpu_philox.h"
#include "primitives/cpu_threads.h"
#include "tessera/error.h"

namespace tessera::attention {
namespace {

namespace simd = cpu_simd;

constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kMaxBlockQ = 1024;
constexpr int64_t kMaxBlockKv = 4096;
constexpr int kMaxThreads = 1024;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using BlasSingleThreaded = cpu_blas::SingleThreaded;
using cpu_blas::sgemm;

template <class T>
T* alloc(std::vector<memory::HostBuffer>& keep, size_t count) {
  keep.push_back(memory::host_alloc(std::max<size_t>(1, count) * sizeof(T)));
  return memory::as<T>(keep.back());
}

// Runs body(tid) for tid in [0, T) on T threads (the caller is thread 0): primitives/cpu_threads.h.
template <class F>
void run_threads(int T, bool blas, F&& body) {
  cpu_threads::run_threads(T, blas, std::string(kKernelName) + " cpu", std::forward<F>(body));
}

// Which kernel does the tile products: the Highway micro-kernel (default, faster on the
// machines measured, devlog v1) or OpenBLAS sgemm (TESSERA_ATTENTION_CPU_GEMM=blas, kept for
// side-by-side measurement).
bool use_blas() {
  static const bool blas = env::get("TESSERA_ATTENTION_CPU_GEMM").value_or("hwy") == "blas";
  return blas;
}

// The f32 tile products run on primitives/cpu_f32_gemm (AVX-512 6 × 64 register block; 6-8 %
// faster than the Highway kernel here, devlog v1.2) where the CPU has AVX-512F (its runtime
// check, which TESSERA_CPU_F32_GEMM=0 also turns off), unless TESSERA_ATTENTION_CPU_GEMM names
// "hwy" (the Highway kernel, with the Q/dO prepacking of the backward) or "blas". Read per call.
bool use_f32_prim() {
  const std::string mode = env::get("TESSERA_ATTENTION_CPU_GEMM").value_or("");
  return mode != "hwy" && mode != "blas" && cpu_f32_gemm::available();
}

// The bf16 dot route (file comment): bf16 inputs, AVX512-BF16 present (cpu_bf16_gemm's runtime
// check, which TESSERA_CPU_BF16_DOT=0 also turns off), the micro-kernel route, and not turned off
// by TESSERA_ATTENTION_CPU_BF16_DOT=0 (read per call, so that a test can run both routes).
bool use_bf16_dot(const Problem& p) {
  return p.dtype == DType::kBF16 && !use_blas() && cpu_bf16_gemm::available() &&
         env::flag("TESSERA_ATTENTION_CPU_BF16_DOT", true);
}

// dbias written by the backward itself as it computes each dS tile: a bias that is not
// broadcast (every dbias element has exactly one term) and no soft cap (dS is then the bias's
// gradient as ds_rows leaves it). Else the pass of its own (BiasGrad).
bool direct_dbias(const Problem& p) {
  return p.bias && p.softcap == 0.0 && p.bias_numel() == p.N * p.Hq * p.Sq * p.Sk;
}

#if defined(__x86_64__)
// GCC 12's AVX-512 unpack intrinsics pass _mm512_undefined_epi32() as their masked-off source,
// which -Wmaybe-uninitialized reports at every inlined use (a known false positive; as in
// primitives/cpu_bf16_gemm.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TESSERA_ATTN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
// The bf16 dot route's transposes in 16 × 16 blocks of 32-bit words (only called where
// cpu_bf16_gemm::native() found AVX512-BF16, hence AVX-512F/BW/VL). f32: dst[c·ldd + r] = src[r·lds + c].
TESSERA_ATTN_AVX512 void transpose_f32_avx512(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                                       int64_t ldd) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const int64_t nr = std::min<int64_t>(16, rows - r0), nc = std::min<int64_t>(16, cols - c0);
      const __mmask16 mc = cpu_avx512::lanes16(nc), mr = cpu_avx512::lanes16(nr);
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i < nr ? _mm512_maskz_loadu_epi32(mc, src + (r0 + i) * lds + c0) : _mm512_setzero_si512();
      cpu_avx512::transpose16(r);
      for (int64_t c = 0; c < nc; ++c) _mm512_mask_storeu_epi32(dst + (c0 + c) * ldd + r0, mr, r[c]);
    }
}
// bf16: dst[c·ldd + r] = src[r·lds + c]; pairs of rows become one word (r even low, r + 1 high),
// so 32 rows × 16 columns go through one word transpose; an odd last row is copied alone.
TESSERA_ATTN_AVX512 void transpose_bf16_avx512(const uint16_t* src, int64_t lds, int64_t rows, int64_t cols, uint16_t* dst,
                                        int64_t ldd) {
  const int64_t pairs = rows / 2;
  for (int64_t k0 = 0; k0 < pairs; k0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const int64_t nk = std::min<int64_t>(16, pairs - k0), nc = std::min<int64_t>(16, cols - c0);
      const __mmask16 mc = cpu_avx512::lanes16(nc), mk = cpu_avx512::lanes16(nk);
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        if (i >= nk) {
          r[i] = _mm512_setzero_si512();
          continue;
        }
        const uint16_t* a = src + (2 * (k0 + i)) * lds + c0;
        const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mc, a));
        const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mc, a + lds));
        r[i] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
      }
      cpu_avx512::transpose16(r);
      for (int64_t c = 0; c < nc; ++c) _mm512_mask_storeu_epi32(dst + (c0 + c) * ldd + 2 * k0, mk, r[c]);
    }
  if (rows % 2)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + rows - 1] = src[(rows - 1) * lds + c];
}
#pragma GCC diagnostic pop
#endif

// The transposes elementwise: the route without AVX512-BF16 (TESSERA_CPU_BF16_DOT=portable, or
// off x86-64).
template <class T>
void transpose_any(const T* src, int64_t lds, int64_t rows, int64_t cols, T* dst, int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}
void transpose_f32(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd) {
#if defined(__x86_64__)
  if (cpu_bf16_gemm::native()) return transpose_f32_avx512(src, lds, rows, cols, dst, ldd);
#endif
  transpose_any(src, lds, rows, cols, dst, ldd);
}
void transpose_bf16(const uint16_t* src, int64_t lds, int64_t rows, int64_t cols, uint16_t* dst, int64_t ldd) {
#if defined(__x86_64__)
  if (cpu_bf16_gemm::native()) return transpose_bf16_avx512(src, lds, rows, cols, dst, ldd);
#endif
  transpose_any(src, lds, rows, cols, dst, ldd);
}

// Operand B of a tile product, B[k][n] = trans ? m[n·ld + k] : m[k·ld + n]; `packed` holds it
// in the micro-kernel's panel layout (filled by Common::pack, unused with BLAS).
struct BOp {
  const float* m = nullptr;
  int64_t ld = 0;
  bool trans = false;
  float* packed = nullptr;
  int64_t panel_rows = 0, k0 = 0;  // rows [k0, k0+K) of a packed matrix of panel_rows rows
};

// Shared pieces of both passes.
struct Common {
  const Problem& p;
  int64_t bq = 1, bk = 1, ld = 16;  // effective blocks; tile row stride
  bool half = false;
  bool blas = false;
  bool dot16 = false;  // the bf16 dot route
  bool prim = false;   // f32 products on cpu_f32_gemm

  Common(const Problem& prob, const BlockSizes& bs) : p(prob) {
    bq = bs.q;
    bk = bs.kv;
    ld = simd::round_up(bk);
    half = p.dtype != DType::kF32;
    blas = use_blas();
    dot16 = use_bf16_dot(p);
    prim = !blas && use_f32_prim();
  }
  // Floats of a packed B (K × N) for whichever micro-kernel runs.
  static int64_t packed_floats(int64_t K, int64_t N) {
    return std::max(simd::packed_floats(K, N), cpu_f32_gemm::packed_floats(K, N));
  }

  // Row `row` of head h of a bf16 [rows, H, dim] input.
  static const uint16_t* row16(const void* base, int64_t H, int64_t dim, int64_t row, int64_t h) {
    return static_cast<const uint16_t*>(base) + (row * H + h) * dim;
  }
  // Packs rows [row0, row0 + nk) of head h of a bf16 [rows, H, dim] input for cpu_bf16_gemm: as
  // B [nk × dim] (by rows: V for P·V, K for dS·K) or as Bᵀ [dim × nk] (by columns: Kᵀ, Vᵀ).
  void pack16(const void* base, int64_t H, int64_t dim, int64_t row0, int64_t h, int64_t nk, bool by_cols,
              const uint16_t** ptrs, uint32_t* packed) const {
    for (int64_t j = 0; j < nk; ++j) ptrs[j] = row16(base, H, dim, row0 + j, h);
    if (by_cols)
      cpu_bf16_gemm::pack_cols(ptrs, dim, nk, packed);
    else
      cpu_bf16_gemm::pack_rows(ptrs, nk, dim, packed);
  }
  // Packs a bf16 tile (rows × n, stride ld) by rows into packed.
  void pack_tile16(const uint16_t* t16, int64_t rows, int64_t n, const uint16_t** ptrs, uint32_t* packed) const {
    for (int64_t r = 0; r < rows; ++r) ptrs[r] = t16 + r * ld;
    cpu_bf16_gemm::pack_rows(ptrs, rows, n, packed);
  }

  void pack(BOp& b, const float* m, int64_t ldm, bool trans, int64_t K, int64_t N) const {
    b.m = m;
    b.ld = ldm;
    b.trans = trans;
    b.panel_rows = K;
    b.k0 = 0;
    if (prim)
      cpu_f32_gemm::pack(trans, K, N, m, ldm, b.packed);
    else if (!blas)
      simd::pack_b(m, ldm, trans, K, N, b.packed);
  }
  // C (M × N) = alpha · op(A) · B (+ C when acc).
  void mm(const float* A, int64_t lda, bool ta, const BOp& b, int64_t M, int64_t N, int64_t K, float* C, int64_t ldc,
          float alpha, bool acc) const {
    if (blas)
      sgemm(ta, b.trans, M, N, K, alpha, A, lda, b.m, b.ld, acc ? 1.0f : 0.0f, C, ldc);
    else if (prim)  // packed per product (panel_rows = K, k0 = 0: no prepacking on this path)
      cpu_f32_gemm::gemm(cpu_f32_gemm::Tri::kNone, ta, M, N, K, alpha, A, lda, b.packed, acc ? 1.0f : 0.0f, C, ldc);
    else
      simd::gemm_packed(A, lda, ta, b.packed, b.panel_rows, b.k0, M, N, K, C, ldc, alpha, acc);
  }

  // Rows [i0, i0+rows) of sequence n, head h of a [rows, H, dim] input as f32: a pointer into
  // the input (f32) or converted into buf; *ldx receives the row stride.
  const float* rows_f32(const void* base, DType dt, int64_t H, int64_t dim, int64_t row0, int64_t h, int64_t rows,
                        float* buf, int64_t* ldx) const {
    if (dt == DType::kF32) {
      *ldx = H * dim;
      return static_cast<const float*>(base) + (row0 * H + h) * dim;
    }
    const auto* src = static_cast<const uint16_t*>(base);
    for (int64_t r = 0; r < rows; ++r)
      simd::half_to_f32(src + ((row0 + r) * H + h) * dim, dt == DType::kBF16, buf + r * dim, dim);
    *ldx = dim;
    return buf;
  }

  // dst[base .. base + n) = src[0 .. n) rounded to dt (vectorized; the rounding of store_from_f32).
  static void store_row(void* dst, DType dt, int64_t base, const float* src, int64_t n) {
    if (dt == DType::kF32)
      std::memcpy(static_cast<float*>(dst) + base, src, static_cast<size_t>(n) * sizeof(float));
    else if (dt == DType::kBF16)
      cpu_convert::f32_to_bf16(src, static_cast<uint16_t*>(dst) + base, n);
    else
      cpu_convert::f32_to_f16(src, static_cast<uint16_t*>(dst) + base, n);
  }
  // src[base .. base + n) as f32: a pointer into src (f32) or converted into buf.
  static const float* row_f32(const void* src, DType dt, int64_t base, int64_t n, float* buf) {
    if (dt == DType::kF32) return static_cast<const float*>(src) + base;
    simd::half_to_f32(static_cast<const uint16_t*>(src) + base, dt == DType::kBF16, buf, n);
    return buf;
  }

  // Sets −inf in S where row i0+r of sequence n may not see key j0+j. Tiles entirely inside
  // every row's allowed range (and no segment ids) are left alone.
  void mask_tile(int64_t n, int64_t i0, int64_t mq, int64_t j0, int64_t nk, float* S) const {
    int64_t lo_last, hi_first, unused;
    p.key_range(n, i0 + mq - 1, &lo_last, &unused);
    p.key_range(n, i0, &unused, &hi_first);
    if (!p.seg_q && lo_last <= j0 && hi_first >= j0 + nk) return;  // ranges are monotone in i
    const int32_t* sk = p.seg_k ? p.seg_k + p.k_begin(n) + j0 : nullptr;
    for (int64_t r = 0; r < mq; ++r) {
      int64_t lo, hi;
      p.key_range(n, i0 + r, &lo, &hi);
      const int64_t a = std::clamp<int64_t>(lo - j0, 0, nk), b = std::clamp<int64_t>(hi - j0, a, nk);
      float* s = S + r * ld;
      std::fill(s, s + a, kNegInf);
      std::fill(s + b, s + nk, kNegInf);
      if (sk) {
        const int32_t id = p.seg_q[p.q_begin(n) + i0 + r];
        for (int64_t j = a; j < b; ++j)
          if (sk[j] != id) s[j] = kNegInf;
      }
    }
  }

  // Dropout (docs/kernels/attention.md, "dropout"): words[r·ld + j] = the Philox word of row
  // i0 + r, key j0 + j of (sequence n, query head h); the key is kept when it is >= the threshold.
  void dropout_mask(int64_t n, int64_t h, int64_t i0, int64_t mq, int64_t j0, int64_t nk, uint32_t* words) const {
    const auto s0 = static_cast<uint32_t>(p.dropout_seed[0]), s1 = static_cast<uint32_t>(p.dropout_seed[1]);
    for (int64_t r = 0; r < mq; ++r)
      cpu_philox::dropout_words_row(s0, s1, static_cast<uint32_t>(n), static_cast<uint32_t>(h),
                                    static_cast<uint32_t>(i0 + r), j0, nk, words + r * ld);
  }
  // Zeroes the dropped entries of a tile (f32, or bf16 bits: 0 is +0.0 in both).
  template <class T>
  void zero_dropped(T* t, const uint32_t* words, int64_t mq, int64_t nk) const {
    const uint32_t thr = p.dropout_threshold;
    for (int64_t r = 0; r < mq; ++r) {
      T* row = t + r * ld;
      const uint32_t* w = words + r * ld;
      for (int64_t j = 0; j < nk; ++j) row[j] = w[j] >= thr ? row[j] : T(0);
    }
  }
  // 1 / (1 − p): the kept probabilities' factor, applied where they meet v (1 without dropout).
  float keep_scale() const { return p.dropout() ? static_cast<float>(1.0 / (1.0 - p.dropout_p)) : 1.0f; }

  // Soft cap, ALiBi and the bias on a tile of scores of head h (rows i0.., keys j0..).
  void transform_tile(int64_t n, int64_t h, int64_t i0, int64_t mq, int64_t j0, int64_t nk, float* S) const {
    if (p.softcap > 0.0) simd::softcap(S, mq, nk, ld, static_cast<float>(p.softcap));
    add_positional(n, h, i0, mq, j0, nk, S);
  }
  // ALiBi and the bias: what comes after the soft cap.
  void add_positional(int64_t n, int64_t h, int64_t i0, int64_t mq, int64_t j0, int64_t nk, float* S) const {
    if (p.alibi) {
      const int64_t off = p.k_len(n) - p.q_len(n);
      simd::alibi(S, mq, nk, ld, p.slope(n, h), static_cast<float>(i0 + off - j0));
    }
    if (p.bias) add_bias(n, h, i0, mq, j0, nk, S);
  }
  // S[r][j] += bias(n, h, i0 + r, j0 + j): f32 rows added as they are (vectorized), bf16 / f16
  // rows converted in chunks of 256, a broadcast key dim as one value per row.
  void add_bias(int64_t n, int64_t h, int64_t i0, int64_t mq, int64_t j0, int64_t nk, float* S) const {
    const int64_t base = p.bias_offset(n, h, i0, j0), ldb = p.bias_stride[2];
    if (p.bias_stride[3] == 1 && p.bias_dtype == DType::kF32)
      return simd::add_rows(S, mq, nk, ld, static_cast<const float*>(p.bias) + base, ldb);
    for (int64_t r = 0; r < mq; ++r) {
      float* s = S + r * ld;
      if (p.bias_stride[3] == 0) {
        const float b = load_as_f32(p.bias, p.bias_dtype, base + r * ldb);
        for (int64_t j = 0; j < nk; ++j) s[j] += b;
        continue;
      }
      float buf[256];
      for (int64_t c = 0; c < nk; c += 256) {
        const int64_t m = std::min<int64_t>(256, nk - c);
        simd::half_to_f32(static_cast<const uint16_t*>(p.bias) + base + r * ldb + c, p.bias_dtype == DType::kBF16, buf, m);
        simd::add_rows(s + c, 1, m, ld, buf, m);
      }
    }
  }
};

// ---------------------------------------------------------------- forward

class Forward : Common {
 public:
  Forward(const Problem& prob, const BlockSizes& bs, const ForwardOut& out) : Common(prob, bs), out_(out) {}

  void run() {
    TESSERA_TRACE_SCOPE("attn.fwd");
    // Super-blocks of R consecutive q blocks of one (sequence, head): each kv tile is converted
    // and packed once for all of them. R is as large as keeps >= 4 items per thread (load
    // balance) and R·q <= kMaxSuperRows (the f32 O accumulators stay small).
    const int want = std::clamp(p.num_threads, 1, kMaxThreads);
    int64_t blocks = 0;
    for (int64_t n = 0; n < p.N; ++n) blocks += p.Hq * ((p.q_len(n) + bq - 1) / bq);
    R_ = std::clamp<int64_t>(blocks / (4 * want), 1, std::max<int64_t>(1, kMaxSuperRows / bq));
    for (int64_t n = 0; n < p.N; ++n) {
      const int64_t nqb = (p.q_len(n) + bq - 1) / bq;
      for (int64_t h = 0; h < p.Hq; ++h)
        for (int64_t b0 = 0; b0 < nqb; b0 += R_) items_.push_back({n, h, b0, std::min(nqb, b0 + R_), 0});
    }
    // Heaviest first (by the keys their rows may see): causal masks make later blocks heavier.
    for (Item& it : items_)
      for (int64_t b = it.qb0; b < it.qb1; ++b) {
        int64_t lo, hi;
        span(it.n, b, &lo, &hi);
        it.cost += std::max<int64_t>(0, hi - lo);
      }
    std::stable_sort(items_.begin(), items_.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
    const int T = static_cast<int>(std::min<int64_t>(want, std::max<int64_t>(1, static_cast<int64_t>(items_.size()))));
    scratch_.resize(static_cast<size_t>(T));
    const size_t rows = static_cast<size_t>(R_ * bq);
    for (Scratch& s : scratch_) {
      s.S = alloc<float>(keep_, static_cast<size_t>(bq * ld));
      s.O = alloc<float>(keep_, rows * static_cast<size_t>(p.Dv));
      s.m = alloc<float>(keep_, rows);
      s.l = alloc<float>(keep_, rows);
      s.alpha = alloc<float>(keep_, static_cast<size_t>(bq));
      if (p.dropout()) s.keep = alloc<uint32_t>(keep_, static_cast<size_t>(bq * ld));
      if (dot16) {
        s.kt16 = alloc<uint32_t>(keep_, static_cast<size_t>(cpu_bf16_gemm::packed_words(p.D, bk)));
        s.vv16 = alloc<uint32_t>(keep_, static_cast<size_t>(cpu_bf16_gemm::packed_words(bk, p.Dv)));
        s.p16 = alloc<uint16_t>(keep_, static_cast<size_t>(bq * ld));
        s.ptrs = alloc<const uint16_t*>(keep_, static_cast<size_t>(bk));
        continue;
      }
      s.kt.packed = alloc<float>(keep_, static_cast<size_t>(packed_floats(p.D, bk)));
      s.vv.packed = alloc<float>(keep_, static_cast<size_t>(packed_floats(bk, p.Dv)));
      if (half) {
        s.q = alloc<float>(keep_, rows * static_cast<size_t>(p.D));
        s.k = alloc<float>(keep_, static_cast<size_t>(bk * p.D));
        s.v = alloc<float>(keep_, static_cast<size_t>(bk * p.Dv));
      }
    }
    std::atomic<size_t> next{0};
    run_threads(T, blas, [&](int tid) {
      for (size_t i = next.fetch_add(1); i < items_.size(); i = next.fetch_add(1)) item(scratch_[tid], items_[i]);
    });
  }

 private:
  static constexpr int64_t kMaxSuperRows = 4096;

  struct Item {
    int64_t n, h, qb0, qb1;  // q blocks [qb0, qb1) of sequence n, head h
    int64_t cost;
  };
  struct Scratch {
    float *S, *O, *m, *l, *alpha, *q = nullptr, *k = nullptr, *v = nullptr;
    uint32_t* keep = nullptr;  // dropout: the Philox words of a tile
    BOp kt, vv;  // Kᵀ and V of the current kv tile
    // bf16 dot route: Kᵀ and V packed for cpu_bf16_gemm, P rounded to bf16, row pointers.
    uint32_t *kt16 = nullptr, *vv16 = nullptr;
    uint16_t* p16 = nullptr;
    const uint16_t** ptrs = nullptr;
  };

  // Keys [*lo, *hi) that some row of q block b may see (empty: *lo >= *hi).
  void span(int64_t n, int64_t b, int64_t* lo, int64_t* hi) const {
    const int64_t i0 = b * bq, mq = std::min(bq, p.q_len(n) - i0);
    *lo = p.k_len(n);
    *hi = 0;
    for (int64_t r = 0; r < mq; ++r) {
      int64_t a, c;
      p.key_range(n, i0 + r, &a, &c);
      if (a < c) {
        *lo = std::min(*lo, a);
        *hi = std::max(*hi, c);
      }
    }
  }

  void item(Scratch& s, const Item& it) const {
    TESSERA_TRACE_SCOPE_I("attn.fwd.item", it.h);  // tiles: pack, QKᵀ, online softmax, PV
    const int64_t n = it.n, h = it.h, kvh = h / p.group();
    const int64_t sq = p.q_len(n), qbeg = p.q_begin(n), kbeg = p.k_begin(n);
    const int64_t nb = it.qb1 - it.qb0;
    int64_t blo[kMaxSuperRows], bhi[kMaxSuperRows];  // per-block key spans (nb <= kMaxSuperRows)
    int64_t kmin = p.k_len(n), kmax = 0;
    for (int64_t b = 0; b < nb; ++b) {
      span(n, it.qb0 + b, &blo[b], &bhi[b]);
      if (blo[b] < bhi[b]) {
        kmin = std::min(kmin, blo[b]);
        kmax = std::max(kmax, bhi[b]);
      }
    }
    const int64_t r0 = it.qb0 * bq, rows = std::min(it.qb1 * bq, sq) - r0;  // rows of the item
    int64_t ldq = 0, ldk = 0, ldv = 0;
    const float* Q = dot16 ? nullptr : rows_f32(p.q, p.dtype, p.Hq, p.D, qbeg + r0, h, rows, s.q, &ldq);
    const uint16_t* Q16 = dot16 ? row16(p.q, p.Hq, p.D, qbeg + r0, h) : nullptr;
    const int64_t ldq16 = p.Hq * p.D;
    std::fill(s.m, s.m + rows, kNegInf);
    std::fill(s.l, s.l + rows, 0.0f);
    std::fill(s.O, s.O + rows * p.Dv, 0.0f);
    const float scale = static_cast<float>(p.scale);
    // kv tiles at multiples of bk: a block meets the same tiles whatever R is (a tile clipped at
    // kmax only loses columns the block masks anyway), so results do not depend on R, hence not
    // on the thread count.
    for (int64_t j0 = kmin / bk * bk; j0 < kmax; j0 += bk) {
      const int64_t nk = std::min(bk, kmax - j0);
      bool packed = false;
      for (int64_t b = 0; b < nb; ++b) {
        if (blo[b] >= bhi[b] || blo[b] >= j0 + nk || bhi[b] <= j0) continue;  // tile outside the block's span
        if (!packed && dot16) {
          pack16(p.k, p.Hkv, p.D, kbeg + j0, kvh, nk, true, s.ptrs, s.kt16);
          pack16(p.v, p.Hkv, p.Dv, kbeg + j0, kvh, nk, false, s.ptrs, s.vv16);
          packed = true;
        }
        if (!packed) {
          const float* K = rows_f32(p.k, p.dtype, p.Hkv, p.D, kbeg + j0, kvh, nk, s.k, &ldk);
          const float* V = rows_f32(p.v, p.dtype, p.Hkv, p.Dv, kbeg + j0, kvh, nk, s.v, &ldv);
          pack(s.kt, K, ldk, true, p.D, nk);
          pack(s.vv, V, ldv, false, nk, p.Dv);
          packed = true;
        }
        const int64_t i0 = (it.qb0 + b) * bq, mq = std::min(bq, sq - i0), off = i0 - r0;
        if (dot16)
          cpu_bf16_gemm::gemm(mq, nk, p.D, Q16 + off * ldq16, ldq16, s.kt16, scale, false, s.S, ld);
        else
          mm(Q + off * ldq, ldq, false, s.kt, mq, nk, p.D, s.S, ld, scale, false);
        transform_tile(n, h, i0, mq, j0, nk, s.S);
        mask_tile(n, i0, mq, j0, nk, s.S);
        simd::online_softmax(s.S, mq, nk, ld, s.m + off, s.l + off, s.alpha, dot16 ? s.p16 : nullptr);
        if (p.dropout()) {  // l summed the undropped P; 1 / (1 − p) is applied at the store
          dropout_mask(n, h, i0, mq, j0, nk, s.keep);
          if (dot16)
            zero_dropped(s.p16, s.keep, mq, nk);
          else
            zero_dropped(s.S, s.keep, mq, nk);
        }
        float* O = s.O + off * p.Dv;
        simd::scale_rows(O, mq, p.Dv, p.Dv, s.alpha);
        if (dot16) {  // P rounded to bf16 by the softmax (l summed the f32 P)
          cpu_bf16_gemm::gemm(mq, p.Dv, nk, s.p16, ld, s.vv16, 1.0f, true, O, p.Dv);
        } else {
          mm(s.S, ld, false, s.vv, mq, p.Dv, nk, O, p.Dv, 1.0f, true);
        }
      }
    }
    TESSERA_TRACE_SCOPE("attn.fwd.store");  // O / l and lse, to the end of the item
    for (int64_t r = 0; r < rows; ++r) {
      const bool seen = s.l[r] != 0.0f;  // l = 0: no key seen; NaN (a non-finite key seen) stays NaN
      const float inv = seen ? 1.0f / s.l[r] * keep_scale() : 0.0f;
      const int64_t base = ((qbeg + r0 + r) * p.Hq + h) * p.Dv;
      float* o = s.O + r * p.Dv;
      for (int64_t c = 0; c < p.Dv; ++c) o[c] *= inv;
      store_row(out_.o, out_.o_dtype, base, o, p.Dv);
      out_.lse[p.lse_index(n, h, r0 + r)] = seen ? s.m[r] + std::log(s.l[r]) : kNegInf;
    }
  }

  const ForwardOut& out_;
  int64_t R_ = 1;
  std::vector<Item> items_;
  std::vector<Scratch> scratch_;
  std::vector<memory::HostBuffer> keep_;
};

// ---------------------------------------------------------------- backward

class Backward : Common {
 public:
  Backward(const Problem& prob, const BlockSizes& bs, const BackwardIn& in, const GradOut& out)
      : Common(prob, bs), in_(in), out_(out) {}

  void run() {
    TESSERA_TRACE_SCOPE("attn.bwd");
    if (out_.dbias)  // direct dbias: tiles no row visits keep 0
      std::memset(out_.dbias, 0, static_cast<size_t>(p.bias_numel()) * dtype_size(out_.dbias_dtype));
    const int64_t G = p.group();
    const int want = std::clamp(p.num_threads, 1, kMaxThreads);
    const int64_t pairs = p.N * p.Hkv;
    int64_t max_sq = 0, max_kb = 1;
    for (int64_t n = 0; n < p.N; ++n) {
      max_sq = std::max(max_sq, p.q_len(n));
      max_kb = std::max(max_kb, (p.k_len(n) + bk - 1) / bk);
    }
    // Chunks per (sequence, kv head) when there are fewer pairs than threads. With a group of
    // G >= 2 query heads the chunks split the heads (each owns its heads' dq; dk and dv become
    // f32 partials of Sk × (D + Dv), reduced in chunk order); with G = 1 they split the kv blocks
    // (each owns its blocks' dk, dv; dq becomes f32 partials of Sq × D, reduced in chunk order).
    const int64_t need = pairs >= want ? 1 : (want + pairs - 1) / pairs;
    head_split_ = need > 1 && G >= 2;
    chunks_ = head_split_ ? std::min<int64_t>(need, G) : std::min<int64_t>(need, max_kb);
    kv_split_ = chunks_ > 1 && !head_split_;
    const bool dq_f32 = out_.dq_dtype == DType::kF32;
    direct_dq_ = !kv_split_ && dq_f32;
    // Items: heaviest sequences first (by sq·sk), then kv head, chunk.
    std::vector<int64_t> order(static_cast<size_t>(p.N));
    for (int64_t n = 0; n < p.N; ++n) order[n] = n;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return p.q_len(a) * p.k_len(a) > p.q_len(b) * p.k_len(b); });
    for (int64_t n : order)
      for (int64_t kvh = 0; kvh < p.Hkv; ++kvh)
        for (int64_t c = 0; c < chunks_; ++c) items_.push_back({n, kvh, c, nullptr});
    if (chunks_ > 1) {  // one f32 partial per item: dq (kv split) or dk and dv (head split)
      size_t off = 0;
      std::vector<size_t> offs;
      for (const Item& it : items_) {
        offs.push_back(off);
        off += static_cast<size_t>(head_split_ ? p.k_len(it.n) * (p.D + p.Dv) : p.q_len(it.n) * G * p.D);
      }
      float* slots = alloc<float>(keep_, off);
      for (size_t i = 0; i < items_.size(); ++i) items_[i].partial = slots + offs[i];
    }
    const int T = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, static_cast<int64_t>(items_.size()))));
    // Q and dO of the group's heads are packed once per item (not once per q tile and kv block)
    // when that fits kPrepackBytes per thread (TESSERA_ATTENTION_CPU_PREPACK=0: never; a test seam).
    const int64_t heads = head_split_ ? (G + chunks_ - 1) / chunks_ : G;  // most heads of one item
    // The bf16 dot route also needs dO in bf16 and Qᵀ, dOᵀ of the item's heads within the budget.
    dot16 = dot16 && in_.grad_o_dtype == DType::kBF16 &&
            static_cast<size_t>(heads * (p.D + p.Dv) * max_sq) * sizeof(uint16_t) <= kPrepackBytes;
    prepack_ = !blas && !prim && !dot16 && env::flag("TESSERA_ATTENTION_CPU_PREPACK", true) &&
               static_cast<size_t>(heads * (simd::packed_floats(max_sq, p.D) + simd::packed_floats(max_sq, p.Dv))) *
                       sizeof(float) <= kPrepackBytes;
    scratch_.resize(static_cast<size_t>(T));
    for (Scratch& s : scratch_) {
      s.S = alloc<float>(keep_, static_cast<size_t>(bq * ld));
      s.dP = alloc<float>(keep_, static_cast<size_t>(bq * ld));
      if (p.softcap > 0.0) s.P = alloc<float>(keep_, static_cast<size_t>(bq * ld));
      if (p.dropout()) {
        s.keep = alloc<uint32_t>(keep_, static_cast<size_t>(bq * ld));
        if (!dot16) s.Pd = alloc<float>(keep_, static_cast<size_t>(bq * ld));
      }
      s.dK = alloc<float>(keep_, static_cast<size_t>(bk * p.D));
      s.dV = alloc<float>(keep_, static_cast<size_t>(bk * p.Dv));
      if (dot16) alloc_bf16(s, heads, max_sq);
      s.kt.packed = alloc<float>(keep_, static_cast<size_t>(packed_floats(p.D, bk)));
      s.vt.packed = alloc<float>(keep_, static_cast<size_t>(packed_floats(p.Dv, bk)));
      s.kk.packed = alloc<float>(keep_, static_cast<size_t>(packed_floats(bk, p.D)));
      s.qq.packed = alloc<float>(keep_, static_cast<size_t>(packed_floats(bq, p.D)));
      s.dd.packed = alloc<float>(keep_, static_cast<size_t>(packed_floats(bq, p.Dv)));
      s.delta = alloc<float>(keep_, static_cast<size_t>(max_sq * G));
      s.rows = alloc<float>(keep_, static_cast<size_t>(2 * p.Dv));
      if (half) {
        s.q = alloc<float>(keep_, static_cast<size_t>(bq * p.D));
        s.k = alloc<float>(keep_, static_cast<size_t>(bk * p.D));
        s.v = alloc<float>(keep_, static_cast<size_t>(bk * p.Dv));
      }
      if (in_.grad_o_dtype != DType::kF32) s.dO = alloc<float>(keep_, static_cast<size_t>(bq * p.Dv));
      if (prepack_) {
        s.qfull = alloc<float>(keep_, static_cast<size_t>(heads * simd::packed_floats(max_sq, p.D)));
        s.dofull = alloc<float>(keep_, static_cast<size_t>(heads * simd::packed_floats(max_sq, p.Dv)));
      }
      if (!kv_split_ && !dq_f32) s.dq = alloc<float>(keep_, static_cast<size_t>(max_sq * G * p.D));
    }
    std::atomic<size_t> next{0};
    run_threads(T, blas, [&](int tid) {
      for (size_t i = next.fetch_add(1); i < items_.size(); i = next.fetch_add(1)) item(scratch_[tid], items_[i]);
    });
    if (kv_split_) reduce_dq();
    if (head_split_) reduce_dkv();
  }

 private:
  struct Item {
    int64_t n, kvh, chunk;
    // This item's f32 partial when chunked: dq [sq][G][D] (kv split), or dk [sk][D] followed by
    // dv [sk][Dv] (head split).
    float* partial;
  };
  struct Scratch {
    float *S, *dP, *P = nullptr, *dK, *dV, *delta, *q = nullptr, *k = nullptr, *v = nullptr, *dO = nullptr,
                   *dq = nullptr;
    uint32_t* keep = nullptr;  // dropout: the tile's Philox words
    float* Pd = nullptr;      // dropout, f32 route: P with the dropped entries zeroed (for dV)
    BOp kt, vt, kk;  // Kᵀ, Vᵀ, K of the current kv block
    BOp qq, dd;      // Q, dO of the current q tile
    float *qfull = nullptr, *dofull = nullptr;  // prepacked Q, dO of the item's heads
    float* rows = nullptr;                       // a row of o and of dO as f32 (Δ)
    // bf16 dot route: Kᵀ, Vᵀ, K of the kv block packed for cpu_bf16_gemm; P and dS rounded to
    // bf16 and packed by rows; Qᵀ, dOᵀ [dim × sq] of the item's heads; dKᵀ, dVᵀ [dim × nk].
    uint32_t *kt16 = nullptr, *vt16 = nullptr, *kk16 = nullptr, *p16pk = nullptr, *ds16pk = nullptr;
    uint16_t *p16 = nullptr, *ds16 = nullptr, *qT = nullptr, *doT = nullptr;
    float *dKt = nullptr, *dVt = nullptr;
    const uint16_t** ptrs = nullptr;
  };

  void alloc_bf16(Scratch& s, int64_t heads, int64_t max_sq) {
    using cpu_bf16_gemm::packed_words;
    auto words = [&](int64_t K, int64_t N) { return alloc<uint32_t>(keep_, static_cast<size_t>(packed_words(K, N))); };
    s.kt16 = words(p.D, bk), s.vt16 = words(p.Dv, bk), s.kk16 = words(bk, p.D);
    s.p16pk = words(bq, bk), s.ds16pk = words(bq, bk);
    s.p16 = alloc<uint16_t>(keep_, static_cast<size_t>(bq * ld));
    s.ds16 = alloc<uint16_t>(keep_, static_cast<size_t>(bq * ld));
    s.qT = alloc<uint16_t>(keep_, static_cast<size_t>(heads * p.D * max_sq));
    s.doT = alloc<uint16_t>(keep_, static_cast<size_t>(heads * p.Dv * max_sq));
    s.dKt = alloc<float>(keep_, static_cast<size_t>(p.D * bk));
    s.dVt = alloc<float>(keep_, static_cast<size_t>(p.Dv * bk));
    s.ptrs = alloc<const uint16_t*>(keep_, static_cast<size_t>(std::max(bq, bk)));
  }

  // bf16 dot route, after P (f32, exp taken) of a tile of head h, rows i0.. of sequence n: the
  // four products with P and dS rounded to bf16; dKᵀ, dVᵀ accumulate transposed (ld nk).
  // g: the head within the group (Δ, dq), slot: its place among the item's heads (Qᵀ, dOᵀ).
  // With dropout, s.p16 has its dropped entries zeroed and s.keep holds the mask.
  void products16(Scratch& s, int64_t n, int64_t h, int64_t g, int64_t slot, int64_t i0, int64_t mq, int64_t nk,
                  const float* P, const float* Tcap, float inv_c, float* dq, int64_t dq_ld) const {
    const float zs = keep_scale();
    const int64_t sq = p.q_len(n);
    const float scale = static_cast<float>(p.scale);
    const uint16_t* qT = s.qT + slot * p.D * sq + i0;
    const uint16_t* doT = s.doT + slot * p.Dv * sq + i0;
    pack_tile16(s.p16, mq, nk, s.ptrs, s.p16pk);  // P rounded to bf16 by exp_rows
    cpu_bf16_gemm::gemm(p.Dv, nk, mq, doT, sq, s.p16pk, zs, true, s.dVt, nk);  // dVᵀ += dOᵀ·(Z∘P)
    const uint16_t* dO = row16(in_.grad_o, p.Hq, p.Dv, p.q_begin(n) + i0, h);
    cpu_bf16_gemm::gemm(mq, nk, p.Dv, dO, p.Hq * p.Dv, s.vt16, zs, false, s.dP, ld);  // dP = Z∘(dO·Vᵀ)
    if (p.dropout()) zero_dropped(s.dP, s.keep, mq, nk);
    simd::ds_rows(P, s.dP, Tcap, mq, nk, ld, s.delta + g * sq + i0, inv_c, s.ds16);
    pack_tile16(s.ds16, mq, nk, s.ptrs, s.ds16pk);
    cpu_bf16_gemm::gemm(p.D, nk, mq, qT, sq, s.ds16pk, scale, true, s.dKt, nk);      // dKᵀ += Qᵀ·dS
    cpu_bf16_gemm::gemm(mq, p.D, nk, s.ds16, ld, s.kk16, scale, true, dq, dq_ld);   // dQ += dS·K
  }

  // Stores heads [g0, g1) of an f32 [rows][G][D] dq accumulator of (sequence n, kv head kvh).
  void store_dq(int64_t n, int64_t kvh, const float* acc, int64_t g0, int64_t g1) const {
    const int64_t G = p.group(), qbeg = p.q_begin(n);
    for (int64_t i = 0; i < p.q_len(n); ++i)
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t base = ((qbeg + i) * p.Hq + kvh * G + g) * p.D;
        store_row(out_.dq, out_.dq_dtype, base, acc + (i * G + g) * p.D, p.D);
      }
  }

  // dq = Σ over chunks (in chunk order) of the partials.
  void reduce_dq() {
    TESSERA_TRACE_SCOPE("attn.bwd.reduce_dq");
    for (size_t i = 0; i < items_.size(); i += static_cast<size_t>(chunks_)) {
      const Item& first = items_[i];
      const size_t count = static_cast<size_t>(p.q_len(first.n) * p.group() * p.D);
      for (int64_t c = 1; c < chunks_; ++c) {
        const float* src = items_[i + static_cast<size_t>(c)].partial;
        for (size_t e = 0; e < count; ++e) first.partial[e] += src[e];
      }
      store_dq(first.n, first.kvh, first.partial, 0, p.group());
    }
  }

  // dk, dv = Σ over chunks (in chunk order) of the partials.
  void reduce_dkv() {
    TESSERA_TRACE_SCOPE("attn.bwd.reduce_dkv");
    for (size_t i = 0; i < items_.size(); i += static_cast<size_t>(chunks_)) {
      const Item& first = items_[i];
      const int64_t sk = p.k_len(first.n);
      const size_t count = static_cast<size_t>(sk * (p.D + p.Dv));
      for (int64_t c = 1; c < chunks_; ++c) {
        const float* src = items_[i + static_cast<size_t>(c)].partial;
        for (size_t e = 0; e < count; ++e) first.partial[e] += src[e];
      }
      store_kv(out_.dk, out_.dk_dtype, p.D, p.k_begin(first.n), first.kvh, sk, first.partial);
      store_kv(out_.dv, out_.dv_dtype, p.Dv, p.k_begin(first.n), first.kvh, sk, first.partial + sk * p.D);
    }
  }

  // Direct dbias (direct_dbias(p): a bias that is not broadcast, no soft cap): each element has
  // one term, the dS of its (sequence, head, row, key), written as the tile is computed; dbias
  // was zeroed first for the tiles no row visits.
  void store_dbias(int64_t n, int64_t h, int64_t i0, int64_t mq, int64_t j0, int64_t nk, const float* dS) const {
    for (int64_t r = 0; r < mq; ++r)
      store_row(out_.dbias, out_.dbias_dtype, p.bias_offset(n, h, i0 + r, j0), dS + r * ld, nk);
  }

  void store_kv(void* dst, DType dt, int64_t dim, int64_t krow0, int64_t kvh, int64_t nk, const float* acc) const {
    for (int64_t j = 0; j < nk; ++j) store_row(dst, dt, ((krow0 + j) * p.Hkv + kvh) * dim, acc + j * dim, dim);
  }

  void item(Scratch& s, const Item& it) const {
    TESSERA_TRACE_SCOPE_I("attn.bwd.item", it.kvh);  // self time: Δ, prepacking Q and dO
    const int64_t n = it.n, kvh = it.kvh, G = p.group();
    const int64_t sq = p.q_len(n), sk = p.k_len(n), qbeg = p.q_begin(n), kbeg = p.k_begin(n);
    // This item's query heads of the group: all, or its share under the head split.
    const int64_t g0 = head_split_ ? it.chunk * G / chunks_ : 0;
    const int64_t g1 = head_split_ ? (it.chunk + 1) * G / chunks_ : G;
    // Δ_i = Σ_c dO_ic · o_ic per row of each query head (f32).
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t base = ((qbeg + i) * p.Hq + kvh * G + g) * p.Dv;
        s.delta[g * sq + i] = simd::dot(row_f32(in_.o, in_.o_dtype, base, p.Dv, s.rows),
                                        row_f32(in_.grad_o, in_.grad_o_dtype, base, p.Dv, s.rows + p.Dv), p.Dv);
      }
    // The dq accumulator: the f32 output itself, this item's partial, or the thread's buffer.
    float* dq;
    int64_t dq_ld;
    if (direct_dq_) {
      dq = static_cast<float*>(out_.dq) + (qbeg * p.Hq + kvh * G) * p.D;
      dq_ld = p.Hq * p.D;
    } else {
      dq = kv_split_ ? it.partial : s.dq;
      dq_ld = G * p.D;
    }
    for (int64_t i = 0; i < sq; ++i) std::fill(dq + i * dq_ld + g0 * p.D, dq + i * dq_ld + g1 * p.D, 0.0f);
    const int64_t nb = (sk + bk - 1) / bk;
    const int64_t kb0 = kv_split_ ? it.chunk * nb / chunks_ : 0, kb1 = kv_split_ ? (it.chunk + 1) * nb / chunks_ : nb;
    const int64_t qsz = simd::packed_floats(sq, p.D), dsz = simd::packed_floats(sq, p.Dv);
    if (dot16)  // Qᵀ and dOᵀ [dim × sq] of the item's heads, bf16
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t h = kvh * G + g;
        transpose_bf16(row16(p.q, p.Hq, p.D, qbeg, h), p.Hq * p.D, sq, p.D, s.qT + (g - g0) * p.D * sq, sq);
        transpose_bf16(row16(in_.grad_o, p.Hq, p.Dv, qbeg, h), p.Hq * p.Dv, sq, p.Dv, s.doT + (g - g0) * p.Dv * sq,
                       sq);
      }
    if (prepack_)
      for (int64_t g = g0; g < g1; ++g)
        for (int64_t r0 = 0; r0 < sq; r0 += bq) {
          const int64_t c = std::min(bq, sq - r0);
          int64_t ldq = 0, lddo = 0;
          const float* Q = rows_f32(p.q, p.dtype, p.Hq, p.D, qbeg + r0, kvh * G + g, c, s.q, &ldq);
          simd::pack_b(Q, ldq, false, c, p.D, s.qfull + (g - g0) * qsz, sq, r0);
          const float* dO = rows_f32(in_.grad_o, in_.grad_o_dtype, p.Hq, p.Dv, qbeg + r0, kvh * G + g, c, s.dO, &lddo);
          simd::pack_b(dO, lddo, false, c, p.Dv, s.dofull + (g - g0) * dsz, sq, r0);
        }
    const float scale = static_cast<float>(p.scale);
    const float inv_c = p.softcap > 0.0 ? static_cast<float>(1.0 / p.softcap) : 0.0f;
    for (int64_t kb = kb0; kb < kb1; ++kb) {
      TESSERA_TRACE_SCOPE_I("attn.bwd.kv_block", kb);  // pack K, V; five products per q tile; store dK, dV
      const int64_t j0 = kb * bk, nk = std::min(bk, sk - j0);
      if (dot16) {
        pack16(p.k, p.Hkv, p.D, kbeg + j0, kvh, nk, true, s.ptrs, s.kt16);
        pack16(p.v, p.Hkv, p.Dv, kbeg + j0, kvh, nk, true, s.ptrs, s.vt16);
        pack16(p.k, p.Hkv, p.D, kbeg + j0, kvh, nk, false, s.ptrs, s.kk16);
        std::fill(s.dKt, s.dKt + p.D * nk, 0.0f);
        std::fill(s.dVt, s.dVt + p.Dv * nk, 0.0f);
      } else {
        int64_t ldk = 0, ldv = 0;
        const float* K = rows_f32(p.k, p.dtype, p.Hkv, p.D, kbeg + j0, kvh, nk, s.k, &ldk);
        const float* V = rows_f32(p.v, p.dtype, p.Hkv, p.Dv, kbeg + j0, kvh, nk, s.v, &ldv);
        pack(s.kt, K, ldk, true, p.D, nk);
        pack(s.vt, V, ldv, true, p.Dv, nk);
        pack(s.kk, K, ldk, false, nk, p.D);
        std::fill(s.dK, s.dK + nk * p.D, 0.0f);
        std::fill(s.dV, s.dV + nk * p.Dv, 0.0f);
      }
      // Rows whose allowed keys meet this block (contiguous: the ranges are monotone in i).
      int64_t ilo = sq, ihi = 0;
      for (int64_t i = 0; i < sq; ++i) {
        int64_t lo, hi;
        p.key_range(n, i, &lo, &hi);
        if (lo < hi && lo < j0 + nk && hi > j0) {
          ilo = std::min(ilo, i);
          ihi = i + 1;
        }
      }
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t h = kvh * G + g;
        const float* lse = in_.lse + p.lse_index(n, h, 0);  // contiguous in i (both forms)
        for (int64_t i0 = ilo; i0 < ihi; i0 += bq) {
          const int64_t mq = std::min(bq, ihi - i0);
          int64_t ldq = 0, lddo = 0;
          const float *Q = nullptr, *dO = nullptr;
          if (dot16) {
            cpu_bf16_gemm::gemm(mq, nk, p.D, row16(p.q, p.Hq, p.D, qbeg + i0, h), p.Hq * p.D, s.kt16, scale, false,
                                s.S, ld);
          } else {
            Q = rows_f32(p.q, p.dtype, p.Hq, p.D, qbeg + i0, h, mq, s.q, &ldq);
            dO = rows_f32(in_.grad_o, in_.grad_o_dtype, p.Hq, p.Dv, qbeg + i0, h, mq, s.dO, &lddo);
            if (prepack_) {
              s.qq = {Q, ldq, false, s.qfull + (g - g0) * qsz, sq, i0};
              s.dd = {dO, lddo, false, s.dofull + (g - g0) * dsz, sq, i0};
            } else {
              pack(s.qq, Q, ldq, false, mq, p.D);
              pack(s.dd, dO, lddo, false, mq, p.Dv);
            }
            mm(Q, ldq, false, s.kt, mq, nk, p.D, s.S, ld, scale, false);
          }
          float* P = s.S;
          const float* Tcap = nullptr;
          if (p.softcap > 0.0) {
            simd::softcap(s.S, mq, nk, ld, static_cast<float>(p.softcap));
            std::memcpy(s.P, s.S, static_cast<size_t>(mq * ld) * sizeof(float));
            P = s.P;
            Tcap = s.S;
          }
          add_positional(n, h, i0, mq, j0, nk, P);
          mask_tile(n, i0, mq, j0, nk, P);
          simd::exp_rows(P, mq, nk, ld, lse + i0, dot16 ? s.p16 : nullptr);
          const float* Pv = P;  // the P that meets v: dropped entries zeroed (dV); dS takes P
          if (p.dropout()) {
            dropout_mask(n, h, i0, mq, j0, nk, s.keep);
            if (dot16) {
              zero_dropped(s.p16, s.keep, mq, nk);
            } else {
              std::memcpy(s.Pd, P, static_cast<size_t>(mq * ld) * sizeof(float));
              zero_dropped(s.Pd, s.keep, mq, nk);
              Pv = s.Pd;
            }
          }
          if (dot16) {
            products16(s, n, h, g, g - g0, i0, mq, nk, P, Tcap, inv_c, dq + i0 * dq_ld + g * p.D, dq_ld);
            if (out_.dbias) {  // direct dbias: dS in f32 from the kept dP (products16 rounded a copy)
              simd::ds_rows(P, s.dP, nullptr, mq, nk, ld, s.delta + g * sq + i0, 0.0f);
              store_dbias(n, h, i0, mq, j0, nk, s.dP);
            }
            continue;
          }
          mm(Pv, ld, true, s.dd, nk, p.Dv, mq, s.dV, p.Dv, keep_scale(), true);              // dV += (Z∘P)ᵀ·dO
          mm(dO, lddo, false, s.vt, mq, nk, p.Dv, s.dP, ld, keep_scale(), false);            // dP = Z∘(dO·Vᵀ)
          if (p.dropout()) zero_dropped(s.dP, s.keep, mq, nk);
          simd::ds_rows(P, s.dP, Tcap, mq, nk, ld, s.delta + g * sq + i0, inv_c);
          if (out_.dbias) store_dbias(n, h, i0, mq, j0, nk, s.dP);  // direct dbias (no soft cap)
          mm(s.dP, ld, true, s.qq, nk, p.D, mq, s.dK, p.D, scale, true);                     // dK += dSᵀ·Q
          mm(s.dP, ld, false, s.kk, mq, p.D, nk, dq + i0 * dq_ld + g * p.D, dq_ld, scale, true);  // dQ += dS·K
        }
      }
      if (dot16) {  // dKᵀ, dVᵀ back to rows
        transpose_f32(s.dKt, nk, p.D, nk, s.dK, p.D);
        transpose_f32(s.dVt, nk, p.Dv, nk, s.dV, p.Dv);
      }
      if (head_split_) {  // into this item's partials, reduced after the workers join
        std::memcpy(it.partial + j0 * p.D, s.dK, static_cast<size_t>(nk * p.D) * sizeof(float));
        std::memcpy(it.partial + sk * p.D + j0 * p.Dv, s.dV, static_cast<size_t>(nk * p.Dv) * sizeof(float));
      } else {
        store_kv(out_.dk, out_.dk_dtype, p.D, kbeg + j0, kvh, nk, s.dK);
        store_kv(out_.dv, out_.dv_dtype, p.Dv, kbeg + j0, kvh, nk, s.dV);
      }
    }
    if (!direct_dq_ && !kv_split_) store_dq(n, kvh, dq, g0, g1);
  }

  static constexpr size_t kPrepackBytes = size_t{8} << 20;

  const BackwardIn& in_;
  const GradOut& out_;
  bool prepack_ = false;
  int64_t chunks_ = 1;
  bool head_split_ = false, kv_split_ = false;
  bool direct_dq_ = false;
  std::vector<Item> items_;
  std::vector<Scratch> scratch_;
  std::vector<memory::HostBuffer> keep_;
};

// ---------------------------------------------------------------- dbias

// dbias = dS summed over the bias's broadcast dims, in a pass of its own after the backward. A
// tile of dbias is one (b, h) of its shape, q rows [i0, i0 + bq) (all rows when Sq is broadcast)
// and keys [j0, j0 + bk) (all keys when Sk is); the (sequence, head) pairs that sum into it (all
// of B and Hq where broadcast) are cut into `slices` runs, kMinItems work items in all where a
// tile has pairs enough to share (the count depends on the shape only, never on the threads). An
// item walks its pairs' (kv block, q tile) tiles in a fixed order, recomputing S = scale·Q·Kᵀ and
// dP = Z∘(dO·Vᵀ) (two of the backward's five products, on the bf16 dot route where the backward
// runs there) and dS = P ∘ (dP − Δ) before the soft cap's factor (the bias is added after the
// cap), summed into an f32 tile; slices are added in slice order after the workers join. The
// same bits whatever the thread count.
class BiasGrad : Common {
 public:
  BiasGrad(const Problem& prob, const BlockSizes& bs, const BackwardIn& in, const GradOut& out)
      : Common(prob, bs), in_(in), out_(out) {
    dot16 = dot16 && in_.grad_o_dtype == DType::kBF16;  // dO read as bf16 too
  }

  void run() {
    TESSERA_TRACE_SCOPE("attn.bwd.dbias");
    plan();
    const int T = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>(std::clamp(p.num_threads, 1, kMaxThreads), std::ssize(items_))));
    scratch_.resize(static_cast<size_t>(T));
    for (Scratch& s : scratch_) alloc_scratch(s);
    std::atomic<size_t> next{0};
    run_threads(T, blas, [&](int tid) {
      for (size_t i = next.fetch_add(1); i < items_.size(); i = next.fetch_add(1)) item(scratch_[tid], items_[i]);
    });
    if (slices_ > 1) reduce();
  }

 private:
  static constexpr int64_t kMinItems = 32;

  struct Item {
    int64_t b, h, i, j;     // dbias's (b, h) and its tile of rows and of keys
    int64_t pair0, pair1;   // the (sequence, head) pairs of this slice, in order
    float* partial;         // slices > 1: this slice's sums of the tile (arows × acols)
  };
  struct Scratch {
    float *S, *dP, *acc, *q, *dO, *k, *v, *delta, *rows;
    uint32_t* keep = nullptr;
    BOp kt, vt;                                   // Kᵀ, Vᵀ of the kv block (f32 route)
    uint32_t *kt16 = nullptr, *vt16 = nullptr;    // the same packed for cpu_bf16_gemm
    const uint16_t** ptrs = nullptr;
  };

  bool all(int d) const { return p.bias_shape[d] == 1; }
  int64_t pairs() const { return (all(0) ? p.N : 1) * (all(1) ? p.Hq : 1); }
  // Rows [*r0, *r1) and keys [*k0, *k1) of tile (i, j).
  void tile_range(const Item& it, int64_t* r0, int64_t* r1, int64_t* k0, int64_t* k1) const {
    *r0 = all(2) ? 0 : it.i * bq, *r1 = all(2) ? p.Sq : std::min(p.Sq, *r0 + bq);
    *k0 = all(3) ? 0 : it.j * bk, *k1 = all(3) ? p.Sk : std::min(p.Sk, *k0 + bk);
  }
  // The tile's accumulator: rows (1 when Sq is broadcast) × columns (1 when Sk is).
  void tile_dims(const Item& it, int64_t* arows, int64_t* acols) const {
    int64_t r0, r1, k0, k1;
    tile_range(it, &r0, &r1, &k0, &k1);
    *arows = all(2) ? 1 : r1 - r0, *acols = all(3) ? 1 : k1 - k0;
  }
  int64_t tile_size(const Item& it) const {
    int64_t arows, acols;
    tile_dims(it, &arows, &acols);
    return arows * acols;
  }

  void plan() {
    const int64_t ti = all(2) ? 1 : (p.Sq + bq - 1) / bq, tj = all(3) ? 1 : (p.Sk + bk - 1) / bk;
    const int64_t tiles = p.bias_shape[0] * p.bias_shape[1] * ti * tj, np = pairs();
    slices_ = std::clamp<int64_t>((kMinItems + tiles - 1) / tiles, 1, np);
    for (int64_t b = 0; b < p.bias_shape[0]; ++b)
      for (int64_t h = 0; h < p.bias_shape[1]; ++h)
        for (int64_t i = 0; i < ti; ++i)
          for (int64_t j = 0; j < tj; ++j)
            for (int64_t c = 0; c < slices_; ++c)
              items_.push_back({b, h, i, j, c * np / slices_, (c + 1) * np / slices_, nullptr});
    if (slices_ == 1) return;
    size_t total = 0;
    for (const Item& it : items_) total += static_cast<size_t>(tile_size(it));
    float* slot = alloc<float>(keep_, total);
    for (Item& it : items_) it.partial = slot, slot += tile_size(it);
  }

  void alloc_scratch(Scratch& s) {
    auto floats = [&](int64_t count) { return alloc<float>(keep_, static_cast<size_t>(count)); };
    s.S = floats(bq * ld), s.dP = floats(bq * ld), s.acc = floats(bq * ld);
    s.delta = floats(bq), s.rows = floats(2 * p.Dv);
    if (p.dropout()) s.keep = alloc<uint32_t>(keep_, static_cast<size_t>(bq * ld));
    if (dot16) {
      auto words = [&](int64_t K) {
        return alloc<uint32_t>(keep_, static_cast<size_t>(cpu_bf16_gemm::packed_words(K, bk)));
      };
      s.kt16 = words(p.D), s.vt16 = words(p.Dv);
      s.ptrs = alloc<const uint16_t*>(keep_, static_cast<size_t>(bk));
      return;
    }
    s.q = floats(bq * p.D), s.dO = floats(bq * p.Dv), s.k = floats(bk * p.D), s.v = floats(bk * p.Dv);
    s.kt.packed = floats(packed_floats(p.D, bk)), s.vt.packed = floats(packed_floats(p.Dv, bk));
  }

  // Whether some row of [i0, i0 + mq) may see a key of [j0, j0 + nk) by position (key ranges
  // move right with i: the first row's start and the last row's end bound their union).
  bool meets(int64_t n, int64_t i0, int64_t mq, int64_t j0, int64_t nk) const {
    int64_t lo, hi, unused;
    p.key_range(n, i0, &lo, &unused);
    p.key_range(n, i0 + mq - 1, &unused, &hi);
    return lo < hi && lo < j0 + nk && hi > j0;
  }

  // Packs K and V of keys [j0, j0 + nk) of sequence n, kv head kvh (Kᵀ and Vᵀ as operands B).
  void pack_block(Scratch& s, int64_t n, int64_t kvh, int64_t j0, int64_t nk) const {
    const int64_t krow = p.k_begin(n) + j0;
    if (dot16) {
      pack16(p.k, p.Hkv, p.D, krow, kvh, nk, true, s.ptrs, s.kt16);
      pack16(p.v, p.Hkv, p.Dv, krow, kvh, nk, true, s.ptrs, s.vt16);
      return;
    }
    int64_t ldk = 0, ldv = 0;
    const float* K = rows_f32(p.k, p.dtype, p.Hkv, p.D, krow, kvh, nk, s.k, &ldk);
    const float* V = rows_f32(p.v, p.dtype, p.Hkv, p.Dv, krow, kvh, nk, s.v, &ldv);
    pack(s.kt, K, ldk, true, p.D, nk);
    pack(s.vt, V, ldv, true, p.Dv, nk);
  }

  // S = scale·Q·Kᵀ and dP = Z∘(dO·Vᵀ) of head h, rows i0.. (before dropout's zeroes).
  void products(Scratch& s, int64_t n, int64_t h, int64_t i0, int64_t mq, int64_t nk) const {
    const int64_t qrow = p.q_begin(n) + i0;
    const float scale = static_cast<float>(p.scale);
    if (dot16) {
      cpu_bf16_gemm::gemm(mq, nk, p.D, row16(p.q, p.Hq, p.D, qrow, h), p.Hq * p.D, s.kt16, scale, false, s.S, ld);
      cpu_bf16_gemm::gemm(mq, nk, p.Dv, row16(in_.grad_o, p.Hq, p.Dv, qrow, h), p.Hq * p.Dv, s.vt16, keep_scale(),
                          false, s.dP, ld);
      return;
    }
    int64_t ldq = 0, lddo = 0;
    const float* Q = rows_f32(p.q, p.dtype, p.Hq, p.D, qrow, h, mq, s.q, &ldq);
    const float* dO = rows_f32(in_.grad_o, in_.grad_o_dtype, p.Hq, p.Dv, qrow, h, mq, s.dO, &lddo);
    mm(Q, ldq, false, s.kt, mq, nk, p.D, s.S, ld, scale, false);
    mm(dO, lddo, false, s.vt, mq, nk, p.Dv, s.dP, ld, keep_scale(), false);
  }

  // dS (before the soft cap's factor) of head h, rows i0.., keys j0.. into s.dP; K and V of the
  // block are packed in s.
  void ds_tile(Scratch& s, int64_t n, int64_t h, int64_t i0, int64_t mq, int64_t j0, int64_t nk) const {
    products(s, n, h, i0, mq, nk);
    transform_tile(n, h, i0, mq, j0, nk, s.S);
    mask_tile(n, i0, mq, j0, nk, s.S);
    simd::exp_rows(s.S, mq, nk, ld, in_.lse + p.lse_index(n, h, i0));
    if (p.dropout()) {
      dropout_mask(n, h, i0, mq, j0, nk, s.keep);
      zero_dropped(s.dP, s.keep, mq, nk);
    }
    const int64_t qrow = p.q_begin(n) + i0;
    for (int64_t r = 0; r < mq; ++r) {  // Δ_i = Σ_c dO_ic · o_ic
      const int64_t base = ((qrow + r) * p.Hq + h) * p.Dv;
      s.delta[r] = simd::dot(row_f32(in_.o, in_.o_dtype, base, p.Dv, s.rows),
                             row_f32(in_.grad_o, in_.grad_o_dtype, base, p.Dv, s.rows + p.Dv), p.Dv);
    }
    simd::ds_rows(s.S, s.dP, nullptr, mq, nk, ld, s.delta, 0.0f);
  }

  // Adds dS of (n, h) over the tile's rows and keys into acc (ld-strided, the tile's layout).
  void add_pair(Scratch& s, int64_t n, int64_t h, int64_t r0, int64_t r1, int64_t k0, int64_t k1) const {
    for (int64_t j0 = k0; j0 < k1; j0 += bk) {
      const int64_t nk = std::min(bk, k1 - j0);
      bool packed = false;
      for (int64_t i0 = r0; i0 < r1; i0 += bq) {
        const int64_t mq = std::min(bq, r1 - i0);
        if (!meets(n, i0, mq, j0, nk)) continue;  // every dS of the tile is 0
        if (!packed) pack_block(s, n, h / p.group(), j0, nk), packed = true;
        ds_tile(s, n, h, i0, mq, j0, nk);
        for (int64_t r = 0; r < mq; ++r) {
          float* acc = s.acc + (all(2) ? 0 : i0 - r0 + r) * ld + (all(3) ? 0 : j0 - k0);
          const float* ds = s.dP + r * ld;
          if (all(3))
            for (int64_t j = 0; j < nk; ++j) acc[0] += ds[j];
          else
            for (int64_t j = 0; j < nk; ++j) acc[j] += ds[j];
        }
      }
    }
  }

  void item(Scratch& s, const Item& it) const {
    int64_t r0, r1, k0, k1, arows, acols;
    tile_range(it, &r0, &r1, &k0, &k1);
    tile_dims(it, &arows, &acols);
    std::fill(s.acc, s.acc + arows * ld, 0.0f);
    const int64_t nh = all(1) ? p.Hq : 1;
    for (int64_t pr = it.pair0; pr < it.pair1; ++pr) {
      const int64_t n = all(0) ? pr / nh : it.b, h = all(1) ? pr % nh : it.h;
      add_pair(s, n, h, r0, r1, k0, k1);
    }
    if (it.partial) {  // this slice's sums, added in slice order by reduce()
      for (int64_t r = 0; r < arows; ++r)
        std::memcpy(it.partial + r * acols, s.acc + r * ld, static_cast<size_t>(acols) * sizeof(float));
      return;
    }
    store(it, s.acc, ld);
  }

  // dbias is contiguous in the bias's shape: the tile's rows at the bias's offsets.
  void store(const Item& it, const float* acc, int64_t lda) const {
    int64_t r0, r1, k0, k1, arows, acols;
    tile_range(it, &r0, &r1, &k0, &k1);
    tile_dims(it, &arows, &acols);
    for (int64_t r = 0; r < arows; ++r)
      store_row(out_.dbias, out_.dbias_dtype, p.bias_offset(it.b, it.h, r0 + r, k0), acc + r * lda, acols);
  }

  // Each tile: its slices' sums added in slice order, then stored.
  void reduce() {
    for (size_t i = 0; i < items_.size(); i += static_cast<size_t>(slices_)) {
      const Item& first = items_[i];
      const int64_t count = tile_size(first);
      for (int64_t c = 1; c < slices_; ++c) {
        const float* src = items_[i + static_cast<size_t>(c)].partial;
        for (int64_t e = 0; e < count; ++e) first.partial[e] += src[e];
      }
      int64_t arows, acols;
      tile_dims(first, &arows, &acols);
      store(first, first.partial, acols);  // partials are compact: arows × acols
    }
  }

  const BackwardIn& in_;
  const GradOut& out_;
  int64_t slices_ = 1;
  std::vector<Item> items_;
  std::vector<Scratch> scratch_;
  std::vector<memory::HostBuffer> keep_;
};

class Cpu final : public Implementation {
 public:
  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return "optimized CPU backend: flash-style q x kv tiles, register-blocked micro-kernel products (AVX-512 f32, "
           "AVX512-BF16 dot for bf16) + online softmax, FA2 backward (deterministic); D, Dv <= 256; "
           "extra memory O(threads x tile)";
  }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU)
      return Availability::no("inputs are on " + p.device.str() + ", the cpu backend runs on host memory");
    if (p.D > kMaxHeadDim || p.Dv > kMaxHeadDim)
      return Availability::no("the cpu backend supports head dims D <= " + std::to_string(kMaxHeadDim) + " and Dv <= " +
                              std::to_string(kMaxHeadDim) + ", got D=" + std::to_string(p.D) +
                              ", Dv=" + std::to_string(p.Dv));
    if (p.Hq * std::max(p.D, p.Dv) > INT_MAX)
      return Availability::no("Hq*D must be < 2^31 (BLAS uses 32-bit leading dimensions)");
    return Availability::yes();
  }

  BlockSizes default_block_sizes(const Problem&) const override { return BlockSizes{}; }
  bool tunable() const override { return true; }
  // q blocks of 64..256 rows × kv tiles of 128..512 keys: the range where a tile's K/V panel
  // (kv × D floats, 128–512 KiB at D = 256) moves between L2-resident and not. 96 and 192 are
  // whole strips of cpu_f32_gemm's 6-row micro-tile (64, 128 and 256 leave a 4- or 2-row tail):
  // on a Zen 4 the f32 forward at 1×2048×8×128 ran 2–4 % faster at q = 96 or 192 than at 64.
  std::vector<BlockSizes> candidate_block_sizes(const Problem&) const override {
    std::vector<BlockSizes> out;
    for (int64_t q : {64, 96, 128, 192, 256})
      for (int64_t kv : {128, 256, 512}) out.push_back({q, kv});
    return out;
  }

  void validate_block_sizes(const BlockSizes& bs) const override {
    auto fail = [](const std::string& what) {
      throw Error(ErrorCode::kInvalidArgument, std::string(kKernelName) + " cpu: invalid block sizes: " + what);
    };
    if (bs.q < 1 || bs.q > kMaxBlockQ)
      fail("q (query block) must be in [1, " + std::to_string(kMaxBlockQ) + "], got " + std::to_string(bs.q));
    if (bs.kv < 1 || bs.kv > kMaxBlockKv)
      fail("kv (key block) must be in [1, " + std::to_string(kMaxBlockKv) + "], got " + std::to_string(bs.kv));
  }

  void forward(const Problem& p, const BlockSizes& bs, const ForwardOut& out) const override {
    validate_block_sizes(bs);
    Forward(p, bs, out).run();
  }
  void backward(const Problem& p, const BlockSizes& bs, const BackwardIn& in, const GradOut& out) const override {
    validate_block_sizes(bs);
    GradOut main = out;
    if (!direct_dbias(p)) main.dbias = nullptr;  // the main pass writes dbias only when direct
    Backward(p, bs, in, main).run();
    if (out.dbias && !direct_dbias(p)) BiasGrad(p, bs, in, out).run();
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cpu_implementation() { return std::make_unique<Cpu>(); }

}  // namespace tessera::attention
