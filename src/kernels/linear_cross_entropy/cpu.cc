// linear_cross_entropy: the optimized CPU backend ("cpu").
// new_version: folded versions begin
// Its experimental version "cpu_v2" differs in one route (Call::use_w_copy) and shares every
// other phase (registered at the end of this file).
// new_version: folded versions end
//
// Design (docs/kernels/linear_cross_entropy.md, "cpu backend"):
//
//   Tokens are processed in blocks of b rows. All threads work on the same token block at a
//   time; thread k owns a fixed, contiguous vocabulary range [r0_k, r1_k) (V split evenly) and,
//   for dx, a fixed hidden range [h0_k, h1_k). Per token block:
//
//   A  (vocab range)  for each vocab block of v columns: logits tile = x_blk · w_blk (one real
//                     BLAS sgemm, single-threaded inside the worker), + bias, soft cap, then an
//                     online (streaming) max / sum-exp, Σz, argmax and label pick per row (SIMD,
//                     f32; the running per-row state is f64).
//   merge (rows)      per-row partials of the threads are combined in thread order -> lse, loss.
//   B1 (vocab range)  [gradients only] the logits of the whole token block were kept in a b×V
//                     f32 slab during A; they become dz in place (p − onehot formed in f32, the
//                     label column in f64), dbias += Σ_rows dz, dw[:, range] += x_blkᵀ · dz.
//   B2 (hidden range) [gradients only] dx_blk[:, range] = dz · w[range]ᵀ (K = V in one sgemm).
//
//   So the fused pass costs three GEMMs (the minimum: logits, dx, dw), no recomputation. The
//   price is the b×V slab; the default b keeps it <= 32 MiB (b = 256 at V = 32k, 64 at 128k).
//   Forward alone keeps only a b×v tile per thread.
//
//   Determinism: every sum has a fixed order for a fixed thread count (threads own disjoint
//   vocab/hidden ranges, partials are merged in thread order, no atomics), so results are
//   bitwise reproducible for a fixed num_threads. Different thread counts differ by rounding.
//
//   bf16 on a CPU with AVX512-BF16 (the "dot route", below `---- the bf16 dot-product route`):
//   the three GEMMs run on cpu_bf16_gemm's packed vdpbf16ps micro-kernel, w packed chunk by
//   chunk (never whole), dz rounded to bf16 for dw / dx; forward alone packs each chunk of w
//   once per call. TESSERA_CPU_BF16_DOT=0 selects the f32 route instead.
//   f32, f16 and bf16 off the dot route on a CPU with AVX-512F (the "pk route", below `---- the
//   f32 packed route`): the three GEMMs run on cpu_f32_gemm's packed FMA micro-kernel instead of
//   sgemm, in vocab chunks of at most kPkMaxCols, the slab chunk-major; w packed chunk by chunk
//   per token block, never whole (a 16-bit w widened to f32 as it is packed: pack_half).
//   TESSERA_CPU_F32_GEMM=0 keeps OpenBLAS (the v0.3 route).
//   f16 and bf16 off the dot route: x_blk is converted to f32 once per token block (b×H); on
//   the OpenBLAS route w is converted per (h-block × v-block) chunk into a per-thread buffer,
//   never as a whole (cpu_v2, either route: into one f32 copy of w per gradient call, memory
//   budget permitting; then as f32).
//   Gradients accumulate in f32; a bf16/f16 dw output needs an f32 accumulator of w's size
//   (gradient-sized, documented); a bf16/f16 dx needs a b×H f32 buffer.
//
// Threads: the shared worker threads (primitives/cpu_threads.h: parked between calls) + a
// spin-then-sleep barrier. Not OpenMP: static ownership with explicit barriers is what makes the sums
// deterministic, and it avoids mixing an OpenMP runtime with OpenBLAS's own pthread pool.
// While a call runs, OpenBLAS is switched to one thread (process-wide, reference-counted,
// restored afterwards), because each worker calls sgemm on its own tile.

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/memory.h"
#include "core/trace.h"
#include "primitives/cpu_bf16_gemm.h"
#include "primitives/cpu_blas.h"
#include "primitives/cpu_threads.h"
#include "primitives/cpu_convert.h"
#include "primitives/cpu_f32_gemm.h"
#include "kernels/linear_cross_entropy/cpu_rows.h"
#include "kernels/linear_cross_entropy/cpu_simd.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "kernels/linear_cross_entropy/cpu_vocab_slices.h"
#include "tessera/error.h"

namespace tessera::linear_cross_entropy {
namespace {

namespace simd = cpu_simd;

constexpr int64_t kMaxBlock = int64_t{1} << 20;
constexpr int64_t kMaxBlockB = int64_t{1} << 16;
constexpr int kMaxThreads = 1024;
constexpr int64_t kMinWorkPerThread = int64_t{1} << 16;  // multiply-adds per token block
constexpr size_t kSlabTargetBytes = size_t{32} << 20;  // default b keeps the b×V slab below this
// The pack-once forward keeps, per thread, a vocab chunk of w packed over all of H: it runs only
// while those chunks of all threads fit this (and Options::memory_budget when set); above it
// (many threads, large H · v) the forward packs per token block instead (phase_a), whose scratch
// does not grow with H.
constexpr size_t kOnceBudgetBytes = size_t{32} << 20;
// f32 packed route: a vocab chunk is at most this wide, so that a packed panel of the dx GEMM's
// dz (chunk rows × 64 tokens, 128 KiB) and of w (h rows × 64) stay in the L2 beside their A.
constexpr int64_t kPkMaxCols = 512;
// and the dx GEMM takes w in blocks of this many rows (48 × 512 floats, 96 KiB), which stay in
// the L2 while every panel of the chunk's packed dz passes over them.
constexpr int64_t kPkDxRows = 48;


// A reusable barrier that spins briefly before sleeping (std::atomic::wait). A token block
// crosses up to five barriers; on an idle machine the other worker usually arrives within
// microseconds, and spinning saves the futex wake-up (~10-50 µs) that std::barrier pays.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n), count_(n) {}
  void arrive_and_wait() {
    const uint32_t gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_sub(1, std::memory_order_acq_rel) == 1) {  // last to arrive
      count_.store(n_, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
      gen_.notify_all();
      return;
    }
    // Spin a little, then yield (so that, with more threads than free cores, the thread we
    // wait for can run), then sleep.
    for (int i = 0; i < kSpins + kYields; ++i) {
      if (gen_.load(std::memory_order_acquire) != gen) return;
      if (i < kSpins) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        std::this_thread::yield();
      }
    }
    while (gen_.load(std::memory_order_acquire) == gen) gen_.wait(gen, std::memory_order_acquire);
  }

 private:
  static constexpr int kSpins = 1000;  // pause loop, ~5-30 µs
  static constexpr int kYields = 100;
  const int n_;
  std::atomic<int> count_;
  std::atomic<uint32_t> gen_{0};
};

// Row-major sgemm, alpha = 1: C = op(A)·op(B) + beta·C. Dimensions were checked to fit int.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cpu_blas::sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}


struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// Part k of n of [0, len), boundaries aligned to `align` elements (the last part takes the rest).
Range split(int64_t len, int k, int n, int64_t align) {
  int64_t chunk = (len + n - 1) / n;
  chunk = (chunk + align - 1) / align * align;
  const int64_t b = std::min(len, chunk * k);
  return {b, std::min(len, b + chunk)};
}

// dst[begin, begin + n) = src[0, n) rounded to dst's dtype (bf16, f16: cpu_convert's SIMD loops,
// the same rounding as store_from_f32's f32_to_bf16 / f32_to_f16, bit for bit).
void store_rounded(void* dst, DType dt, int64_t begin, const float* src, int64_t n) {
  auto* d16 = static_cast<uint16_t*>(dst) + begin;
  if (dt == DType::kBF16)
    cpu_convert::f32_to_bf16(src, d16, n);
  else if (dt == DType::kF16)
    cpu_convert::f32_to_f16(src, d16, n);
  else
    for (int64_t i = 0; i < n; ++i) store_from_f32(dst, dt, begin + i, src[i]);
}

// Per-row online softmax state of one thread's vocab range.
using cpu_rows::RowPartial;

enum class Mode { kForward, kBackward, kFused };

struct Call {
  const Problem& p;
  Mode mode;
  const ForwardOut* fout = nullptr;
  const GradIn* gin = nullptr;
  const GradOut* gout = nullptr;

  int T = 1;
  int64_t bb = 1, vb = 1, hb = 1;  // effective block sizes
  const bool copy_w;               // cpu_v2: a half w converted to f32 once per gradient call (use_w_copy)
  bool half = false;               // bf16 / f16 inputs
  bool dot = false;                // bf16 on the AVX512-BF16 dot product (cpu_bf16_gemm), see below
  bool pk = false;                 // the packed AVX-512 f32 micro-kernel (cpu_f32_gemm; not dot), see below
  int64_t bbp = 1;                 // pk: bb rounded up to cpu_f32_gemm::kPanel (a slab slot's rows)
  bool fwd_once = false;           // dot / pk forward: each w chunk packed once per call, all tokens
  int64_t vo = 1;                  // fwd_once: columns of a packed chunk, min(vb, a thread's range)
  int64_t rb = 1;                  // rows of the per-row state: bb, or B when fwd_once
  bool grads = false;
  bool need_stats = true;          // false when backward was given the forward's lse
  double denom = 1.0;              // mean denominator Σ weights (non-ignored)

