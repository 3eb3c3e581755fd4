// linear_cross_entropy: the optimized CPU backend ("cpu_v2").
//
// Version cpu_v2, cloned from cpu.cc by scripts/new_version.py (status experimental until it is measured; docs/VERSIONS.md).
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
//   bf16 / f16 inputs: x_blk is converted to f32 once per token block (b×H); w is converted
//   per (h-block × v-block) chunk into a per-thread buffer (the "h" block size is only used for
//   this), never as a whole. Gradients accumulate in f32; a bf16/f16 dw output needs an f32
//   accumulator of w's size (gradient-sized, documented); a bf16/f16 dx needs a b×H f32 buffer.
//
// Threads: std::thread + a spin-then-sleep barrier, spawned per call (tens of µs, negligible against the
// GEMMs). Not OpenMP: static ownership with explicit barriers is what makes the sums
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

#include "core/memory.h"
#include "core/trace.h"
#include "primitives/cpu_blas.h"
#include "kernels/linear_cross_entropy/cpu_rows.h"
#include "kernels/linear_cross_entropy/cpu_simd.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "tessera/error.h"

namespace tessera::linear_cross_entropy {
namespace {

namespace simd = cpu_simd;

constexpr int64_t kMaxBlock = int64_t{1} << 20;
constexpr int64_t kMaxBlockB = int64_t{1} << 16;
constexpr int kMaxThreads = 1024;
constexpr int64_t kMinWorkPerThread = int64_t{1} << 16;  // multiply-adds per token block
constexpr size_t kSlabTargetBytes = size_t{32} << 20;  // default b keeps the b×V slab below this

using BlasSingleThreaded = cpu_blas::SingleThreaded;  // OpenBLAS single-threaded while we run

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

// Per-row online softmax state of one thread's vocab range.
using cpu_rows::RowPartial;

enum class Mode { kForward, kBackward, kFused };

void store_rounded(void* dst, DType dt, int64_t begin, const float* src, int64_t n);

struct Call {
  const Problem& p;
  Mode mode;
  const ForwardOut* fout = nullptr;
  const GradIn* gin = nullptr;
  const GradOut* gout = nullptr;

  int T = 1;
  int64_t bb = 1, vb = 1, hb = 1;  // effective block sizes
  bool half = false;               // bf16 / f16 inputs
  bool wchunks = false;            // half, and w converted chunk by chunk (no f32 copy of w)
  bool grads = false;
  bool need_stats = true;          // false when backward was given the forward's lse
  double denom = 1.0;              // mean denominator Σ weights (non-ignored)

  // scratch (all through memory::host_alloc)
  memory::HostBuffer part_buf, row_buf, row_scale_buf, rowloss_buf, tile_buf, slab_buf, xconv_buf, wconv_buf,
      dxs_buf, dwacc_buf, dbacc_buf, bias_buf, w32_buf;
  RowPartial* part = nullptr;  // [T][bb]
  double* row_lse = nullptr;   // [bb] (f64: the label column's p_y − 1 needs more than f32 lse)
  float* row_scale = nullptr;  // [bb]
  double* rowloss = nullptr;   // [bb]
  float* tile = nullptr;       // [T][bb][vb]   forward only
  float* slab = nullptr;       // [bb][V]       gradients
  float* xconv = nullptr;      // [bb][H]       half inputs
  float* wconv = nullptr;      // [T][hb*vb]    half inputs, w by chunks
  float* w32 = nullptr;        // w-sized f32 copy of a half w (see use_w_copy)
  float* dxs = nullptr;        // [bb][H]       dx not f32
  float* dw32 = nullptr;       // w-sized f32: dw output itself when f32, else accumulator
  float* dbacc = nullptr;      // [V]
  float* biasf = nullptr;      // [V]
  double total = 0.0;          // Σ loss_t, accumulated by thread 0 in row order

  Call(const Problem& prob, Mode m) : p(prob), mode(m) {}

  void setup(const BlockSizes& bs);
  void run();
  void worker(int tid, Barrier& bar);