  // scratch (all through memory::host_alloc)
  memory::HostBuffer part_buf, row_buf, row_scale_buf, rowloss_buf, tile_buf, slab_buf, xconv_buf, wconv_buf,
      dxs_buf, dwacc_buf, dbacc_buf, bias_buf, w32_buf;
  RowPartial* part = nullptr;  // [T][rb]
  double* row_lse = nullptr;   // [bb] (f64: the label column's p_y − 1 needs more than f32 lse)
  float* row_scale = nullptr;  // [bb]
  double* rowloss = nullptr;   // [rb]
  float* tile = nullptr;       // [T][bb][vb]   forward only
  float* slab = nullptr;       // [bb][V]       gradients
  float* xconv = nullptr;      // [bb][H]       half inputs
  float* wconv = nullptr;      // [T][hb*vb]    half inputs, w by chunks (pk: [T][wconv_floats])
  float* w32 = nullptr;        // [H*V]         cpu_v2: w-sized f32 copy of a half w (use_w_copy)
  float* dxs = nullptr;        // [bb][H]       dx not f32
  float* dw32 = nullptr;       // w-sized f32: dw output itself when f32, else accumulator
  float* dbacc = nullptr;      // [V]
  float* biasf = nullptr;      // [V]
  double total = 0.0;          // Σ loss_t, accumulated by thread 0 in row order

  // bf16 dot-product route (dot): bf16 operands, f32 sums; nothing of w's size is allocated.
  memory::HostBuffer xt_buf, xpk_buf, wpk_buf, ptr_buf, dzc_buf, dzp_buf, dz16_buf, dzt_buf, dxt_buf;
  int64_t wpk_words = 0, nptr = 0;
  uint16_t* xt = nullptr;            // [H][bb]   hv: x_blkᵀ (A of the dw GEMM)
  uint32_t* xpk = nullptr;           // vh: x_blk packed, pairs along tokens (B of the dw GEMM)
  uint32_t* wpk = nullptr;           // [T][wpk_words] a packed chunk of w (or of dz for dw, hv)
  const uint16_t** ptrs = nullptr;   // [T][nptr] row / column pointers for the packers
  uint16_t* dzc = nullptr;           // [T][bb*vb] hv: the dz chunk in bf16
  uint32_t* dzp = nullptr;           // hv: dz packed, pairs along V, columns = tokens (B of dxᵀ)
  uint16_t* dz16 = nullptr;          // [bb][V]   vh: dz in bf16 (A of the dx GEMM)
  uint16_t* dzt = nullptr;           // [T][vb*bb] vh: a dz chunkᵀ in bf16 (A of the dw GEMM)
  float* dxt = nullptr;              // [H][bb]   hv: dxᵀ (pk: both layouts)

  // f32 packed route (pk): the slab is chunk-major (chunk v0's slot at slab + v0·bbp: the logits
  // [nb × n] row-major, then dz, then dz packed for dx); nothing of w's size is allocated.
  memory::HostBuffer pkw_buf, xpk32_buf, xt32_buf, wonce_buf;
  int64_t pk_floats = 0;
  int64_t wconv_floats = 0;  // pk, 16-bit w: hv the dx GEMM's rows of w widened; vh pack_half's scratch
  // Several token blocks and all of a thread's range of w packed within kOnceBudgetBytes (all
  // threads together, as the bf16 pack-once forward): each piece of w is packed on the first
  // token block and kept for the others. Else (w large: 128 MiB at H = 1024, V = 32768) per block.
  bool w_once = false;
  int64_t once_piece = 0, once_thread = 0;  // floats of a packed h × v piece; of one thread's pieces
  float* wonce = nullptr;                   // [T][once_thread]
  float* pkw = nullptr;    // [T][pk_floats] a packed chunk of w (or dz) per thread
  float* xpk32 = nullptr;  // vh: x_blk packed (K = tokens, N = H): B of the dw GEMM
  float* xt32 = nullptr;   // hv: x_blkᵀ [H × bb]: A of the dw GEMM
  const float* wf = nullptr;  // w as f32 when it is (f32 w, or cpu_v2's copy w32); else packed by pack_half

  Call(const Problem& prob, Mode m, bool copy) : p(prob), mode(m), copy_w(copy) {}

  void setup(const BlockSizes& bs);
  void run();
  void worker(int tid, Barrier& bar);

  // helpers
  // Vocab step of phases A and B1. With the slab (gradients) and f32 w, one GEMM per thread
  // covers its whole vocab range: fewer, larger GEMMs (x_blk packed once), and the elementwise
  // passes over the slab are cheap next to the K = H GEMM. Otherwise (forward: bounded tile;
  // bf16/f16: w converted per chunk) the v block.
  // uint32 words of one thread's pack-once chunk: vo columns of w over all of H, in hb pieces.
  size_t once_words() const {
    return static_cast<size_t>((p.H + hb - 1) / hb * cpu_bf16_gemm::packed_words(hb, vo));
  }
  // pk: floats of one thread's pack-once chunk (vo columns of w over all of H, in hb pieces); the
  // bytes of the pk forward-once route: every thread's chunk and, for a 16-bit x, all of x widened.
  int64_t once_chunk_pk() const { return (p.H + hb - 1) / hb * cpu_f32_gemm::packed_floats(hb, vo); }
  size_t once_bytes_pk() const {
    return (static_cast<size_t>(T) * static_cast<size_t>(once_chunk_pk()) + (half ? static_cast<size_t>(p.B * p.H) : 0)) *
           sizeof(float);
  }
  // f32 route with a half w converted chunk by chunk (no f32 copy of w).
  bool w_chunks() const { return half && !dot && !w32; }
  int64_t slab_step(const Range& r) const {
    return grads && !pk && !dot && !w_chunks() ? std::max<int64_t>(1, r.size()) : vb;
  }
  bool use_w_copy() const;
  void convert_w(int tid);
  const float* w_block(int tid, int64_t h0, int64_t hc, int64_t v0, int64_t n, int64_t* ld) const;
  void logits_tile(int tid, const float* xb, int64_t nb, int64_t v0, int64_t n, float* Z,
                   int64_t ldz) const;
  void phase_a(int tid, int64_t b0, int64_t nb, const float* xb);
  void row_stats(RowPartial& s, float* z, int64_t n, int64_t v0, int64_t t) const;
  RowPartial* fresh_rows(int tid, int64_t n, int64_t begin) const;
  void phase_a_once(int tid);
  void phase_a_once_pk(int tid);
  void merge_rows(int tid, int64_t b0, int64_t nb);
  void phase_b1(int tid, int64_t b0, int64_t nb, const float* xb, bool first_block);
  void phase_b2(int tid, int64_t b0, int64_t nb);
  void setup_dot();
  const uint16_t* x16(int64_t b0) const { return static_cast<const uint16_t*>(p.x) + b0 * p.H; }
  uint32_t* wpk_of(int tid) const { return wpk + tid * wpk_words; }
  const uint16_t** ptrs_of(int tid) const { return ptrs + tid * nptr; }
  int64_t dzp_stride(int64_t nb) const {  // words of dzp per pair of vocabulary columns
    return cpu_bf16_gemm::packed_words(2, nb);
  }
  void prepare_x_dot(int tid, int64_t b0, int64_t nb);
  void logits_tile_dot(int tid, int64_t b0, int64_t nb, int64_t v0, int64_t n, float* Z, int64_t ldz) const;
  void dw_dot(int tid, int64_t nb, int64_t v0, int64_t n, bool first_block);
  void phase_b2_dot(int tid, int64_t b0, int64_t nb);
  void setup_pk();
  void pack_w(int tid, bool trans, int64_t K, int64_t N, int64_t offset, int64_t ldb, float* dst) const;
  const float* w_rows_pk(int tid, int64_t h0, int64_t m, int64_t v0, int64_t n, int64_t* lda) const;
  float* pkw_of(int tid) const { return pkw + tid * pk_floats; }
  float* slot(int64_t v0) const { return slab + v0 * bbp; }
  void prepare_x_pk(int tid, const float* xb, int64_t nb);
  void logits_tile_pk(int tid, const float* xb, int64_t b0, int64_t nb, int64_t v0, int64_t n, float* Z,
                      int64_t ldz) const;
  void dw_pk(int tid, int64_t nb, int64_t v0, int64_t n, bool first_block);
  void phase_b2_pk(int tid, int64_t b0, int64_t nb);
  void store_dx(int64_t b0, int64_t nb, const Range& r) const;
  void finish(int tid);
};

template <class T>
T* alloc(memory::HostBuffer& buf, size_t count) {
  buf = memory::host_alloc(std::max<size_t>(1, count) * sizeof(T));
  return memory::as<T>(buf);
}

// The same, asking the kernel for transparent huge pages (where THP is in `madvise` mode): a
// large buffer allocated per call is otherwise first touched 4 KiB page by page (~75 ms of CPU
// for 176 MiB here), and a strided GEMM over it (the dw accumulator: one page per row) misses
// the TLB. Used by the bf16 dot route only (the f32 route is left as it was measured).
template <class T>
T* alloc_huge(memory::HostBuffer& buf, size_t count) {
  T* p = alloc<T>(buf, count);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + count * sizeof(T);
  const uintptr_t a = (begin + kHuge - 1) & ~(kHuge - 1), b = end & ~(kHuge - 1);
  if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);  // advice: failure is harmless
#endif
  return p;
}

void Call::setup(const BlockSizes& bs) {
  bb = std::min(bs.b, p.B);
  // Threads used: num_threads, but no more than one per kMinWorkPerThread multiply-adds of a
  // token block's logits GEMM (a tiny block would cost more in barrier crossings than it
  // saves). A function of the shape and num_threads only, so results stay deterministic.
  const int64_t work = bb * p.H * p.V;
  const int64_t useful = std::max<int64_t>(1, work / kMinWorkPerThread);
  T = static_cast<int>(std::min<int64_t>(std::clamp(p.num_threads, 1, kMaxThreads), useful));
  vb = std::min(bs.v, p.V);
  hb = std::min(bs.h, p.H);
  half = p.dtype != DType::kF32;
  dot = p.dtype == DType::kBF16 && cpu_bf16_gemm::available();
  if (dot) vb += vb & 1;  // even: every vocab chunk starts on a pair (dzp's layout)
  pk = !dot && cpu_f32_gemm::available();
  if (pk) {
    vb = std::min(vb, kPkMaxCols);
    bbp = (bb + cpu_f32_gemm::kPanel - 1) / cpu_f32_gemm::kPanel * cpu_f32_gemm::kPanel;
  }
  grads = mode != Mode::kForward;
  vo = std::min(vb, split(p.V, 0, T, 16).size());  // the first thread's range is the largest
  const size_t once_bytes = dot ? static_cast<size_t>(T) * once_words() * sizeof(uint32_t) : pk ? once_bytes_pk() : 0;
  fwd_once = (dot || (pk && p.B > bb)) && !grads && once_bytes <= kOnceBudgetBytes && !p.budget_spent &&
             (p.memory_budget == 0 || once_bytes <= p.memory_budget);
  rb = fwd_once ? p.B : bb;
  need_stats = !(mode == Mode::kBackward && gin->lse != nullptr);
  const auto ubb = static_cast<size_t>(bb), uV = static_cast<size_t>(p.V),
             uH = static_cast<size_t>(p.H);

  if (p.reduction == Reduction::kMean) {
    denom = 0.0;
    for (int64_t t = 0; t < p.B; ++t)
      if (!p.ignored(t)) denom += p.weight(t);
  }
  part = alloc<RowPartial>(part_buf, static_cast<size_t>(T) * static_cast<size_t>(rb));
  row_lse = alloc<double>(row_buf, ubb);
  row_scale = alloc<float>(row_scale_buf, ubb);
  rowloss = alloc<double>(rowloss_buf, static_cast<size_t>(rb));
  if (grads && pk)
    slab = alloc_huge<float>(slab_buf, static_cast<size_t>(bbp) * uV);
  else if (grads)
    slab = dot ? alloc_huge<float>(slab_buf, ubb * uV) : alloc<float>(slab_buf, ubb * uV);
  else
    tile = alloc<float>(tile_buf, static_cast<size_t>(T) * ubb * static_cast<size_t>(vb));
  if (dot) {
    setup_dot();
  } else {
    if (half) {
      xconv = alloc<float>(xconv_buf, (fwd_once ? static_cast<size_t>(p.B) : ubb) * uH);  // pk forward-once: all of x
      if (use_w_copy()) w32 = alloc<float>(w32_buf, uH * uV);
    }
    wf = w32 ? w32 : half ? nullptr : static_cast<const float*>(p.w);
    if (pk)
      setup_pk();
    else if (half && !w32)
      wconv = alloc<float>(wconv_buf, static_cast<size_t>(T) * static_cast<size_t>(hb * vb));
  }
  if (p.bias) {
    biasf = alloc<float>(bias_buf, uV);
    for (int64_t j = 0; j < p.V; ++j) biasf[j] = load_as_f32(p.bias, p.bias_dtype, j);
  }
  if (grads) {  // a gradient left out (null in gout) has no buffer and no work: dw32 null, no phase B2
    if (gout->dx && gout->dx_dtype != DType::kF32 && !(dot && p.layout == WLayout::kHV))
      dxs = alloc<float>(dxs_buf, ubb * uH);
    if (gout->dw && gout->dw_dtype == DType::kF32)
      dw32 = static_cast<float*>(gout->dw);
    else if (gout->dw)
      dw32 = dot ? alloc_huge<float>(dwacc_buf, uH * uV)  // gradient-sized (bf16/f16 dw only)
                 : alloc<float>(dwacc_buf, uH * uV);
    if (gout->dbias) dbacc = alloc<float>(dbacc_buf, uV);
  }
}

// Scratch of the dot route: a packed w chunk per thread (logits: hb × vb, pairs along H; vh dx:
// vb × hb, pairs along V; hv dw: the dz chunk, bb × vb), and for gradients the bf16 operands of
// the dw / dx GEMMs: O(bb·V + (bb + T·vb)·max(bb, hb) + H·bb), never O(H·V).
void Call::setup_dot() {
  namespace g = cpu_bf16_gemm;
  const bool hv = p.layout == WLayout::kHV;
  const auto ubb = static_cast<size_t>(bb), uT = static_cast<size_t>(T), uvb = static_cast<size_t>(vb);
  wpk_words = std::max({g::packed_words(hb, vb), g::packed_words(vb, hb), grads ? g::packed_words(bb, vb) : 0});
  if (fwd_once) wpk_words = once_words();
  nptr = std::max({hb, vb, bb});
  wpk = alloc<uint32_t>(wpk_buf, uT * static_cast<size_t>(wpk_words));
  ptrs = alloc<const uint16_t*>(ptr_buf, uT * static_cast<size_t>(nptr));
  if (!grads) return;
  const auto uH = static_cast<size_t>(p.H), uV = static_cast<size_t>(p.V);
  if (hv) {
    xt = alloc<uint16_t>(xt_buf, uH * ubb);
    dzc = alloc<uint16_t>(dzc_buf, uT * ubb * uvb);
    dzp = alloc_huge<uint32_t>(dzp_buf, static_cast<size_t>((p.V + 1) / 2 * dzp_stride(bb)));
    dxt = alloc<float>(dxt_buf, uH * ubb);
  } else {
    xpk = alloc<uint32_t>(xpk_buf, static_cast<size_t>(g::packed_words(bb, p.H)));
    dz16 = alloc_huge<uint16_t>(dz16_buf, ubb * uV);
    dzt = alloc<uint16_t>(dzt_buf, uT * uvb * ubb);
  }
}

// The (h0..h0+hc) × (v0..v0+n) block of w as f32, in w's own layout: kHV rows h, cols v;
// kVH rows v, cols h. f32: a pointer into w. bf16/f16: converted into this thread's buffer.
const float* Call::w_block(int tid, int64_t h0, int64_t hc, int64_t v0, int64_t n, int64_t* ld) const {
  const bool hv = p.layout == WLayout::kHV;
  if (!w_chunks()) {
    const auto* w = w32 ? w32 : static_cast<const float*>(p.w);
    *ld = hv ? p.V : p.H;
    return hv ? w + h0 * p.V + v0 : w + v0 * p.H + h0;
  }
  TESSERA_TRACE_SCOPE("lce.pack_w");
  const auto* w = static_cast<const uint16_t*>(p.w);
  const bool bf16 = p.dtype == DType::kBF16;
  float* dst = wconv + static_cast<int64_t>(tid) * hb * vb;
  if (hv) {
    for (int64_t h = 0; h < hc; ++h) simd::half_to_f32(w + (h0 + h) * p.V + v0, bf16, dst + h * n, n);
    *ld = n;
  } else {
    for (int64_t v = 0; v < n; ++v) simd::half_to_f32(w + (v0 + v) * p.H + h0, bf16, dst + v * hc, hc);
    *ld = hc;
  }
  return dst;
}

// Z[nb × n] (row stride ldz) = x_blk · w[:, v0 : v0+n]  (no bias).
void Call::logits_tile(int tid, const float* xb, int64_t nb, int64_t v0, int64_t n, float* Z,
                       int64_t ldz) const {
  TESSERA_TRACE_SCOPE("lce.gemm.logits");
  const bool hv = p.layout == WLayout::kHV;
  const int64_t hstep = w_chunks() ? hb : p.H;  // f32 w: one GEMM with K = H
  for (int64_t h0 = 0; h0 < p.H; h0 += hstep) {
    const int64_t hc = std::min(hstep, p.H - h0);
    int64_t ld = 0;
    const float* W = w_block(tid, h0, hc, v0, n, &ld);
    gemm(false, !hv, nb, n, hc, xb + h0, p.H, W, ld, h0 == 0 ? 0.0f : 1.0f, Z, ldz);
  }
}