  // helpers
  // Vocab step of phases A and B1. With the slab (gradients) and f32 w, one GEMM per thread
  // covers its whole vocab range: fewer, larger GEMMs (x_blk packed once), and the elementwise
  // passes over the slab are cheap next to the K = H GEMM. Otherwise (forward: bounded tile;
  // bf16/f16: w converted per chunk) the v block.
  int64_t slab_step(const Range& r) const { return grads && !wchunks ? std::max<int64_t>(1, r.size()) : vb; }
  bool use_w_copy() const;
  void convert_w(int tid);
  const float* w_block(int tid, int64_t h0, int64_t hc, int64_t v0, int64_t n, int64_t* ld) const;
  void logits_tile(int tid, const float* xb, int64_t nb, int64_t v0, int64_t n, float* Z,
                   int64_t ldz) const;
  void phase_a(int tid, int64_t b0, int64_t nb, const float* xb);
  void merge_rows(int tid, int64_t b0, int64_t nb);
  void phase_b1(int tid, int64_t b0, int64_t nb, const float* xb, bool first_block);
  void phase_b2(int tid, int64_t b0, int64_t nb);
  void finish(int tid);
};

template <class T>
T* alloc(memory::HostBuffer& buf, size_t count) {
  buf = memory::host_alloc(std::max<size_t>(1, count) * sizeof(T));
  return memory::as<T>(buf);
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
  grads = mode != Mode::kForward;
  wchunks = half && !use_w_copy();
  need_stats = !(mode == Mode::kBackward && gin->lse != nullptr);
  const auto ubb = static_cast<size_t>(bb), uV = static_cast<size_t>(p.V),
             uH = static_cast<size_t>(p.H);

  if (p.reduction == Reduction::kMean) {
    denom = 0.0;
    for (int64_t t = 0; t < p.B; ++t)
      if (!p.ignored(t)) denom += p.weight(t);
  }
  part = alloc<RowPartial>(part_buf, static_cast<size_t>(T) * ubb);
  row_lse = alloc<double>(row_buf, ubb);
  row_scale = alloc<float>(row_scale_buf, ubb);
  rowloss = alloc<double>(rowloss_buf, ubb);
  if (grads)
    slab = alloc<float>(slab_buf, ubb * uV);
  else
    tile = alloc<float>(tile_buf, static_cast<size_t>(T) * ubb * static_cast<size_t>(vb));
  if (half) xconv = alloc<float>(xconv_buf, ubb * uH);
  if (wchunks) wconv = alloc<float>(wconv_buf, static_cast<size_t>(T) * static_cast<size_t>(hb * vb));
  if (half && !wchunks) w32 = alloc<float>(w32_buf, uH * uV);
  if (p.bias) {
    biasf = alloc<float>(bias_buf, uV);
    for (int64_t j = 0; j < p.V; ++j) biasf[j] = load_as_f32(p.bias, p.bias_dtype, j);
  }
  if (grads) {
    if (gout->dx_dtype != DType::kF32) dxs = alloc<float>(dxs_buf, ubb * uH);
    if (gout->dw_dtype == DType::kF32)
      dw32 = static_cast<float*>(gout->dw);
    else
      dw32 = alloc<float>(dwacc_buf, uH * uV);  // gradient-sized (bf16/f16 dw only)
    if (gout->dbias) dbacc = alloc<float>(dbacc_buf, uV);
  }
}

// The (h0..h0+hc) × (v0..v0+n) block of w as f32, in w's own layout: kHV rows h, cols v;
// kVH rows v, cols h. f32: a pointer into w. bf16/f16: converted into this thread's buffer.
const float* Call::w_block(int tid, int64_t h0, int64_t hc, int64_t v0, int64_t n, int64_t* ld) const {
  const bool hv = p.layout == WLayout::kHV;
  if (!wchunks) {
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
  const int64_t hstep = wchunks ? hb : p.H;  // f32 w: one GEMM with K = H
  for (int64_t h0 = 0; h0 < p.H; h0 += hstep) {
    const int64_t hc = std::min(hstep, p.H - h0);
    int64_t ld = 0;
    const float* W = w_block(tid, h0, hc, v0, n, &ld);
    gemm(false, !hv, nb, n, hc, xb + h0, p.H, W, ld, h0 == 0 ? 0.0f : 1.0f, Z, ldz);
  }
}

void Call::phase_a(int tid, int64_t b0, int64_t nb, const float* xb) {
  TESSERA_TRACE_SCOPE_I("lce.phase_a", b0);
  const Range r = split(p.V, tid, T, 16);
  RowPartial* P = part + static_cast<int64_t>(tid) * bb;
  for (int64_t i = 0; i < nb; ++i)
    P[i] = RowPartial{-std::numeric_limits<float>::infinity(), 0.0f, 0.0, 0.0, r.begin};
  const int64_t step = slab_step(r);
  for (int64_t v0 = r.begin; v0 < r.end; v0 += step) {
    const int64_t n = std::min(step, r.end - v0);
    float* Z;
    int64_t ldz;
    if (grads) {
      Z = slab + v0;
      ldz = p.V;
    } else {
      Z = tile + static_cast<int64_t>(tid) * bb * vb;
      ldz = vb;
    }
    logits_tile(tid, xb, nb, v0, n, Z, ldz);
    TESSERA_TRACE_SCOPE("lce.softmax");  // the rows of this tile, to the end of the iteration
    for (int64_t i = 0; i < nb; ++i) cpu_rows::row_stats(p, biasf, need_stats, P[i], Z + i * ldz, n, v0, b0 + i);
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
      for (int k = 0; k < T; ++k) m = std::max(m, static_cast<double>(part[k * bb + i].m));
      double s = 0.0, sumz = 0.0, zy = 0.0;
      int64_t amax = 0;
      bool found = false;
      for (int k = 0; k < T; ++k) {
        const RowPartial& q = part[k * bb + i];
        const Range r = split(p.V, k, T, 16);
        if (r.size() == 0) continue;
        s += q.s * std::exp(static_cast<double>(q.m) - m);
        sumz += q.sumz;
        if (!found && static_cast<double>(q.m) == m) {
          amax = q.amax;
          found = true;
        }
        if (y >= r.begin && y < r.end) zy = q.zy;
      }
      lse = m + std::log(s);
      if (write_fwd) {
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
  const double eps = p.label_smoothing, lam = p.z_loss_weight, cap = p.soft_cap;
  const float offset = static_cast<float>(eps / static_cast<double>(p.V));
  const int64_t step = slab_step(r);
  for (int64_t v0 = r.begin; v0 < r.end; v0 += step) {
    const int64_t n = std::min(step, r.end - v0);
    float* D = slab + v0;
    for (int64_t i = 0; i < nb; ++i) {
      float* z = D + i * p.V;
      const float scale = row_scale[i];
      if (scale == 0.0f) {  // ignored row, zero weight or zero upstream gradient
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
                     (py_m1 + 2.0 * lam * lse * (py_m1 + 1.0) + eps * (1.0 - 1.0 / static_cast<double>(p.V)));
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
  if (!wchunks) {  // one GEMM over the whole vocabulary (K = V)
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
  if (dxs) {
    for (int64_t i = 0; i < nb; ++i)
      store_rounded(gout->dx, gout->dx_dtype, (b0 + i) * p.H + r.begin, dxs + i * p.H + r.begin, r.size());
  }
}

// dst[i] = src[i - begin] for i in [begin, begin + n), rounded to dst's dtype, in one typed loop
// per dtype (the compiler vectorizes the bf16 one; store_from_f32 switches on the dtype per
// element). Same rounding as store_from_f32: f32_to_bf16 / f32_to_f16.
void store_rounded(void* dst, DType dt, int64_t begin, const float* src, int64_t n) {
  if (dt == DType::kBF16) {
    uint16_t* d = static_cast<uint16_t*>(dst) + begin;
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
  } else if (dt == DType::kF16) {
    uint16_t* d = static_cast<uint16_t*>(dst) + begin;
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) store_from_f32(dst, dt, begin + i, src[i]);
  }
}

// Stores the f32 accumulators of dw (when not f32) and dbias.
void Call::finish(int tid) {
  if (!grads) return;
  TESSERA_TRACE_SCOPE("lce.finish");
  if (dw32 != gout->dw) {
    const Range r = split(p.H * p.V, tid, T, 64);
    store_rounded(gout->dw, gout->dw_dtype, r.begin, dw32 + r.begin, r.size());
  }
  if (dbacc) {
    const Range r = split(p.V, tid, T, 16);
    for (int64_t j = r.begin; j < r.end; ++j) store_from_f32(gout->dbias, gout->dbias_dtype, j, dbacc[j]);
  }
}

// bf16 / f16 w is converted to f32 once per call when the pass computes gradients: chunk by
// chunk it would be converted twice per token block (phases A and B2), and the chunks split
// the K = H logits GEMM and the K = V dx GEMM into K = h pieces. The copy is w-sized, like the
// dw accumulator the gradients already need; Options::memory_budget (when set) turns it off if
// it does not fit. Forward alone keeps the per-chunk conversion: measured, a copy did not make
// it faster (739 vs 726 ms at B=2048, H=1024, V=32768 bf16) and cost 128 MiB.
bool Call::use_w_copy() const {
  if (!grads) return false;
  const double bytes = 4.0 * static_cast<double>(p.H) * static_cast<double>(p.V);
  return p.memory_budget == 0 || bytes <= static_cast<double>(p.memory_budget);
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
  for (int64_t b0 = 0; b0 < p.B; b0 += bb) {
    const int64_t nb = std::min(bb, p.B - b0);
    const float* xb = static_cast<const float*>(p.x) + b0 * p.H;
    if (half) {
      const Range rows = split(nb, tid, T, 1);
      const auto* x = static_cast<const uint16_t*>(p.x);
      simd::half_to_f32(x + (b0 + rows.begin) * p.H, p.dtype == DType::kBF16,
                        xconv + rows.begin * p.H, rows.size() * p.H);
      bar.arrive_and_wait();
      xb = xconv;
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
      phase_b2(tid, b0, nb);
      bar.arrive_and_wait();
    }
  }
  finish(tid);
}

void Call::run() {
  TESSERA_TRACE_SCOPE("lce.call");
  {
    BlasSingleThreaded blas_guard;
    if (T == 1) {
      Barrier bar(1);
      worker(0, bar);
    } else {
      // Workers wait on `go` so that a failure to start a thread leaves none stuck on a barrier.
      Barrier bar(T);
      std::atomic<int> go{0};  // 0 wait, 1 run, 2 abort
      std::vector<std::thread> threads;
      threads.reserve(static_cast<size_t>(T - 1));
      auto body = [&](int tid) {
        while (go.load(std::memory_order_acquire) == 0) std::this_thread::yield();
        if (go.load(std::memory_order_acquire) == 1) worker(tid, bar);
      };
      try {
        for (int k = 1; k < T; ++k) threads.emplace_back(body, k);
      } catch (...) {
        go.store(2, std::memory_order_release);
        for (auto& t : threads) t.join();
        throw Error(ErrorCode::kUnsupported, std::string(kKernelName) + " cpu_v2: could not start " +
                                              std::to_string(T) + " threads");
      }
      go.store(1, std::memory_order_release);
      worker(0, bar);
      for (auto& t : threads) t.join();
    }
  }
  if (mode != Mode::kBackward) {
    if (p.reduction == Reduction::kSum) fout->loss[0] = static_cast<float>(total);
    if (p.reduction == Reduction::kMean)
      fout->loss[0] = denom == 0.0 ? 0.0f : static_cast<float>(total / denom);
  }
}

class Cpu final : public Implementation {
 public:
  std::string name() const override { return "cpu_v2"; }
  VersionStatus status() const override { return VersionStatus::kExperimental; }
  std::string what_changed() const override { return "bf16/f16 gradient passes: w converted to f32 once per call (w-sized) instead of per chunk twice per token block, so the logits and dx GEMMs run with K = H / K = V as in f32; typed rounding loops for dx/dw"; }
  std::string description() const override {
    return "optimized CPU backend: blocked OpenBLAS sgemm tiles + Highway SIMD online softmax, "
           "threads own vocab ranges (deterministic); extra memory ~ b*V*4 bytes in backward";
  }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU)
      return Availability::no("inputs are on " + p.device.str() + ", the cpu backend runs on host memory");
    if (p.partial()) return Availability::no("the vocab-parallel partial form is implemented by cpu, not cpu_v2");
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
    return BlockSizes{b, 512, 2048};
  }

  void validate_block_sizes(const BlockSizes& bs) const override {
    auto fail = [](const std::string& what) {
      throw Error(ErrorCode::kInvalidArgument, std::string(kKernelName) + " cpu_v2: invalid block sizes: " + what);
    };
    if (bs.b < 1 || bs.b > kMaxBlockB)
      fail("b (token block) must be in [1, " + std::to_string(kMaxBlockB) + "], got " + std::to_string(bs.b));
    if (bs.v < 1 || bs.v > kMaxBlock)
      fail("v (vocab block) must be in [1, " + std::to_string(kMaxBlock) + "], got " + std::to_string(bs.v));
    if (bs.h < 1 || bs.h > kMaxBlock)
      fail("h (hidden block, used to convert bf16/f16 w in chunks) must be in [1, " +
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
    Call c(p, Mode::kForward);
    c.fout = &out;
    c.setup(bs);
    c.run();
  }

  void backward(const Problem& p, const BlockSizes& bs, const GradIn& g, const GradOut& out) const override {
    validate_block_sizes(bs);
    Call c(p, Mode::kBackward);
    c.gin = &g;
    c.gout = &out;
    c.setup(bs);
    c.run();
  }

  void forward_backward(const Problem& p, const BlockSizes& bs, const GradIn& g, const ForwardOut& fout,
                        const GradOut& gout) const override {
    validate_block_sizes(bs);
    Call c(p, Mode::kFused);
    c.fout = &fout;
    c.gin = &g;
    c.gout = &gout;
    c.setup(bs);
    c.run();
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cpu_v2_implementation() { return std::make_unique<Cpu>(); }

}  // namespace tessera::linear_cross_entropy