// ---- the bf16 dot-product route ----------------------------------------------------------------
// Every GEMM is cpu_bf16_gemm::gemm: C (f32) = A (bf16 rows, pairs along K) · B (packed bf16).
//   logits  Z = x_blk · w[:, chunk]      A = x itself; B = w chunk packed (pairs along H)
//   dw      hv: dw[:, chunk] += x_blkᵀ · dz   A = x_blkᵀ (xt); B = dz chunk packed (pairs along tokens)
//           vh: dw[chunk, :] += dzᵀ · x_blk   A = dz chunkᵀ (dzt); B = x_blk packed (xpk)
//   dx      hv: dxᵀ[range] = w[range, :] · dzᵀ   A = w itself (rows along V); B = dz packed (dzp)
//           vh: dx[:, range] = dz · w[:, range]   A = dz in bf16 (dz16); B = w chunk packed (pairs along V)
// so w is packed once per token block (logits; vh: once more for dx), chunk by chunk into an
// L2-sized per-thread buffer, and never copied whole. dz is rounded to bf16 for the two
// gradient GEMMs (as PyTorch's and the cuda backend's bf16 GEMMs do); sums stay f32.

// xt (hv) or xpk (vh) of this token block: thread tid does its share of H.
void Call::prepare_x_dot(int tid, int64_t b0, int64_t nb) {
  TESSERA_TRACE_SCOPE("lce.pack_x");
  const uint16_t* x = x16(b0);
  if (p.layout == WLayout::kHV) {
    const Range r = split(p.H, tid, T, 16);
    for (int64_t h = r.begin; h < r.end; ++h)
      for (int64_t t = 0; t < nb; ++t) xt[h * bb + t] = x[t * p.H + h];
  } else {
    const Range r = split(p.H, tid, T, cpu_bf16_gemm::kPanel);
    if (r.size() == 0) return;
    const uint16_t** rows = ptrs_of(tid);
    for (int64_t t = 0; t < nb; ++t) rows[t] = x + t * p.H + r.begin;
    const int64_t panel_words = cpu_bf16_gemm::packed_words(nb, cpu_bf16_gemm::kPanel);
    cpu_bf16_gemm::pack_rows(rows, nb, r.size(), xpk + r.begin / cpu_bf16_gemm::kPanel * panel_words);
  }
}

// Z[nb × n] = x_blk · w[:, v0 : v0+n], K = H in blocks of hb (each packed once).
void Call::logits_tile_dot(int tid, int64_t b0, int64_t nb, int64_t v0, int64_t n, float* Z,
                           int64_t ldz) const {
  TESSERA_TRACE_SCOPE("lce.gemm.logits");
  const auto* w = static_cast<const uint16_t*>(p.w);
  const uint16_t** ptr = ptrs_of(tid);
  uint32_t* pk = wpk_of(tid);
  for (int64_t h0 = 0; h0 < p.H; h0 += hb) {
    const int64_t hc = std::min(hb, p.H - h0);
    {
      TESSERA_TRACE_SCOPE("lce.pack_w");
      if (p.layout == WLayout::kHV) {
        for (int64_t h = 0; h < hc; ++h) ptr[h] = w + (h0 + h) * p.V + v0;
        cpu_bf16_gemm::pack_rows(ptr, hc, n, pk);
      } else {
        for (int64_t j = 0; j < n; ++j) ptr[j] = w + (v0 + j) * p.H + h0;
        cpu_bf16_gemm::pack_cols(ptr, hc, n, pk);
      }
    }
    cpu_bf16_gemm::gemm(nb, n, hc, x16(b0) + h0, p.H, pk, 1.0f, h0 > 0, Z, ldz);
  }
}

// After the dz chunk [nb × n] at slab + v0 is final (f32): its bf16 copies for dx, and the dw GEMM.
void Call::dw_dot(int tid, int64_t nb, int64_t v0, int64_t n, bool first_block) {
  namespace g = cpu_bf16_gemm;
  const uint16_t** ptr = ptrs_of(tid);
  uint32_t* pk = wpk_of(tid);
  if (p.layout == WLayout::kHV) {
    uint16_t* d = dzc + static_cast<int64_t>(tid) * bb * vb;  // [nb × n]
    for (int64_t i = 0; i < nb; ++i) {
      cpu_convert::f32_to_bf16(slab + i * p.V + v0, d + i * n, n);
      ptr[i] = d + i * n;
    }
    if (gout->dx) g::pack_cols(ptr, n, nb, dzp + v0 / 2 * dzp_stride(nb));  // B of dxᵀ, for phase B2
    if (!dw32) return;
    g::pack_rows(ptr, nb, n, pk);
    TESSERA_TRACE_SCOPE("lce.gemm.dw");
    g::gemm(p.H, n, nb, xt, bb, pk, 1.0f, !first_block, dw32 + v0, p.V);
  } else {
    uint16_t* dt = dzt + static_cast<int64_t>(tid) * vb * bb;  // [n × nb]
    for (int64_t i = 0; i < nb; ++i) {
      uint16_t* row = dz16 + i * p.V + v0;
      cpu_convert::f32_to_bf16(slab + i * p.V + v0, row, n);  // A of phase B2's dx GEMM
      if (dw32)
        for (int64_t j = 0; j < n; ++j) dt[j * bb + i] = row[j];
    }
    if (!dw32) return;
    TESSERA_TRACE_SCOPE("lce.gemm.dw");
    g::gemm(n, p.H, nb, dt, bb, xpk, 1.0f, !first_block, dw32 + v0 * p.H, p.H);
  }
}

// dx of this token block for the thread's hidden range, over the vocabulary chunks of phase B1.
void Call::phase_b2_dot(int tid, int64_t b0, int64_t nb) {
  TESSERA_TRACE_SCOPE_I("lce.phase_b2", b0);
  namespace g = cpu_bf16_gemm;
  const Range r = split(p.H, tid, T, 16);
  if (r.size() == 0) return;
  const auto* w = static_cast<const uint16_t*>(p.w);
  if (p.layout == WLayout::kHV) {
    bool first = true;
    for (int k = 0; k < T; ++k) {  // phase B1's chunks: thread k's range in steps of vb
      const Range rv = split(p.V, k, T, 16);
      for (int64_t v0 = rv.begin; v0 < rv.end; v0 += vb, first = false) {
        const int64_t n = std::min(vb, rv.end - v0);
        TESSERA_TRACE_SCOPE("lce.gemm.dx");
        g::gemm(r.size(), nb, n, w + r.begin * p.V + v0, p.V, dzp + v0 / 2 * dzp_stride(nb), 1.0f, !first,
                dxt + r.begin * bb, bb);
      }
    }
    const bool f32 = gout->dx_dtype == DType::kF32;
    for (int64_t t = 0; t < nb; ++t) {
      const int64_t o = (b0 + t) * p.H;
      for (int64_t h = r.begin; h < r.end; ++h) {
        if (f32)
          static_cast<float*>(gout->dx)[o + h] = dxt[h * bb + t];
        else
          store_from_f32(gout->dx, gout->dx_dtype, o + h, dxt[h * bb + t]);
      }
    }
    return;
  }
  float* dxf = dxs ? dxs : static_cast<float*>(gout->dx) + b0 * p.H;
  const uint16_t** ptr = ptrs_of(tid);
  uint32_t* pk = wpk_of(tid);
  for (int64_t v0 = 0; v0 < p.V; v0 += vb) {
    const int64_t n = std::min(vb, p.V - v0);
    for (int64_t h0 = r.begin; h0 < r.end; h0 += hb) {
      const int64_t hc = std::min(hb, r.end - h0);
      {
        TESSERA_TRACE_SCOPE("lce.pack_w");
        for (int64_t v = 0; v < n; ++v) ptr[v] = w + (v0 + v) * p.H + h0;
        g::pack_rows(ptr, n, hc, pk);
      }
      TESSERA_TRACE_SCOPE("lce.gemm.dx");
      g::gemm(nb, hc, n, dz16 + v0, p.V, pk, 1.0f, v0 > 0, dxf + h0, p.H);
    }
  }
  store_dx(b0, nb, r);
}

// ---- the f32 packed route (pk) -----------------------------------------------------------------
// Every GEMM is cpu_f32_gemm::gemm: C = op(A) (f32, read in place) · B (packed into 64-column panels).
//   logits  Z = x_blk · w[:, chunk]          A = x itself; B = w chunk, hb rows at a time (hv: rows
//                                            copied; vh: transposed by the packer)
//   dw      hv: dw[:, chunk] += x_blkᵀ · dz   A = x_blkᵀ (xt32); B = dz chunk packed
//           vh: dw[chunk, :] += dzᵀ · x_blk   A = dz chunkᵀ (per thread); B = x_blk packed (xpk32)
//   dx      hv: dxᵀ[range] = w[range, :] · dzᵀ   A = w itself; B = dz packed with tokens as
//                                               columns, in the chunk's own slab slot
//           vh: dx[:, range] = dz · w[:, range]  A = dz in its slot; B = w chunk packed (rows copied)
// so w is packed once per token block (hv for the logits; vh for the logits and again for dx),
// chunk by chunk into a per-thread buffer, and never copied whole; every A is read along rows
// (an A read transposed strides a whole row per k and thrashes the caches); dz is not rounded
// (f32 throughout, like the OpenBLAS route).
// The chunks are at most kPkMaxCols wide; the dx GEMM's sum over chunks runs in phase B1's order.

// Scratch of the pk route: a per-thread packed chunk (w: hb × vb either way round, dz: bb × vb
// either way round), and for gradients hv x_blkᵀ and dxᵀ [H × bb], vh x_blk packed [bb × H]; the
// slab itself is V × bbp.
void Call::setup_pk() {
  namespace g = cpu_f32_gemm;
  pk_floats = std::max({g::packed_floats(hb, vb), grads ? g::packed_floats(vb, hb) : 0,
                        grads ? g::packed_floats(bb, vb) : 0, grads ? g::packed_floats(vb, bb) : 0,
                        fwd_once ? once_chunk_pk() : 0});
  pkw = alloc<float>(pkw_buf, static_cast<size_t>(T) * static_cast<size_t>(pk_floats));
  const int64_t range = split(p.V, 0, T, 16).size();  // the first thread's range is the largest
  once_piece = g::packed_floats(hb, vb);
  once_thread = (range + vb - 1) / vb * ((p.H + hb - 1) / hb) * once_piece;
  const size_t once_floats = static_cast<size_t>(T) * static_cast<size_t>(once_thread);
  // Optional scratch: not in a vocabulary slice, and under a memory budget only in a forward
  // (whose other scratch is a tile; a gradient call's slab and accumulator take the budget).
  const size_t once_bytes = once_floats * sizeof(float);
  w_once = !fwd_once && p.B > bb && once_bytes <= kOnceBudgetBytes && !p.budget_spent &&
           (p.memory_budget == 0 || (!grads && once_bytes <= p.memory_budget));
  if (w_once) wonce = alloc<float>(wonce_buf, once_floats);
  if (!wf) {  // a 16-bit w: hv widens the dx GEMM's rows of w, vh packs transposed through a scratch
    wconv_floats = p.layout == WLayout::kHV ? (grads && gout->dx ? kPkDxRows * vb : 0) : g::pack_half_scratch(true, hb);
    if (wconv_floats > 0) wconv = alloc<float>(wconv_buf, static_cast<size_t>(T) * static_cast<size_t>(wconv_floats));
  }
  if (!grads) return;
  const auto uHbb = static_cast<size_t>(p.H) * static_cast<size_t>(bb);
  if (p.layout == WLayout::kVH) {
    xpk32 = alloc<float>(xpk32_buf, static_cast<size_t>(g::packed_floats(bb, p.H)));
  } else {
    xt32 = alloc<float>(xt32_buf, uHbb);
    dxt = alloc<float>(dxt_buf, uHbb);
  }
}

// B = w's K × N block at element `offset` (row stride ldb; trans: given as its transpose) packed
// into dst: f32 as it is, a 16-bit w widened on the way (the same floats).
void Call::pack_w(int tid, bool trans, int64_t K, int64_t N, int64_t offset, int64_t ldb, float* dst) const {
  TESSERA_TRACE_SCOPE("lce.pack_w");
  if (wf)
    cpu_f32_gemm::pack(trans, K, N, wf + offset, ldb, dst);
  else
    cpu_f32_gemm::pack_half(trans, K, N, static_cast<const uint16_t*>(p.w) + offset, ldb, p.dtype == DType::kBF16,
                            dst, wconv + static_cast<int64_t>(tid) * wconv_floats);  // trans: K ≤ hb
}

// hv: rows h0 .. h0+m of w's columns v0 .. v0+n as f32 (A of the dx GEMM, read in place when w
// is f32; a 16-bit w widened into this thread's buffer, m ≤ kPkDxRows, n ≤ vb).
const float* Call::w_rows_pk(int tid, int64_t h0, int64_t m, int64_t v0, int64_t n, int64_t* lda) const {
  if (wf) {
    *lda = p.V;
    return wf + h0 * p.V + v0;
  }
  TESSERA_TRACE_SCOPE("lce.pack_w");
  float* dst = wconv + static_cast<int64_t>(tid) * wconv_floats;
  const auto* w = static_cast<const uint16_t*>(p.w);
  for (int64_t h = 0; h < m; ++h) simd::half_to_f32(w + (h0 + h) * p.V + v0, p.dtype == DType::kBF16, dst + h * n, n);
  *lda = n;
  return dst;
}

// The dw GEMM's x operand, thread tid's share of H: hv x_blkᵀ (its rows run along the tokens, so
// the GEMM reads six sequential rows; x_blk read transposed in place strides H per token and
// thrashes the caches), vh x_blk packed (K = tokens, N = H).
void Call::prepare_x_pk(int tid, const float* xb, int64_t nb) {
  TESSERA_TRACE_SCOPE("lce.pack_x");
  namespace g = cpu_f32_gemm;
  const Range r = split(p.H, tid, T, g::kPanel);
  if (r.size() == 0) return;
  if (p.layout == WLayout::kHV)
    g::transpose(nb, r.size(), xb + r.begin, p.H, xt32 + r.begin * bb, bb);
  else
    g::pack(false, nb, r.size(), xb + r.begin, p.H, xpk32 + r.begin * nb);
}

// Z[nb × n] (row stride ldz) = x_blk · w[:, v0 : v0+n], K = H in pieces of hb, each packed for
// this token block or (w_once) on the first and kept.
void Call::logits_tile_pk(int tid, const float* xb, int64_t b0, int64_t nb, int64_t v0, int64_t n, float* Z,
                          int64_t ldz) const {
  namespace g = cpu_f32_gemm;
  const int64_t chunk = (v0 - split(p.V, tid, T, 16).begin) / vb;  // of this thread's range
  for (int64_t h0 = 0; h0 < p.H; h0 += hb) {
    const int64_t hc = std::min(hb, p.H - h0);
    float* pkc = w_once ? wonce + tid * once_thread + (chunk * ((p.H + hb - 1) / hb) + h0 / hb) * once_piece
                        : pkw_of(tid);
    if (!w_once || b0 == 0) {
      if (p.layout == WLayout::kHV)
        pack_w(tid, false, hc, n, h0 * p.V + v0, p.V, pkc);
      else
        pack_w(tid, true, hc, n, v0 * p.H + h0, p.H, pkc);
    }
    TESSERA_TRACE_SCOPE("lce.gemm.logits");
    g::gemm(g::Tri::kNone, false, nb, n, hc, 1.0f, xb + h0, p.H, pkc, h0 > 0 ? 1.0f : 0.0f, Z, ldz);
  }
}

// After the dz chunk [nb × n] in slot(v0) is final: the dw GEMM, then (hv) the chunk packed in
// place (through this thread's buffer) with the tokens as columns, B of phase B2's dx GEMM.
void Call::dw_pk(int tid, int64_t nb, int64_t v0, int64_t n, bool first_block) {
  namespace g = cpu_f32_gemm;
  float* D = slot(v0);
  float* pkc = pkw_of(tid);
  const float beta = first_block ? 0.0f : 1.0f;
  if (p.layout == WLayout::kHV) {  // dw[:, v0:v0+n] (H × n) += x_blkᵀ · D
    if (dw32) {
      g::pack(false, nb, n, D, n, pkc);
      TESSERA_TRACE_SCOPE("lce.gemm.dw");
      g::gemm(g::Tri::kNone, false, p.H, n, nb, 1.0f, xt32, bb, pkc, beta, dw32 + v0, p.V);
    }
    if (!gout->dx) return;
  } else {  // dw[v0:v0+n, :] (n × H) += Dᵀ · x_blk
    if (!dw32) return;
    g::transpose(nb, n, D, n, pkc, nb);
    TESSERA_TRACE_SCOPE("lce.gemm.dw");
    g::gemm(g::Tri::kNone, false, n, p.H, nb, 1.0f, pkc, nb, xpk32, beta, dw32 + v0 * p.H, p.H);
    return;  // phase B2 reads D as it is
  }
  TESSERA_TRACE_SCOPE("lce.pack_dz");
  g::pack(true, n, nb, D, n, pkc);  // packed_floats(n, nb) ≤ n · bbp: the slot holds it
  std::memcpy(D, pkc, static_cast<size_t>(g::packed_floats(n, nb)) * sizeof(float));
}

// dx of this token block for the thread's hidden range, a sum over phase B1's chunks in its
// order: hv dxᵀ[range] = Σ w[range, chunk] · dz[:, chunk]ᵀ, then transposed into dx; vh
// dx[:, range] = Σ dz[:, chunk] · w[chunk, range].
void Call::phase_b2_pk(int tid, int64_t b0, int64_t nb) {
  TESSERA_TRACE_SCOPE_I("lce.phase_b2", b0);
  namespace g = cpu_f32_gemm;
  const Range r = split(p.H, tid, T, 16);
  if (r.size() == 0) return;
  const bool hv = p.layout == WLayout::kHV;
  float* dxf = dxs ? dxs : static_cast<float*>(gout->dx) + b0 * p.H;
  if (!hv) {
    float* pkc = pkw_of(tid);
    bool first = true;
    for (int k = 0; k < T; ++k) {
      const Range rv = split(p.V, k, T, 16);
      for (int64_t v0 = rv.begin; v0 < rv.end; v0 += vb, first = false) {
        const int64_t n = std::min(vb, rv.end - v0);
        for (int64_t h0 = r.begin; h0 < r.end; h0 += hb) {
          const int64_t hc = std::min(hb, r.end - h0);
          pack_w(tid, false, n, hc, v0 * p.H + h0, p.H, pkc);
          TESSERA_TRACE_SCOPE("lce.gemm.dx");
          g::gemm(g::Tri::kNone, false, nb, hc, n, 1.0f, slot(v0), n, pkc, first ? 0.0f : 1.0f, dxf + h0, p.H);
        }
      }
    }
    store_dx(b0, nb, r);
    return;
  }
  bool first = true;
  for (int k = 0; k < T; ++k) {
    const Range rv = split(p.V, k, T, 16);
    for (int64_t v0 = rv.begin; v0 < rv.end; v0 += vb, first = false) {
      const int64_t n = std::min(vb, rv.end - v0);
      for (int64_t h0 = r.begin; h0 < r.end; h0 += kPkDxRows) {  // rows of w that stay in the L2 for every panel
        const int64_t m = std::min(kPkDxRows, r.end - h0);
        int64_t lda = 0;
        const float* A = w_rows_pk(tid, h0, m, v0, n, &lda);
        TESSERA_TRACE_SCOPE("lce.gemm.dx");
        g::gemm(g::Tri::kNone, false, m, nb, n, 1.0f, A, lda, slot(v0), first ? 0.0f : 1.0f, dxt + h0 * bb, bb);
      }
    }
  }
  g::transpose(r.size(), nb, dxt + r.begin * bb, bb, dxf + r.begin, p.H);
  store_dx(b0, nb, r);
}

// dx not f32: the thread's columns of dxs stored in dx's dtype.
void Call::store_dx(int64_t b0, int64_t nb, const Range& r) const {
  if (!dxs) return;
  for (int64_t i = 0; i < nb; ++i)
    store_rounded(gout->dx, gout->dx_dtype, (b0 + i) * p.H + r.begin, dxs + i * p.H + r.begin, r.size());
}

// Row t's logits z[0..n) of vocab columns v0.. (bias and soft cap applied here, in place) into
// its online statistics s (cpu_rows.h, shared with the versions).
void Call::row_stats(RowPartial& s, float* z, int64_t n, int64_t v0, int64_t t) const {
  cpu_rows::row_stats(p, biasf, need_stats, s, z, n, v0, t);
}

// Forward on the dot route: vocab chunks outer, every token inside, so each chunk of w (all of
// H, in h pieces) is packed once per call, not once per token block; the per-row state of all
// B rows is kept (T·B·32 bytes + B·8), and only while the packed chunks of all threads fit
// kOnceBudgetBytes (else phase_a per token block). Per row the chunks come in the same order as in phase_a.
void Call::phase_a_once(int tid) {
  TESSERA_TRACE_SCOPE("lce.phase_a");
  namespace g = cpu_bf16_gemm;
  const Range r = split(p.V, tid, T, 16);
  RowPartial* P = fresh_rows(tid, p.B, r.begin);
  const auto* w = static_cast<const uint16_t*>(p.w);
  const uint16_t** ptr = ptrs_of(tid);
  uint32_t* pk = wpk_of(tid);
  const int64_t piece = g::packed_words(hb, vo);
  float* Z = tile + static_cast<int64_t>(tid) * bb * vb;
  for (int64_t v0 = r.begin; v0 < r.end; v0 += vb) {  // n ≤ vo: a range is at most vo wide
    const int64_t n = std::min(vb, r.end - v0);
    {
      TESSERA_TRACE_SCOPE("lce.pack_w");
      for (int64_t h0 = 0; h0 < p.H; h0 += hb) {
        const int64_t hc = std::min(hb, p.H - h0);
        if (p.layout == WLayout::kHV) {
          for (int64_t h = 0; h < hc; ++h) ptr[h] = w + (h0 + h) * p.V + v0;
          g::pack_rows(ptr, hc, n, pk + h0 / hb * piece);
        } else {
          for (int64_t j = 0; j < n; ++j) ptr[j] = w + (v0 + j) * p.H + h0;
          g::pack_cols(ptr, hc, n, pk + h0 / hb * piece);
        }
      }
    }
    for (int64_t b0 = 0; b0 < p.B; b0 += bb) {
      const int64_t nb = std::min(bb, p.B - b0);
      {
        TESSERA_TRACE_SCOPE("lce.gemm.logits");
        for (int64_t h0 = 0; h0 < p.H; h0 += hb)
          g::gemm(nb, n, std::min(hb, p.H - h0), x16(b0) + h0, p.H, pk + h0 / hb * piece, 1.0f, h0 > 0, Z, vb);
      }
      TESSERA_TRACE_SCOPE("lce.softmax");
      for (int64_t i = 0; i < nb; ++i) row_stats(P[b0 + i], Z + i * vb, n, v0, b0 + i);
    }
  }
}

// Forward on the pk route, as phase_a_once on the dot route: vocab chunks outer, every token
// block inside, so each chunk of w (all of H, in h pieces) is packed once per call (w past the
// pk route's pack-once budget was packed once per token block: 8 times at B=2048, b=256). The
// per-row state of all B rows is kept. Per row the chunks, and per logit the h pieces, come in
// phase_a's order: the same bits as the forward by token blocks.
void Call::phase_a_once_pk(int tid) {
  TESSERA_TRACE_SCOPE("lce.phase_a");
  namespace g = cpu_f32_gemm;
  const Range r = split(p.V, tid, T, 16);
  RowPartial* P = fresh_rows(tid, p.B, r.begin);
  const float* x = half ? xconv : static_cast<const float*>(p.x);
  const int64_t piece = g::packed_floats(hb, vo);
  float* chunk = pkw_of(tid);
  float* Z = tile + static_cast<int64_t>(tid) * bb * vb;
  for (int64_t v0 = r.begin; v0 < r.end; v0 += vb) {  // n ≤ vo: a range is at most vo wide
    const int64_t n = std::min(vb, r.end - v0);
    for (int64_t h0 = 0; h0 < p.H; h0 += hb) {
      const int64_t hc = std::min(hb, p.H - h0);
      if (p.layout == WLayout::kHV)
        pack_w(tid, false, hc, n, h0 * p.V + v0, p.V, chunk + h0 / hb * piece);
      else
        pack_w(tid, true, hc, n, v0 * p.H + h0, p.H, chunk + h0 / hb * piece);
    }
    for (int64_t b0 = 0; b0 < p.B; b0 += bb) {
      const int64_t nb = std::min(bb, p.B - b0);
      {
        TESSERA_TRACE_SCOPE("lce.gemm.logits");
        for (int64_t h0 = 0; h0 < p.H; h0 += hb)
          g::gemm(g::Tri::kNone, false, nb, n, std::min(hb, p.H - h0), 1.0f, x + b0 * p.H + h0, p.H,
                  chunk + h0 / hb * piece, h0 > 0 ? 1.0f : 0.0f, Z, vb);
      }
      TESSERA_TRACE_SCOPE("lce.softmax");
      for (int64_t i = 0; i < nb; ++i) row_stats(P[b0 + i], Z + i * vb, n, v0, b0 + i);
    }
  }
}

// Thread tid's per-row state of rows [0, n), reset: nothing seen yet of its vocabulary range,
// which starts at column `begin`.
RowPartial* Call::fresh_rows(int tid, int64_t n, int64_t begin) const {
  RowPartial* P = part + static_cast<int64_t>(tid) * rb;
  for (int64_t t = 0; t < n; ++t) P[t] = RowPartial{-std::numeric_limits<float>::infinity(), 0.0f, 0.0, 0.0, begin};
  return P;
}

void Call::phase_a(int tid, int64_t b0, int64_t nb, const float* xb) {
  TESSERA_TRACE_SCOPE_I("lce.phase_a", b0);
  const Range r = split(p.V, tid, T, 16);
  RowPartial* P = fresh_rows(tid, nb, r.begin);
  const int64_t step = slab_step(r);
  for (int64_t v0 = r.begin; v0 < r.end; v0 += step) {
    const int64_t n = std::min(step, r.end - v0);
    float* Z;
    int64_t ldz;
    if (grads && pk) {
      Z = slot(v0);
      ldz = n;
    } else if (grads) {
      Z = slab + v0;
      ldz = p.V;
    } else {
      Z = tile + static_cast<int64_t>(tid) * bb * vb;
      ldz = vb;
    }
    if (pk)
      logits_tile_pk(tid, xb, b0, nb, v0, n, Z, ldz);
    else if (dot)
      logits_tile_dot(tid, b0, nb, v0, n, Z, ldz);
    else
      logits_tile(tid, xb, nb, v0, n, Z, ldz);
    TESSERA_TRACE_SCOPE("lce.softmax");  // the rows of this tile, to the end of the iteration
    for (int64_t i = 0; i < nb; ++i) row_stats(P[i], Z + i * ldz, n, v0, b0 + i);
  }
}

void Call::merge_rows(int tid, int64_t b0, int64_t nb) {
  TESSERA_TRACE_SCOPE_I("lce.merge", b0);
  const Range rows = split(nb, tid, T, 1);
  const bool write_fwd = mode != Mode::kBackward;
  for (int64_t i = rows.begin; i < rows.end; ++i) {
    const int64_t t = b0 + i;
    const int64_t y = p.label(t);
    const bool ign = y == p.ignore_index;
    double lse;
    if (need_stats) {
      double m = -INFINITY;
      for (int k = 0; k < T; ++k) m = std::max(m, static_cast<double>(part[k * rb + i].m));
      double s = 0.0, sumz = 0.0, zy = 0.0;
      int64_t amax = 0;
      bool found = false, poisoned = false;
      for (int k = 0; k < T; ++k) {
        const RowPartial& q = part[k * rb + i];
        const Range r = split(p.V, k, T, 16);
        if (r.size() == 0) continue;
        poisoned |= q.poisoned;
        s += q.s * std::exp(static_cast<double>(q.m) - m);
        sumz += q.sumz;
        if (!found && static_cast<double>(q.m) == m) {
          amax = q.amax;
          found = true;
        }
        if (y >= r.begin && y < r.end) zy = q.zy;
      }
      // NaN when a NaN / +inf logit was seen; −inf when every logit is −inf (a fully masked
      // vocabulary slice: the partial form's combine then counts it as 0), as the reference.
      lse = poisoned ? std::numeric_limits<double>::quiet_NaN() : m == -INFINITY ? -INFINITY : m + std::log(s);
      if (write_fwd && p.partial()) {  // the slice's statistics; the caller forms the loss
        fout->lse[t] = static_cast<float>(lse);
        fout->label_logit[t] = ign ? 0.0f : static_cast<float>(zy);
        fout->logit_sum[t] = static_cast<float>(sumz);
        if (fout->argmax) {
          fout->argmax[t] = amax;
          fout->max_logit[t] = static_cast<float>(m);
        }
        rowloss[i] = 0.0;
      } else if (write_fwd) {
        fout->lse[t] = static_cast<float>(lse);
        if (fout->argmax) fout->argmax[t] = amax;
        double loss = 0.0;
        if (!ign) loss = row_loss_value(p, t, lse, zy, sumz);
        rowloss[i] = loss;
        if (p.reduction == Reduction::kNone) fout->loss[t] = static_cast<float>(loss);
      }
    } else {
      lse = gin->lse[t];
    }
    if (grads) {
      double up = 0.0;
      if (!ign) {
        up = p.reduction == Reduction::kNone ? gin->grad_loss[t] : gin->grad_loss[0];
        if (p.reduction == Reduction::kMean) up = denom == 0.0 ? 0.0 : up / denom;
        if (!p.class_weights) up *= static_cast<double>(p.weight(t));  // else in class_weighted_grad
      }
      row_lse[i] = lse;
      row_scale[i] = static_cast<float>(up);
    }
  }
}

void Call::phase_b1(int tid, int64_t b0, int64_t nb, const float* xb, bool first_block) {
  TESSERA_TRACE_SCOPE_I("lce.phase_b1", b0);  // softmax gradient (self time) + dw GEMM
  const Range r = split(p.V, tid, T, 16);
  const bool hv = p.layout == WLayout::kHV;
  const double eps = p.label_smoothing, lam = p.z_loss_weight, cap = p.softcap;
  const float offset = static_cast<float>(eps / p.vocab());
  const int64_t step = slab_step(r);
  for (int64_t v0 = r.begin; v0 < r.end; v0 += step) {
    const int64_t n = std::min(step, r.end - v0);
    float* D = pk ? slot(v0) : slab + v0;
    const int64_t ldd = pk ? n : p.V;
    for (int64_t i = 0; i < nb; ++i) {
      float* z = D + i * ldd;
      const float scale = row_scale[i];
      // An ignored row, a zero weight or upstream gradient: zero, unless the row's lse is NaN
      // (the reference's 0·NaN); ignored rows never count.
      const bool nan_row = std::isnan(row_lse[i]) && p.label(b0 + i) != p.ignore_index;
      if (scale == 0.0f && !nan_row) {
        std::memset(z, 0, static_cast<size_t>(n) * sizeof(float));
      } else if (p.class_weights) {
        cpu_rows::class_weighted_grad(p, b0 + i, row_lse[i], scale, v0, n, z);
      } else {
        const double lse = row_lse[i];
        const double coef = 1.0 + 2.0 * lam * lse;
        const int64_t y = p.label(b0 + i);
        const bool has_y = y >= v0 && y < v0 + n;
        const double zy = has_y ? z[y - v0] : 0.0;
        simd::softmax_grad(z, n, static_cast<float>(lse), static_cast<float>(coef), offset, nullptr, scale,
                           static_cast<float>(cap));
        if (has_y) {
          // Label column, in f64 and cancellation-free: coef·p_y − ε/V − (1−ε)
          //   = (p_y − 1) + 2λ·lse·p_y + ε·(1 − 1/V),  with p_y − 1 = expm1(z_y − lse).
          const double py_m1 = std::expm1(zy - lse);
          double d = static_cast<double>(scale) *
                     (py_m1 + 2.0 * lam * lse * (py_m1 + 1.0) + eps * (1.0 - 1.0 / p.vocab()));
          if (cap > 0.0) d *= 1.0 - (zy / cap) * (zy / cap);
          z[y - v0] = static_cast<float>(d);
        }
      }
      if (dbacc) {
        float* acc = dbacc + v0;
        if (first_block && i == 0)
          std::memcpy(acc, z, static_cast<size_t>(n) * sizeof(float));
        else
          for (int64_t j = 0; j < n; ++j) acc[j] += z[j];
      }
    }
    if (dot) {
      dw_dot(tid, nb, v0, n, first_block);
      continue;
    }
    if (pk) {
      dw_pk(tid, nb, v0, n, first_block);
      continue;
    }
    if (!dw32) continue;
    const float beta = first_block ? 0.0f : 1.0f;
    TESSERA_TRACE_SCOPE("lce.gemm.dw");
    if (hv)  // dw[:, v0:v0+n] (H × n) += x_blkᵀ · D
      gemm(true, false, p.H, n, nb, xb, p.H, D, p.V, beta, dw32 + v0, p.V);
    else     // dw[v0:v0+n, :] (n × H) += Dᵀ · x_blk
      gemm(true, false, n, p.H, nb, D, p.V, xb, p.H, beta, dw32 + v0 * p.H, p.H);
  }
}

void Call::phase_b2(int tid, int64_t b0, int64_t nb) {
  TESSERA_TRACE_SCOPE_I("lce.phase_b2", b0);  // dx GEMM
  const Range r = split(p.H, tid, T, 16);
  if (r.size() == 0) return;
  const bool hv = p.layout == WLayout::kHV;
  float* dxf = dxs ? dxs : static_cast<float*>(gout->dx) + b0 * p.H;
  if (!w_chunks()) {  // one GEMM over the whole vocabulary (K = V)
    int64_t ld = 0;
    const float* W = w_block(tid, r.begin, r.size(), 0, p.V, &ld);
    gemm(false, hv, nb, r.size(), p.V, slab, p.V, W, ld, 0.0f, dxf + r.begin, p.H);
  } else {
    for (int64_t v0 = 0; v0 < p.V; v0 += vb) {
      const int64_t n = std::min(vb, p.V - v0);
      for (int64_t h0 = r.begin; h0 < r.end; h0 += hb) {
        const int64_t hc = std::min(hb, r.end - h0);
        int64_t ld = 0;
        const float* W = w_block(tid, h0, hc, v0, n, &ld);
        gemm(false, hv, nb, hc, n, slab + v0, p.V, W, ld, v0 == 0 ? 0.0f : 1.0f, dxf + h0, p.H);
      }
    }
  }
  store_dx(b0, nb, r);
}

// Stores the f32 accumulators of dw (when not f32) and dbias.
void Call::finish(int tid) {
  if (!grads) return;
  TESSERA_TRACE_SCOPE("lce.finish");
  if (dw32 && dw32 != gout->dw) {
    const Range r = split(p.H * p.V, tid, T, 64);
    store_rounded(gout->dw, gout->dw_dtype, r.begin, dw32 + r.begin, r.size());
  }
  if (dbacc) {
    const Range r = split(p.V, tid, T, 16);
    for (int64_t j = r.begin; j < r.end; ++j) store_from_f32(gout->dbias, gout->dbias_dtype, j, dbacc[j]);
  }
}

// cpu_v2's route: a bf16 / f16 w on the f32 route (f16; bf16 without AVX512-BF16) is converted
// to f32 once per call when the pass computes gradients: chunk by chunk it is converted twice per
// token block (phases A and B2), and the chunks split the K = H logits GEMM and the K = V dx GEMM
// into K = h pieces. The copy is w-sized, like the dw accumulator a half dw needs already; a call
// with Options::memory_budget set, and a vocabulary slice or partial-form problem (whose budget
// the slices have already spent), keeps the per-chunk conversion. Forward alone keeps the
// per-chunk conversion: a copy there was measured no faster (739 vs 726 ms at B=2048, H=1024,
// V=32768 bf16) and cost 128 MiB.
bool Call::use_w_copy() const {
  return copy_w && grads && p.memory_budget == 0 && !p.partial();
}

void Call::convert_w(int tid) {
  TESSERA_TRACE_SCOPE("lce.convert_w");
  const Range r = split(p.H * p.V, tid, T, 64);
  simd::half_to_f32(static_cast<const uint16_t*>(p.w) + r.begin, p.dtype == DType::kBF16, w32 + r.begin, r.size());
}

void Call::worker(int tid, Barrier& bar) {
  if (w32) {
    convert_w(tid);
    bar.arrive_and_wait();
  }
  if (fwd_once) {
    if (pk && half) {  // all of x widened first (each thread its rows): every chunk reads every row
      const Range rows = split(p.B, tid, T, 1);
      simd::half_to_f32(static_cast<const uint16_t*>(p.x) + rows.begin * p.H, p.dtype == DType::kBF16,
                        xconv + rows.begin * p.H, rows.size() * p.H);
      bar.arrive_and_wait();
    }
    if (pk)
      phase_a_once_pk(tid);
    else
      phase_a_once(tid);
    bar.arrive_and_wait();
    merge_rows(tid, 0, p.B);
    bar.arrive_and_wait();
    if (tid == 0)
      for (int64_t i = 0; i < p.B; ++i) total += rowloss[i];
    return;
  }
  for (int64_t b0 = 0; b0 < p.B; b0 += bb) {
    const int64_t nb = std::min(bb, p.B - b0);
    const float* xb = static_cast<const float*>(p.x) + b0 * p.H;
    if (dot) {
      if (dw32) prepare_x_dot(tid, b0, nb);  // read after phase A's barrier (by the dw GEMM only)
    } else {
      if (half) {
        const Range rows = split(nb, tid, T, 1);
        const auto* x = static_cast<const uint16_t*>(p.x);
        simd::half_to_f32(x + (b0 + rows.begin) * p.H, p.dtype == DType::kBF16,
                          xconv + rows.begin * p.H, rows.size() * p.H);
        bar.arrive_and_wait();
        xb = xconv;
      }
      if (pk && dw32) prepare_x_pk(tid, xb, nb);  // read after phase A's barrier (by the dw GEMM only)
    }
    phase_a(tid, b0, nb, xb);
    bar.arrive_and_wait();
    merge_rows(tid, b0, nb);
    bar.arrive_and_wait();
    if (tid == 0 && mode != Mode::kBackward)
      for (int64_t i = 0; i < nb; ++i) total += rowloss[i];
    if (grads) {
      phase_b1(tid, b0, nb, xb, b0 == 0);
      bar.arrive_and_wait();
      if (gout->dx) {  // dx left out: no phase B2
        if (dot)
          phase_b2_dot(tid, b0, nb);
        else if (pk)
          phase_b2_pk(tid, b0, nb);
        else
          phase_b2(tid, b0, nb);
      }
      bar.arrive_and_wait();
    }
  }
  finish(tid);
}

void Call::run() {
  TESSERA_TRACE_SCOPE("lce.call");
  {
    // The workers meet at barriers and never throw (every buffer is allocated before): noexcept
    // keeps a broken promise a crash (std::terminate) rather than threads waiting at a barrier.
    Barrier bar(T);
    cpu_threads::run_threads(T, /*blas=*/true, std::string(kKernelName) + " cpu",
                             [&](int tid) noexcept { worker(tid, bar); });
  }
  if (mode != Mode::kBackward && !p.partial()) {
    if (p.reduction == Reduction::kSum) fout->loss[0] = static_cast<float>(total);
    if (p.reduction == Reduction::kMean)
      fout->loss[0] = denom == 0.0 ? 0.0f : static_cast<float>(total / denom);
  }
}

// "cpu". Its folded version cpu_v2 (below) derives from it with copy_w (Call::use_w_copy).
class Cpu : public Implementation {
 public:
  explicit Cpu(bool copy_w = false) : copy_w_(copy_w) {}
  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return "optimized CPU backend: packed AVX-512 f32 micro-kernel tiles, f16 (and bf16 without AVX512-BF16) widened "
           "as w is packed (OpenBLAS sgemm without AVX-512; bf16: AVX512-BF16 packed micro-kernel) + "
           "Highway SIMD online softmax, threads own vocab ranges (deterministic); extra memory in backward ~ b*V*4 "
           "bytes (f32 on the AVX-512 route: b rounded up to 64 rows, "
           "bf16 dot route b*V*6, plus an f32 H*V accumulator when dw is bf16/f16, or, when that exceeds "
           "memory_budget, gradients in vocabulary slices: one more GEMM in a fused call)" +
           std::string(copy_w_ ? "; plus an f32 copy of a bf16/f16 w (H*V*4 bytes) in gradient passes off the "
                                 "AVX512-BF16 route, unless memory_budget is smaller"
                               : "");
  }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  bool skips_gradients() const override { return true; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU)
      return Availability::no("inputs are on " + p.device.str() + ", the cpu backend runs on host memory");
    if (p.H > INT_MAX || p.V > INT_MAX)
      return Availability::no("H and V must be < 2^31 (BLAS uses 32-bit dimensions), got H=" +
                              std::to_string(p.H) + ", V=" + std::to_string(p.V));
    return Availability::yes();
  }

  // b: the b×V f32 slab of the gradient pass stays <= 32 MiB (b in [16, 256], a power of 2).
  BlockSizes default_block_sizes(const Problem& p) const override {
    int64_t b = 256;
    while (b > 16 && static_cast<size_t>(b) * static_cast<size_t>(p.V) * sizeof(float) > kSlabTargetBytes)
      b /= 2;
    // bf16 dot route: 512 × 512 chunks of w, packed (512 KiB) while the L2 holds them.
    if (p.dtype == DType::kBF16 && cpu_bf16_gemm::available()) return BlockSizes{b, 512, 512};
    return BlockSizes{b, 512, 2048};
  }

  void validate_block_sizes(const BlockSizes& bs) const override {
    auto fail = [name = name()](const std::string& what) {
      throw Error(ErrorCode::kInvalidArgument, std::string(kKernelName) + " " + name + ": invalid block sizes: " + what);
    };
    if (bs.b < 1 || bs.b > kMaxBlockB)
      fail("b (token block) must be in [1, " + std::to_string(kMaxBlockB) + "], got " + std::to_string(bs.b));
    if (bs.v < 1 || bs.v > kMaxBlock)
      fail("v (vocab block) must be in [1, " + std::to_string(kMaxBlock) + "], got " + std::to_string(bs.v));
    if (bs.h < 1 || bs.h > kMaxBlock)
      fail("h (hidden block: the chunk of w converted (f16) or packed (bf16) at a time) must be in [1, " +
           std::to_string(kMaxBlock) + "], got " + std::to_string(bs.h));
  }

  bool tunable() const override { return true; }

  // b in {64, 128, 256} (those whose b×V slab is <= 64 MiB; at least the smallest), v in
  // {1024, 2048, 4096}; h = 512 (it matters only for bf16/f16, where 256 and 1024 are added).
  std::vector<BlockSizes> candidate_block_sizes(const Problem& p) const override {
    std::vector<int64_t> bs;
    for (int64_t b : {16, 32, 64, 128, 256})
      if (static_cast<size_t>(b) * static_cast<size_t>(p.V) * sizeof(float) <= 2 * kSlabTargetBytes)
        bs.push_back(b);
    if (bs.size() > 3) bs.erase(bs.begin(), bs.end() - 3);
    if (bs.empty()) bs.push_back(16);
    std::vector<BlockSizes> out;
    for (int64_t b : bs)
      for (int64_t v : {1024, 2048, 4096}) out.push_back(BlockSizes{b, 512, v});
    if (p.dtype != DType::kF32) {
      const BlockSizes d = default_block_sizes(p);
      out.push_back(BlockSizes{d.b, 256, d.v});
      out.push_back(BlockSizes{d.b, 1024, d.v});
    }
    return out;
  }

  void forward(const Problem& p, const BlockSizes& bs, const ForwardOut& out) const override {
    validate_block_sizes(bs);
    Call c(p, Mode::kForward, copy_w_);
    c.fout = &out;
    c.setup(bs);
    c.run();
  }

  void backward(const Problem& p, const BlockSizes& bs, const GradIn& g, const GradOut& out) const override {
    validate_block_sizes(bs);
    if (vocab_slices::needed(p, bs, out)) return vocab_slices::backward(*this, p, bs, g, out);
    Call c(p, Mode::kBackward, copy_w_);
    c.gin = &g;
    c.gout = &out;
    c.setup(bs);
    c.run();
  }

  void forward_backward(const Problem& p, const BlockSizes& bs, const GradIn& g, const ForwardOut& fout,
                        const GradOut& gout) const override {
    validate_block_sizes(bs);
    if (vocab_slices::needed(p, bs, gout)) return vocab_slices::forward_backward(*this, p, bs, g, fout, gout);
    Call c(p, Mode::kFused, copy_w_);
    c.fout = &fout;
    c.gin = &g;
    c.gout = &gout;
    c.setup(bs);
    c.run();
  }

 private:
  bool copy_w_;
};

}  // namespace

std::unique_ptr<Implementation> make_cpu_implementation() { return std::make_unique<Cpu>(); }

// new_version: folded versions begin (scripts/new_version.py leaves this region out of a clone)
namespace {
// Version cpu_v2: one route of its own (Call::use_w_copy), every other phase cpu's (docs/VERSIONS.md, "fold").
class CpuV2 final : public Cpu {
 public:
  CpuV2() : Cpu(true) {}
  std::string name() const override { return "cpu_v2"; }
  VersionStatus status() const override { return VersionStatus::kExperimental; }
  std::string what_changed() const override {
    return "bf16/f16 gradient passes on the f32 route: w converted to f32 once per call (w-sized) instead of per "
           "chunk twice per token block, so the logits and dx GEMMs run with K = H / K = V as in f32";
  }
};
}  // namespace

std::unique_ptr<Implementation> make_cpu_v2_implementation() { return std::make_unique<CpuV2>(); }
// new_version: folded versions end

}  // namespace tessera::linear_cross_entropy
