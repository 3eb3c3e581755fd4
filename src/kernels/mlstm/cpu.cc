// mlstm: the CPU backend — the chunkwise form, threads over chunks within a head.
//
// A head is cut into chunks of L steps. Within a chunk, with the state (C_j, n_j, m_j) it enters
// with and cum_t = Σ_{u ≤ t in chunk} logsigmoid(f_u):
//   D_ts = cum_t − cum_s + i_s  for s in the segment of t (since the last reset), s ≤ t
//   g_t  = m_j + cum_t while no reset lies between the chunk start and t (else the segment starts
//          from the zero state, m = 0: g_t = cum_t − cum_{r−1}, and there is no inter term)
//   m_t  = max(g_t, max_s D_ts) — the recurrence's stabilizer exactly
//   h_t  = (Σ_s e^{D_ts − m_t}(q̂_t·k_s) v_s + e^{g_t − m_t} C_jᵀq̂_t) / (max(|den_t|, e^{−m_t}) + eps)
// The chunk's own contribution to the next state, ΔC_j = Kᵀ diag(e^{D_last,s − mloc}) V with its
// local stabilizer mloc = max_s D_last,s, needs nothing from other chunks; only the chain
// C_{j+1} = a_j C_j + b_j ΔC_j (a, b ≤ 1 rescale to m_{j+1}) is sequential, and it is one axpy.
//
// Threads (run_heads, plan_of). Forward: one thread per (head, part of its value columns), one
// state updated in place — the state's columns evolve apart, so nothing is handed over; parts
// only where the heads do not divide over the threads. Backward: teams; a team shares one head at
// a time, each member takes chunks round-robin, computes what is local to a chunk at once and
// waits only for the axpy of the previous chunk (teams of one thread — independent heads — where
// the heads divide over the threads and their states fit kStateBudget). It runs the forward
// sweep keeping every C_j (the only large extra memory, one head per team), then walks the chunks
// in reverse: each chunk's gradients against C_j, its own part of dC_j = Q̂ᵀdiag(w)dNum written
// over C_j, then the chain dC_j += a_j dC_{j+1}, then the gradients through the chunk's end state with
// dC_{j+1}. The stabilizer m is held constant (the contract), so L depends on the gates only
// through e^{cum_t} q̂_t and e^{i_s − cum_s} k_s: di_s = k_s·dk_s and d logsigmoid(f_u) =
// Σ_{t ≥ u in u's segment} (q̂_t·dq̂_t − k_t·dk_t) (+ ⟨dC_last, C_last⟩ + ⟨dn_last, n_last⟩ at
// t = S−1), each dot formed from its intra-chunk, inter-chunk and state parts (gate_suffix).
#include <algorithm>
#include <atomic>
#include <barrier>
#include <mutex>
#include <numeric>
#include <cmath>
#include <limits>
#include <vector>

#ifdef __linux__
#include <sys/mman.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/env.h"
#include "core/memory.h"
#include "core/trace.h"
#include "kernels/mlstm/impl.h"
#include "primitives/cpu_blas.h"
#include "primitives/cpu_f32_gemm.h"
#include "primitives/cpu_threads.h"

namespace tessera::mlstm {
namespace {

constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxChunk = 1024;

using cpu_blas::sgemm;
namespace f32 = cpu_f32_gemm;

// v0.4: the L·DK·DV products and P·V, Pᵀ·dNum run on the kernel-owned micro-kernel
// (primitives/cpu_f32_gemm.h), B packed once per chunk and shared where two products use it (V:
// P·V and the state update; dNum: Pᵀ·dNum and dC_j), the two with a transposed state formed
// transposed (abt_via_transpose); Q̂Kᵀ, dNum·Vᵀ, dS·K and dSᵀ·Q̂ stay on OpenBLAS, which measured
// as fast or faster for them once their packing is counted (devlog v0.4).
// TESSERA_MLSTM_CPU_GEMM=blas runs every product on OpenBLAS (v0.3's route, for side-by-side
// timing); so does a CPU with neither AVX-512F nor AVX2 + FMA (v0.6: the AVX2 kernel, 0.92× the
// fused pass's OpenBLAS time on a Zen 3).
bool use_kernel_gemm() {
  const auto v = env::get("TESSERA_MLSTM_CPU_GEMM");
  return f32::isa() != f32::Isa::kPortable && !(v && *v == "blas");
}

// The L×L products of a chunk are causal: P_ts, dS_ts are 0 for s > t. They are issued in row
// blocks of kTriBlock steps against only the columns (or, transposed, the rows) a block can
// reach, skipping the zero blocks above the diagonal: (1 + 1/nb)/2 of the full products' FLOPs
// for nb blocks (0.5625 at L = 64). Smaller blocks skip more but make more, smaller sgemm calls
// (devlog v0.3: the five L×L products of a chunk, one thread, OpenBLAS 0.3.21: L = 64, D = 256:
// 116 µs in full, 81 / 64 / 59 µs in blocks of 32 / 16 / 8; L = 32, D = 128: 12.7 µs in full,
// 8.7 in blocks of 8, 8.8 in blocks of 4).
constexpr int64_t kTriBlock = 8;

// C (L×L, ld L) = alpha A·Bᵀ on and below the diagonal blocks (A, B: L rows of K), the blocks
// above them set to 0.
void tri_abt(int64_t L, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float* C) {
  for (int64_t lo = 0; lo < L; lo += kTriBlock) {
    const int64_t hi = std::min(L, lo + kTriBlock);
    sgemm(false, true, hi - lo, hi, K, alpha, A + lo * lda, lda, B, ldb, 0.f, C + lo * L, L);
    for (int64_t t = lo; t < hi; ++t) std::fill(C + t * L + hi, C + (t + 1) * L, 0.f);
  }
}

// Y (L×N) = alpha T·B + beta Y for T (L×L, ld L) zero above its diagonal blocks.
void tri_tb(int64_t L, int64_t N, float alpha, const float* T, const float* B, int64_t ldb, float beta, float* Y,
            int64_t ldy) {
  for (int64_t lo = 0; lo < L; lo += kTriBlock) {
    const int64_t hi = std::min(L, lo + kTriBlock);
    sgemm(false, false, hi - lo, N, hi, alpha, T + lo * L, L, B, ldb, beta, Y + lo * ldy, ldy);
  }
}

// Y (L×N) = alpha Tᵀ·B + beta Y for T (L×L, ld L) zero above its diagonal blocks: rows lo..hi of
// Y need rows lo.. of T and B only.
void tri_ttb(int64_t L, int64_t N, float alpha, const float* T, const float* B, int64_t ldb, float beta, float* Y,
             int64_t ldy) {
  for (int64_t lo = 0; lo < L; lo += kTriBlock) {
    const int64_t hi = std::min(L, lo + kTriBlock);
    sgemm(true, false, hi - lo, N, L - lo, alpha, T + lo * L + lo, L, B + lo * ldb, ldb, beta, Y + lo * ldy, ldy);
  }
}

int64_t chunk_of(const Problem& p) { return p.chunk > 0 ? p.chunk : kDefaultChunk; }

double logsigmoid(double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::fabs(x))); }

// A forget gate that erases the state: logsigmoid(f) below −1e9 (f = −inf, −FLT_MAX: a mask),
// where the recurrence's F = e^{logσ(f) + m_{t−1} − m_t} is exactly 0 for any input gates within
// ±1e8 and m_t = i_t. The step then starts a segment as a reset does, without a zero state's
// stabilizer term (g = −inf: nothing is carried), and its logσ(f) stays out of the running sums
// (−inf made them NaN; −FLT_MAX absorbed every later gate of the chunk).
constexpr double kForgetAll = -1e9;
bool forgets_all(float f) { return logsigmoid(double(f)) < kForgetAll; }

// The denominator's floor exp(−m) in f32, never 0: past m ≈ 103 it would underflow, and with
// eps = 0 and q̂ᵀn = 0 (a zero query) h would be 0/0.
float den_floor(double m) { return std::max(static_cast<float>(std::exp(-m)), std::numeric_limits<float>::min()); }

// Σ a_i b_i in f32 with eight independent partial sums: the compiler vectorizes it (a plain sum
// loop stays scalar, its order being fixed), and the error grows more slowly with n.
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; ++u) acc[u] += a[i + u] * b[i + u];
  float tail = 0.f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

// Large state buffers in 2 MiB pages where the kernel allows it (fewer page faults and TLB
// misses for the chunk states); a hint only.
void advise_huge_pages(void* p, int64_t bytes) {
#ifdef __linux__
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + uintptr_t(bytes)) & ~(kHuge - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)p, (void)bytes;
#endif
}

// A call's scratch is carved out of one block (v0.5; v0.4 made ~30 host_alloc calls). An Arena
// without a base only measures: run_heads carves twice, once to size the block, once into it.
struct Arena {
  uintptr_t base = 0;
  size_t used = 0;
  template <class T>
  T* take(int64_t count) {
    const size_t off = used;
    used += (size_t(std::max<int64_t>(1, count)) * sizeof(T) + 63) / 64 * 64;  // 64-byte aligned, own lines
    return reinterpret_cast<T*>(base + off);
  }
};

// The last call's block is kept for the next (v0.5). Allocated per call, the 17–38 MiB of chunk
// states went back to the OS after each call (glibc trims its heap once two teams' states are
// freed) and every call faulted its pages in again, zeroed: 5–7 % of a fused call's CPU time at
// B=1, NH=4, S=2048, D=256 on 2 threads (perf: clear_page, page faults). One block is cached, the
// last one released; a call takes it when it fits without more than 1/16 to spare (the same shape
// again, as in a training loop), else allocates its own, as does a call that finds it taken
// (concurrent calls). The memory counters (memory::current_bytes, the bench's xtraMiB) count the
// block while a call holds it, not while it waits in the cache: each call's extra memory reads the
// same, reused or not.
// Blocks over 64 MiB are not kept. TESSERA_MLSTM_CPU_KEEP_SCRATCH=0: allocate and free per call
// (v0.4's behaviour).
class ScratchLease {
 public:
  // Blocks over this are never cached (S = 65536 would otherwise keep hundreds of MiB held).
  static constexpr size_t kMaxCachedBytes = size_t{64} << 20;

  explicit ScratchLease(size_t bytes)
      : keep_(bytes <= kMaxCachedBytes && env::flag("TESSERA_MLSTM_CPU_KEEP_SCRATCH", true)) {
    Cache& c = cache();
    if (keep_) {  // not kept: not taken either (KEEP_SCRATCH=0 means a fresh block per call)
      std::lock_guard<std::mutex> lock(c.mu);
      if (c.buf && c.bytes >= bytes && c.bytes <= bytes + bytes / 16) {
        buf_ = std::move(c.buf), bytes_ = c.bytes;
        buf_.get_deleter().bytes = c.counted;  // counted again while this call holds it
        memory::note_alloc(memory::Space::kHost, c.counted);
      }
    }
    if (!buf_) buf_ = memory::host_alloc(bytes), bytes_ = bytes;
  }
  ~ScratchLease() {
    if (!keep_) return;
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    c.counted = buf_.get_deleter().bytes;
    memory::note_free(memory::Space::kHost, c.counted);
    buf_.get_deleter().bytes = 0;  // idle in the cache: not counted (its deleter then counts nothing off)
    c.buf = std::move(buf_), c.bytes = bytes_;  // the block cached before is freed
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  uintptr_t base() const { return reinterpret_cast<uintptr_t>(buf_.get()); }

 private:
  struct Cache {
    std::mutex mu;
    memory::HostBuffer buf;
    size_t bytes = 0, counted = 0;  // asked for; counted by host_alloc (rounded up)
  };
  static Cache& cache() {
    static Cache* c = new Cache;  // never destroyed: no exit-time order with memory's counters
    return *c;
  }
  const bool keep_;  // read once, in the constructor: nothing that can throw in the destructor
  memory::HostBuffer buf_;
  size_t bytes_ = 0;
};

// What a team keeps for the head it is on: the chunk-start states and the gate sums of every step.
struct HeadBufs {
  float *C = nullptr, *n = nullptr;  // [NC + 1][DK·DV], [NC + 1][DK]: C_j, n_j (the backward: dC_j, dn_j)
  double *cum = nullptr, *gl = nullptr, *lmax = nullptr;  // [S]: cum_t, g_t without m_j, max_s D_ts
  int32_t* seg = nullptr;                                  // [S]: first step of t's segment (chunk-local)
  uint8_t* hs = nullptr;                                   // [S]: the chunk's entering state reaches t
  double* m = nullptr;                                     // [NC + 1]: m_j
  double dot_last = 0.0;  // ⟨dC_last, C_last⟩ + ⟨dn_last, n_last⟩
  // The fused pass (forward_backward) only: each chunk's E, P (before 1/den), w, den, den_raw, qn
  // and m_t as its forward formed them, [NC][2L² + 5L] floats and [NC][L] doubles,
  // so that the reverse does not form them again (the same bits either way).
  float* saved = nullptr;
  double* saved_mt = nullptr;
  bool in_place = false;  // one state updated in place (a forward on one thread): C_j for every j in slot 0
};

// One thread's scratch for a chunk of up to L steps.
struct ThreadBufs {
  float *E = nullptr, *P = nullptr, *dP = nullptr;  // [L, L]
  float *dnum = nullptr, *sc = nullptr;  // [L, DV], [L, max(DK, DV)]
  double* mt = nullptr;                               // [L]
  float *w = nullptr, *den = nullptr, *den_raw = nullptr, *ddr = nullptr;  // [L]
  float *qn = nullptr, *cs = nullptr;  // [L]: q̂_t·n_j; column sums of dD
  float* ones = nullptr;               // [L] of 1
  float* dn = nullptr;                 // [DK]: Δn_j (a forward in place, a folded chain step)
  float *pk = nullptr, *pk2 = nullptr;  // packed B operands (cpu_f32_gemm), each up to K × N = max(L, DK, DV)²
  const float* pk_v = nullptr;          // pk holds V packed from here (pack_v), else nullptr
  float* xt = nullptr;                  // [max(DK, DV), L]: a product formed transposed (Xᵀ, scᵀ)
};

// Shared by every thread of a call.
struct Ctx {
  const Problem& p;
  int64_t Lc, NC, DK, DV;
  float scale;
  bool kern;  // use_kernel_gemm()
  int team;   // threads sharing a head (Plan::size)
};

// The order between a team's chunks of one head: forward, "C_j is final" (published j once the
// chain step of chunk j − 1 is done); reverse, "dC_j is final" (published NC − j + 1). Values
// grow monotonically over the team's heads (seq), so nothing is ever reset.
class Chain {
 public:
  explicit Chain(int64_t NC) : stride_(NC + 2) {}
  void wait(int64_t seq, int64_t count) { wait_for(fwd_, seq * stride_ + count); }
  void publish(int64_t seq, int64_t count) { publish_to(fwd_, seq * stride_ + count); }
  void wait_reverse(int64_t seq, int64_t count) { wait_for(rev_, seq * stride_ + count); }
  void publish_reverse(int64_t seq, int64_t count) { publish_to(rev_, seq * stride_ + count); }

 private:
  static void wait_for(std::atomic<int64_t>& a, int64_t target) {
    if (a.load(std::memory_order_acquire) >= target) return;
    TESSERA_TRACE_SCOPE("mlstm.cpu.chain_wait");
    for (int64_t v; (v = a.load(std::memory_order_acquire)) < target;) a.wait(v, std::memory_order_acquire);
  }
  static void publish_to(std::atomic<int64_t>& a, int64_t value) {
    a.store(value, std::memory_order_release);
    a.notify_all();
  }
  int64_t stride_;
  std::atomic<int64_t> fwd_{0}, rev_{0};
};

// One chunk of one head, seen by the thread that computes it.
struct ChunkRef {
  const Ctx& cx;
  HeadBufs& hb;
  ThreadBufs& tb;
  int64_t b, bh, j, start, L;
  int64_t y0, ny;  // the columns of v, C and h this thread computes (a forward split by columns; else 0, DV)
  const float* q() const { return cx.p.q + (bh * cx.p.S + start) * cx.DK; }
  const float* k() const { return cx.p.k + (bh * cx.p.S + start) * cx.DK; }
  const float* v() const { return cx.p.v + (bh * cx.p.S + start) * cx.DV; }
  const float* gi() const { return cx.p.i + bh * cx.p.S + start; }
  const float* gf() const { return cx.p.f + bh * cx.p.S + start; }
  float* C(int64_t jj) const { return hb.C + (hb.in_place ? 0 : jj) * cx.DK * ny; }  // [DK, ny]
  float* n(int64_t jj) const { return hb.n + (hb.in_place ? 0 : jj) * cx.DK; }
  int64_t last() const { return start + L - 1; }
};

// The chunk's gate sums from its own gates: cum, g without m_j, max_s D_ts, segments.
void chunk_gates(const ChunkRef& c) {
  const Problem& p = c.cx.p;
  HeadBufs& h = c.hb;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  int32_t seg = 0;
  bool has_state = true, erased = false;  // erased: the segment began at a forgets_all step
  double acc = 0.0, seg_base = 0.0, best = -kInf;  // max_{s in seg} i_s − cum_s
  for (int64_t t = 0; t < c.L; ++t) {
    const int64_t g = c.start + t;
    const bool cut = forgets_all(c.gf()[t]);
    if (cut || p.reset_at(c.b, g)) seg = int32_t(t), has_state = false, erased = cut, seg_base = acc, best = -kInf;
    if (!cut) acc += logsigmoid(c.gf()[t]);
    best = std::max(best, double(c.gi()[t]) - acc);
    h.cum[g] = acc, h.seg[g] = seg, h.hs[g] = has_state;
    h.gl[g] = has_state ? acc : erased ? -kInf : acc - seg_base;
    h.lmax[g] = acc + best;
  }
}

// m_t and w_t = e^{g_t − m_t} of the chunk's steps, from m_j.
void chunk_stabilizers(const ChunkRef& c) {
  const HeadBufs& h = c.hb;
  const double mj = h.m[c.j];
  for (int64_t t = 0; t < c.L; ++t) {
    const int64_t g = c.start + t;
    const double gt = h.gl[g] + (h.hs[g] ? mj : 0.0);
    c.tb.mt[t] = std::max(gt, h.lmax[g]);
    c.tb.w[t] = h.hs[g] ? float(std::exp(gt - c.tb.mt[t])) : 0.f;
  }
}

// E_ts = e^{D_ts − m_t} on t's segment, 0 elsewhere (so products with E are masked).
void chunk_decay(const ChunkRef& c) {
  const HeadBufs& h = c.hb;
  const int64_t L = c.L, s0 = c.start;
  for (int64_t t = 0; t < L; ++t) {
    float* row = c.tb.E + t * L;
    const double a = h.cum[s0 + t] - c.tb.mt[t];
    const int64_t lo = h.seg[s0 + t];
    std::fill(row, row + lo, 0.f);
    for (int64_t s = lo; s <= t; ++s) row[s] = std::exp(float(a + double(c.gi()[s]) - h.cum[s0 + s]));
    std::fill(row + t + 1, row + L, 0.f);
  }
}

// Ka_s = A_s k_s (A_s = e^{D_last,s − mloc}) into the thread's scratch (returned) and
// Δn_j = Kᵀ A = Σ_s Ka_s into n1.
const float* chunk_state_operand(const ChunkRef& c, float* n1) {
  const HeadBufs& h = c.hb;
  const int64_t L = c.L, DK = c.cx.DK, g = c.last();
  const double a = h.cum[g] - h.lmax[g];
  float* ka = c.tb.sc;
  std::fill(n1, n1 + DK, 0.f);
  for (int64_t s = 0; s < L; ++s) {
    const float A = s >= h.seg[g] ? std::exp(float(a + double(c.gi()[s]) - h.cum[c.start + s])) : 0.f;
    const float* ks = c.k() + s * DK;
    for (int64_t x = 0; x < DK; ++x) ka[s * DK + x] = A * ks[x], n1[x] += ka[s * DK + x];
  }
  return ka;
}

// V's columns y0 .. y0 + ny of the chunk packed into pk, unless pk holds them already (the fused
// pass's state product and P·V share one pack; every other use of pk clears pk_v).
void pack_v(const ChunkRef& c) {
  if (c.tb.pk_v == c.v() + c.y0) return;
  f32::pack(false, c.L, c.ny, c.v() + c.y0, c.cx.DV, c.tb.pk);
  c.tb.pk_v = c.v() + c.y0;
}

// pk taken for another operand.
float* pk_other(const ChunkRef& c) {
  c.tb.pk_v = nullptr;
  return c.tb.pk;
}

// ΔC_j = Kᵀ diag(A) V, Δn_j = Kᵀ A into C1, n1.
void chunk_state_local(const ChunkRef& c, float* C1, float* n1) {
  const float* ka = chunk_state_operand(c, n1);
  if (c.cx.kern) {
    pack_v(c);
    f32::gemm(f32::Tri::kNone, true, c.cx.DK, c.ny, c.L, 1.f, ka, c.cx.DK, c.tb.pk, 0.f, C1, c.ny);
    return;
  }
  sgemm(true, false, c.cx.DK, c.ny, c.L, 1.f, ka, c.cx.DK, c.v() + c.y0, c.cx.DV, 0.f, C1, c.ny);
}

void initial_state(const ChunkRef& c) {
  const Problem& p = c.cx.p;
  const int64_t DK = c.cx.DK, DV = c.cx.DV;
  if (p.c0) {
    for (int64_t x = 0; x < DK; ++x) std::copy_n(p.c0 + (c.bh * DK + x) * DV + c.y0, c.ny, c.C(0) + x * c.ny);
    std::copy_n(p.n0 + c.bh * DK, DK, c.n(0));
  } else {
    std::fill_n(c.C(0), DK * c.ny, 0.f), std::fill_n(c.n(0), DK, 0.f);
  }
  c.hb.m[0] = p.c0 ? double(p.m0[c.bh]) : 0.0;
}

// The chain step's factors (C_{j+1} = a C_j + b ΔC_j; a = 0 after a reset); sets m_{j+1}.
struct StepFactors {
  float a, b;
};
StepFactors chain_factors(const ChunkRef& c) {
  HeadBufs& h = c.hb;
  const int64_t g = c.last();
  const double gt = h.gl[g] + (h.hs[g] ? h.m[c.j] : 0.0), m1 = std::max(gt, h.lmax[g]);
  h.m[c.j + 1] = m1;
  return {h.hs[g] ? float(std::exp(gt - m1)) : 0.f, float(std::exp(h.lmax[g] - m1))};
}

// The forward's state update in place (one thread owns the state, or its columns): C = a C, then
// the sgemm adds b ΔC_j to it — no ΔC_j buffer and no zeroing pass; n likewise.
void chunk_state_in_place(const ChunkRef& c) {
  const int64_t DK = c.cx.DK, N = DK * c.ny;
  const float* ka = chunk_state_operand(c, c.tb.dn);
  const StepFactors f = chain_factors(c);
  float *C = c.C(c.j), *n = c.n(c.j);
  if (c.cx.kern) {  // C = b Kaᵀ V + a C in the kernel's store (V packed by chunk_output)
    f32::gemm(f32::Tri::kNone, true, DK, c.ny, c.L, f.b, ka, DK, c.tb.pk, f.a, C, c.ny);
    for (int64_t x = 0; x < DK; ++x) n[x] = f.b * c.tb.dn[x] + (f.a != 0.f ? f.a * n[x] : 0.f);
    return;
  }
  if (f.a != 0.f)
    for (int64_t e = 0; e < N; ++e) C[e] *= f.a;
  sgemm(true, false, DK, c.ny, c.L, f.b, ka, DK, c.v() + c.y0, c.cx.DV, f.a != 0.f ? 1.f : 0.f, C, c.ny);
  for (int64_t x = 0; x < DK; ++x) n[x] = f.b * c.tb.dn[x] + (f.a != 0.f ? f.a * n[x] : 0.f);
}

// The chain steps' element loops on the micro-kernel route (the CPU has AVX-512F or AVX2 + FMA:
// cx.kern). The library is built for baseline x86-64, where std::fma is a call into libm per
// element and the plain loops run 4 lanes wide; v0.4's forward chain step alone was ~13 % of a
// fused call's time in those calls (perf, v0.5). Both widths give the same bits (one fma per element).
#if defined(__x86_64__)
// out = fma(a, x, b·y) (the in-place update's micro-kernel store: chunk_state_in_place).
__attribute__((target("avx512f"))) void fma_axpby_avx512(int64_t n, float a, const float* x, float b, const float* y,
                                                         float* out) {
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  int64_t e = 0;
  for (; e + 16 <= n; e += 16)
    _mm512_storeu_ps(out + e, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + e), _mm512_mul_ps(vb, _mm512_loadu_ps(y + e))));
  for (; e < n; ++e) out[e] = std::fma(a, x[e], b * y[e]);
}
__attribute__((target("avx2,fma"))) void fma_axpby_avx2(int64_t n, float a, const float* x, float b, const float* y,
                                                        float* out) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  int64_t e = 0;
  for (; e + 8 <= n; e += 8)
    _mm256_storeu_ps(out + e, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + e), _mm256_mul_ps(vb, _mm256_loadu_ps(y + e))));
  for (; e < n; ++e) out[e] = std::fma(a, x[e], b * y[e]);
}
// y = fma(a, x, y): one rounding (GCC contracts a product and a sum in AVX-512 code anyway, so
// it is written as it runs); the plain loop of baseline x86-64 rounds twice.
__attribute__((target("avx512f"))) void axpy_avx512(int64_t n, float a, const float* x, float* y) {
  const __m512 va = _mm512_set1_ps(a);
  int64_t e = 0;
  for (; e + 16 <= n; e += 16)
    _mm512_storeu_ps(y + e, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + e), _mm512_loadu_ps(y + e)));
  for (; e < n; ++e) y[e] = std::fma(a, x[e], y[e]);
}
__attribute__((target("avx2,fma"))) void axpy_avx2(int64_t n, float a, const float* x, float* y) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t e = 0;
  for (; e + 8 <= n; e += 8)
    _mm256_storeu_ps(y + e, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + e), _mm256_loadu_ps(y + e)));
  for (; e < n; ++e) y[e] = std::fma(a, x[e], y[e]);
}
#endif

// out = fma(a, x, b·y) on the kernel's route (the widest the CPU has).
void fma_axpby(int64_t n, float a, const float* x, float b, const float* y, float* out) {
#if defined(__x86_64__)
  if (f32::isa() == f32::Isa::kAvx512) return fma_axpby_avx512(n, a, x, b, y, out);
  if (f32::isa() == f32::Isa::kAvx2) return fma_axpby_avx2(n, a, x, b, y, out);
#endif
  for (int64_t e = 0; e < n; ++e) out[e] = std::fma(a, x[e], b * y[e]);
}

// y += a·x on the kernel's route (AVX-512 or AVX2, fma: the same bits for every thread count, the
// last bit apart from the plain loop's) or the plain loop.
void axpy(bool kern, int64_t n, float a, const float* x, float* y) {
#if defined(__x86_64__)
  if (kern && f32::isa() == f32::Isa::kAvx512) return axpy_avx512(n, a, x, y);
  if (kern && f32::isa() == f32::Isa::kAvx2) return axpy_avx2(n, a, x, y);
#endif
  (void)kern;
  for (int64_t e = 0; e < n; ++e) y[e] += a * x[e];
}

// The chain step: C_{j+1} = a C_j + b ΔC_j, n likewise, m_{j+1}; C_j final.
void chunk_state_chain(const ChunkRef& c, const float* dC, const float* dn) {
  const int64_t DK = c.cx.DK, N = DK * c.ny;
  const StepFactors f = chain_factors(c);
  const float a = f.a, b = f.b;
  float *C1 = c.C(c.j + 1), *n1 = c.n(c.j + 1);  // C_j's slot itself when in place
  const float *C0 = c.C(c.j), *n0 = c.n(c.j);
  if (a != 0.f && c.cx.kern) {  // rounded as chunk_state_in_place's micro-kernel store: fma(a, C, b·ΔC)
    fma_axpby(N, a, C0, b, dC, C1);
    for (int64_t x = 0; x < DK; ++x) n1[x] = b * dn[x] + a * n0[x];
  } else if (a != 0.f) {
    for (int64_t e = 0; e < N; ++e) C1[e] = b * dC[e] + a * C0[e];
    for (int64_t x = 0; x < DK; ++x) n1[x] = b * dn[x] + a * n0[x];
  } else {
    for (int64_t e = 0; e < N; ++e) C1[e] = b * dC[e];
    for (int64_t x = 0; x < DK; ++x) n1[x] = b * dn[x];
  }
}

// The chain step and the chunk's own part in one product, for a thread that owns the head (a team
// of one): C_{j+1} = a C_j + b Kᵀdiag(A)V through gemm_from's store, fma(a, C_j, b·acc) — the
// same bits as chunk_state_local then chunk_state_chain (b·ΔC_j with ΔC_j = acc rounds the same),
// without writing ΔC_j and reading it back (v0.5: 2 × 256 KiB less state traffic per chunk at D =
// 256).
void chunk_state_folded(const ChunkRef& c) {
  TESSERA_TRACE_SCOPE("mlstm.cpu.state_folded");
  const int64_t DK = c.cx.DK;
  const float* ka = chunk_state_operand(c, c.tb.dn);
  const StepFactors f = chain_factors(c);
  pack_v(c);
  f32::gemm_from(f32::Tri::kNone, true, DK, c.ny, c.L, f.b, ka, DK, c.tb.pk, f.a, c.C(c.j), c.ny, c.C(c.j + 1), c.ny);
  float *n1 = c.n(c.j + 1), *dn = c.tb.dn;
  const float* n0 = c.n(c.j);
  for (int64_t x = 0; x < DK; ++x) n1[x] = f.a != 0.f ? f.b * dn[x] + f.a * n0[x] : f.b * dn[x];
}

// The fused pass's copy of a chunk's E, P, w, den, den_raw, qn and m_t (HeadBufs::saved): stored by
// the forward right after chunk_scores, read back by the reverse instead of forming them again.
void saved_chunk(const ChunkRef& c, bool store) {
  const int64_t L = c.L, Lc = c.cx.Lc;
  float* f = c.hb.saved + c.j * (2 * Lc * Lc + 5 * Lc);
  double* mt = c.hb.saved_mt + c.j * Lc;
  ThreadBufs& tb = c.tb;
  float* parts[] = {tb.E, tb.P, tb.w, tb.den, tb.den_raw, tb.qn};
  const int64_t sizes[] = {L * L, L * L, L, L, L, L};
  for (int e = 0; e < 6; f += sizes[e], ++e) store ? std::copy_n(parts[e], sizes[e], f) : std::copy_n(f, sizes[e], parts[e]);
  store ? std::copy_n(tb.mt, L, mt) : std::copy_n(mt, L, tb.mt);
}

// P = (q̂_t·k_s) ∘ E and the denominators; needs E, w, C_j's n_j.
void chunk_scores(const ChunkRef& c) {
  const int64_t L = c.L, DK = c.cx.DK;
  ThreadBufs& tb = c.tb;
  tri_abt(L, DK, c.cx.scale, c.q(), DK, c.k(), DK, tb.P);
  const float* nj = c.n(c.j);
  for (int64_t t = 0; t < L; ++t) {
    float* row = tb.P + t * L;
    const float* e = tb.E + t * L;
    for (int64_t s = 0; s < L; ++s) row[s] *= e[s];
    const float sum = dot(row, tb.ones, L);
    tb.qn[t] = tb.w[t] != 0.f ? c.cx.scale * dot(c.q() + t * DK, nj, DK) : 0.f;
    tb.den_raw[t] = sum + tb.w[t] * tb.qn[t];
    tb.den[t] = std::max(std::fabs(tb.den_raw[t]), den_floor(tb.mt[t])) + float(c.cx.p.eps);
  }
}

bool any_nonzero(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (x[i] != 0.f) return true;
  return false;
}

// The chunk enters with the zero state (the first chunk without an initial state): its products
// with C_j are 0 and are not issued.
bool zero_state(const ChunkRef& c) { return c.j == 0 && !c.cx.p.c0; }

// h of the chunk (its columns y0 .. y0 + ny), from C_j: (P V + diag(w) Q̂ C_j) / den.
void chunk_output(const ChunkRef& c, float* h) {
  TESSERA_TRACE_SCOPE("mlstm.cpu.chunk_output");
  const int64_t L = c.L, DK = c.cx.DK, DV = c.cx.DV;
  ThreadBufs& tb = c.tb;
  chunk_stabilizers(c);
  chunk_decay(c);
  chunk_scores(c);
  if (c.hb.saved) saved_chunk(c, true);
  for (int64_t t = 0; t < L; ++t) {  // 1/den folded into the rows of both products
    const float r = 1.f / tb.den[t], rq = tb.w[t] * c.cx.scale * r;
    for (int64_t s = 0; s < L; ++s) tb.P[t * L + s] *= r;
    for (int64_t x = 0; x < DK; ++x) tb.sc[t * DK + x] = rq * c.q()[t * DK + x];
  }
  const bool inter = !zero_state(c) && any_nonzero(tb.w, L);
  if (!c.cx.kern) {
    tri_tb(L, c.ny, 1.f, tb.P, c.v() + c.y0, DV, 0.f, h + c.y0, DV);
    if (inter) sgemm(false, false, L, c.ny, DK, 1.f, tb.sc, DK, c.C(c.j), c.ny, 1.f, h + c.y0, DV);
    return;
  }
  // V packed once for P·V and the state update after it (chunk_state_in_place); C_j packed.
  pack_v(c);
  f32::gemm(f32::Tri::kLowerA, false, L, c.ny, L, 1.f, tb.P, L, tb.pk, 0.f, h + c.y0, DV);
  if (!inter) return;
  f32::pack(false, DK, c.ny, c.C(c.j), c.ny, tb.pk2);
  f32::gemm(f32::Tri::kNone, false, L, c.ny, DK, 1.f, tb.sc, DK, tb.pk2, 1.f, h + c.y0, DV);
}

// The forward on one thread per head (or per part of its columns), chunk by chunk with one state
// updated in place; each column's arithmetic is the same whatever the parts, so the bits do not
// depend on the threads.
void sequential_chunk(const ChunkRef& c, float* h, bool need_last) {
  chunk_gates(c);
  if (c.j == 0) initial_state(c);
  chunk_output(c, h);
  if (c.j + 1 == c.cx.NC && !need_last) return;  // the last state only for return_last_states
  chunk_state_in_place(c);
}

// The backward's forward sweep for one chunk: ΔC_j at once, then the chain step after chunk j − 1's.
// The last state C_NC is needed only for the upstream gradients of the last state (⟨dC_last, C_last⟩):
// without them the last chunk computes its gates only.
void sweep_chunk(const ChunkRef& c, Chain& chain, int64_t seq, bool need_last) {
  chunk_gates(c);
  if (c.j + 1 == c.cx.NC && !need_last) {
    if (c.j == 0)
      initial_state(c);
    else
      chain.wait(seq, c.j);  // the published counts only grow
    chain.publish(seq, c.j + 1);
    return;
  }
  if (c.cx.kern && c.cx.team == 1) {  // nobody to overlap with: the chain step inside the product
    if (c.j == 0)
      initial_state(c);
    else
      chain.wait(seq, c.j);  // returns at once: the team's one member published chunk j − 1
    chunk_state_folded(c);
    chain.publish(seq, c.j + 1);
    return;
  }
  {
    TESSERA_TRACE_SCOPE("mlstm.cpu.state_local");
    chunk_state_local(c, c.C(c.j + 1), c.n(c.j + 1));
  }
  if (c.j == 0)
    initial_state(c);
  else
    chain.wait(seq, c.j);
  chunk_state_chain(c, c.C(c.j + 1), c.n(c.j + 1));
  chain.publish(seq, c.j + 1);
}

struct GradOut {
  float *dq, *dk, *dv;
};

// Y [L × N] = A [L × K] · Bᵀ (B [N × K], both row-major) on the micro-kernel: Yᵀ = B·Aᵀ with Aᵀ
// packed (L columns: small), then Y = (Yᵀ)ᵀ — B itself (a chunk state, N × K = DK × DV) is read in
// place instead of being packed transposed (devlog v0.4: 80 against OpenBLAS's 90 µs at D = 256).
void abt_via_transpose(const ChunkRef& c, int64_t L, int64_t N, int64_t K, const float* A, const float* B, float* Y) {
  f32::pack(true, K, L, A, K, pk_other(c));
  f32::gemm(f32::Tri::kNone, false, N, L, K, 1.f, B, K, c.tb.pk, 0.f, c.tb.xt, L);
  f32::transpose(N, L, c.tb.xt, L, Y, N);
}

// From dP (dnum_t·v_s) and X (C_j dnum_t, in dq's rows when `inter`): the denominator's gradient
// ddr, dS = (dP + ddr)∘E in dP's place, dq's inter part, and the gate terms of the intra-chunk
// products (row and column sums of dD = (dP + ddr)∘P) into dcum (q̂_t·dq̂_t) and di (k_s·dk_s).
void chunk_dscores(const ChunkRef& c, bool inter, float* dq, float* di, float* dcum) {
  const int64_t L = c.L, DK = c.cx.DK;
  const float scale = c.cx.scale, *nj = c.n(c.j);
  ThreadBufs& tb = c.tb;
  std::fill(tb.cs, tb.cs + L, 0.f);
  for (int64_t t = 0; t < L; ++t) {
    const float w = tb.w[t];
    float* X = dq + t * DK;
    const float qx = w != 0.f ? scale * dot(c.q() + t * DK, X, DK) : 0.f;  // q̂_t·X_t
    const float r = dot(tb.P + t * L, tb.dP + t * L, L) + w * qx;  // dnum_t·num_t
    const bool live = std::fabs(tb.den_raw[t]) > den_floor(tb.mt[t]);
    const float dden = -r / tb.den[t], ddr = live ? (tb.den_raw[t] > 0 ? dden : -dden) : 0.f;
    float* d = tb.dP + t * L;
    const float* P = tb.P + t * L;
    float rs = 0.f;  // dD_ts = d_ts P_ts (d = dP + ddr): its row sum is q̂_t·dq̂_t, its column sum k_s·dk_s
    for (int64_t s = 0; s < L; ++s) {
      d[s] += ddr;
      const float dd = d[s] * P[s];
      rs += dd, tb.cs[s] += dd;
      d[s] *= tb.E[t * L + s];  // dS
    }
    dcum[t] = rs + w * (qx + ddr * tb.qn[t]);  // q̂_t·dq̂_t, the inter term's part with it
    tb.ddr[t] = ddr;
    const float sw = scale * w;  // dq_t = scale (w_t (X_t + ddr_t n_j) + Σ_s dS_ts k_s), the sum below
    if (w != 0.f)
      for (int64_t x = 0; x < DK; ++x) X[x] = sw * (X[x] + ddr * nj[x]);
    else if (inter)
      std::fill(X, X + DK, 0.f);
  }
  std::copy(tb.cs, tb.cs + L, di);
}

// The chunk's gradients that need only C_j (intra-chunk, inter-chunk through C_j, n_j), and its
// own part of dC_j, dn_j written over C_j, n_j.
void chunk_backward_local(const ChunkRef& c, const float* dh, const GradOut& g, float* di, float* dcum) {
  TESSERA_TRACE_SCOPE("mlstm.cpu.backward_local");
  const int64_t L = c.L, DK = c.cx.DK, DV = c.cx.DV;
  const float scale = c.cx.scale;
  ThreadBufs& tb = c.tb;
  if (c.hb.saved) {
    saved_chunk(c, false);
  } else {
    chunk_stabilizers(c);
    chunk_decay(c);
    chunk_scores(c);
  }
  for (int64_t t = 0; t < L; ++t) {
    const float r = 1.f / tb.den[t];
    for (int64_t y = 0; y < DV; ++y) tb.dnum[t * DV + y] = dh[t * DV + y] * r;
  }
  tri_abt(L, DV, 1.f, tb.dnum, DV, c.v(), DV, tb.dP);  // dnum_t·v_s
  const bool inter = any_nonzero(tb.w, L);
  float *Cj = c.C(c.j), *nj = c.n(c.j);
  if (inter) {  // X_t = C_j dnum_t (0 for the zero state: K = 0 writes the zeros)
    const int64_t K = zero_state(c) ? 0 : DV;
    if (c.cx.kern && K > 0)
      abt_via_transpose(c, L, DK, DV, tb.dnum, Cj, g.dq);
    else
      sgemm(false, true, L, DK, K, 1.f, tb.dnum, DV, Cj, DV, 0.f, g.dq, DK);
  }
  chunk_dscores(c, inter, g.dq, di, dcum);
  tri_tb(L, DK, scale, tb.dP, c.k(), DK, inter ? 1.f : 0.f, g.dq, DK);
  tri_ttb(L, DK, scale, tb.dP, c.q(), DK, 0.f, g.dk, DK);
  if (c.cx.kern) {  // dNum packed once for Pᵀ·dNum and dC_j below
    f32::pack(false, L, DV, tb.dnum, DV, pk_other(c));
    f32::gemm(f32::Tri::kUpperA, true, L, DV, L, 1.f, tb.P, L, tb.pk, 0.f, g.dv, DV);
  } else {
    tri_ttb(L, DV, 1.f, tb.P, tb.dnum, DV, 0.f, g.dv, DV);
  }
  // Own part of dC_j = Q̂ᵀ diag(w) dNum, dn_j = Σ_t w_t ddr_t q̂_t (C_j, n_j are not needed again).
  // The zero state's (the first chunk without an initial state) is not needed at all: no dc0.
  // The micro-kernel's route forms it together with the chain step, once dC_{j+1} is final
  // (chunk_grad_state_folded).
  if (zero_state(c) || c.cx.kern) return;
  std::fill(nj, nj + DK, 0.f);
  if (!inter) {
    std::fill(Cj, Cj + DK * DV, 0.f);
    return;
  }
  for (int64_t t = 0; t < L; ++t) {
    const float w = tb.w[t], wd = scale * w * tb.ddr[t];
    for (int64_t y = 0; y < DV; ++y) tb.dnum[t * DV + y] *= w;
    for (int64_t x = 0; x < DK; ++x) nj[x] += wd * c.q()[t * DK + x];
  }
  sgemm(true, false, DK, DV, L, scale, c.q(), DK, tb.dnum, DV, 0.f, Cj, DV);
}

// The micro-kernel's route (v0.5): dC_j = scale (diag(w) Q̂)ᵀ dNum + a_j dC_{j+1} in one product
// (gemm_from's store, fma(a_j, dC_{j+1}, scale·acc)) written over C_j, dn_j = Σ_t w_t ddr_t q̂_t +
// a_j dn_{j+1}; dNum still packed in pk by chunk_backward_local. v0.4 wrote the own part, then read
// it back with dC_{j+1} for the chain step (2 × 256 KiB more state traffic per chunk at D = 256).
// Needs dC_{j+1} final, for every team size alike, so that the bits do not depend on the threads.
void chunk_grad_state_folded(const ChunkRef& c) {
  TESSERA_TRACE_SCOPE("mlstm.cpu.grad_state_folded");
  if (zero_state(c)) return;  // no dc0: the zero state's gradient is not needed
  const int64_t L = c.L, DK = c.cx.DK, DV = c.cx.DV;
  const float scale = c.cx.scale, a = c.tb.w[L - 1];
  ThreadBufs& tb = c.tb;
  float *Cj = c.C(c.j), *nj = c.n(c.j);
  std::fill(nj, nj + DK, 0.f);
  if (!any_nonzero(tb.w, L)) {  // no step reads C_j (then a_j = 0 too)
    std::fill(Cj, Cj + DK * DV, 0.f);
    return;
  }
  for (int64_t t = 0; t < L; ++t) {  // w folded into a copy of the queries
    const float w = tb.w[t], wd = scale * w * tb.ddr[t];
    for (int64_t x = 0; x < DK; ++x) tb.sc[t * DK + x] = w * c.q()[t * DK + x], nj[x] += wd * c.q()[t * DK + x];
  }
  f32::gemm_from(f32::Tri::kNone, true, DK, DV, L, scale, tb.sc, DK, tb.pk, a, c.C(c.j + 1), DV, Cj, DV);
  if (a != 0.f) axpy(true, DK, a, c.n(c.j + 1), nj);
}

// The reverse chain step: dC_j += a_j dC_{j+1} (a_j = w at the chunk's last step).
void chunk_grad_chain(const ChunkRef& c) {
  const float a = c.tb.w[c.L - 1];
  if (a == 0.f || zero_state(c)) return;  // the zero state's gradient is not needed (no dc0)
  const int64_t DK = c.cx.DK, N = DK * c.cx.DV;
  float *C0 = c.C(c.j), *n0 = c.n(c.j);
  const float *C1 = c.C(c.j + 1), *n1 = c.n(c.j + 1);
  axpy(c.cx.kern, N, a, C1, C0);
  axpy(c.cx.kern, DK, a, n1, n0);
}

// Through the state at the chunk's end, C_{j+1} = a C_j + Σ_s A_s k_s v_sᵀ (A_s = E_{last,s}):
// dk_s += A_s (dC_{j+1} v_s + dn_{j+1}), dv_s += A_s dC_{j+1}ᵀ k_s. Then the gate terms.
void chunk_backward_state(const ChunkRef& c, const GradOut& g, float* di, float* dcum) {
  TESSERA_TRACE_SCOPE("mlstm.cpu.backward_state");
  const int64_t L = c.L, DK = c.cx.DK, DV = c.cx.DV;
  ThreadBufs& tb = c.tb;
  const float* A = tb.E + (L - 1) * L;
  const float *dC = c.C(c.j + 1), *dn = c.n(c.j + 1);
  if (any_nonzero(A, L) && (any_nonzero(dn, DK) || any_nonzero(dC, DK * DV))) {
    if (c.cx.kern)  // dC_{j+1} v_s
      abt_via_transpose(c, L, DK, DV, c.v(), dC, tb.sc);
    else
      sgemm(false, true, L, DK, DV, 1.f, c.v(), DV, dC, DV, 0.f, tb.sc, DK);
    for (int64_t s = 0; s < L; ++s) {
      float* u = tb.sc + s * DK;
      for (int64_t x = 0; x < DK; ++x) u[x] += dn[x], g.dk[s * DK + x] += A[s] * u[x];
      const float kd = A[s] * dot(c.k() + s * DK, u, DK);  // the state's part of k_s·dk_s
      di[s] += kd;
      for (int64_t x = 0; x < DK; ++x) u[x] = A[s] * c.k()[s * DK + x];
    }
    if (c.cx.kern) {
      f32::pack(false, DK, DV, dC, DV, tb.pk2);
      f32::gemm(f32::Tri::kNone, false, L, DV, DK, 1.f, tb.sc, DK, tb.pk2, 1.f, g.dv, DV);
    } else {
      sgemm(false, false, L, DV, DK, 1.f, tb.sc, DK, dC, DV, 1.f, g.dv, DV);
    }
  }
  for (int64_t t = 0; t < L; ++t) dcum[t] -= di[t];  // q̂_t·dq̂_t − k_t·dk_t
}

// The top of the reverse chain: dot_last for the gates, then dC_NC = dc_last, dn_NC = dn_last.
void grad_top(const ChunkRef& c, const BackwardArgs& a) {
  const int64_t DK = c.cx.DK, DV = c.cx.DV, NC = c.cx.NC;
  float *C = c.C(NC), *n = c.n(NC);
  c.hb.dot_last = 0.0;
  if (a.dc_last) c.hb.dot_last += dot(a.dc_last + c.bh * DK * DV, C, DK * DV);
  if (a.dn_last) c.hb.dot_last += dot(a.dn_last + c.bh * DK, n, DK);
  if (a.dc_last) std::copy_n(a.dc_last + c.bh * DK * DV, DK * DV, C); else std::fill_n(C, DK * DV, 0.f);
  if (a.dn_last) std::copy_n(a.dn_last + c.bh * DK, DK, n); else std::fill_n(n, DK, 0.f);
}

// df from the per-step dcum (held in df): suffix sums within each segment, × σ(−f).
void gate_suffix(const Ctx& cx, int64_t b, int64_t bh, double dot_last, const BackwardArgs& a) {
  const Problem& p = cx.p;
  float* df = a.df + bh * p.S;
  double acc = dot_last;
  for (int64_t t = p.S - 1; t >= 0; --t) {
    acc += df[t];
    const float f = p.f[bh * p.S + t];
    // logsigmoid(f_t) multiplies a zero state, or the state it erases (F = 0: nothing flows back)
    const bool zero_start = p.reset_at(b, t) || (t == 0 && !p.c0) || forgets_all(f);
    df[t] = zero_start ? 0.f : float(acc / (1.0 + std::exp(double(f))));  // σ(−f)
    if (p.reset_at(b, t) || forgets_all(f)) acc = 0.0;
  }
}

// The forward: items (head, column part) over the threads. The backward: threads in teams; a team
// shares one head at a time (its chunks round-robin), the teams take heads in turn. Teams of one thread (independent heads: no hand-over between threads, each
// thread's states in its own cache) when the heads divide evenly over the threads, or are many,
// and their states fit kStateBudget; otherwise teams large enough that a member gets about four
// chunks, fewer teams when the heads are few. Extra memory: each team's HeadBufs (C_j for every
// chunk of one head) and each thread's ThreadBufs.
constexpr double kStateBudget = 48.0 * 1024 * 1024;  // S = 8192, D = 256, 2 threads: 64.5 MiB, one team

// The fused pass keeps each chunk's forward quantities (HeadBufs::saved) while the whole call's
// take at most this; past it the reverse forms them again, as the backward alone does (the same
// bits). S·(2L + 5)·4 + 8S bytes per team: 35 MiB at S = 65,536, L = 64; 540 MiB at L = 1024.
constexpr double kSavedBudget = 256.0 * 1024 * 1024;

double saved_bytes(int64_t NC, int64_t Lc) { return double(NC) * double(2 * Lc * Lc + 5 * Lc) * 4.0 + double(NC * Lc) * 8.0; }

struct Plan {
  int size = 1, teams = 1;
  int64_t parts = 1;  // the forward: each head's columns of v (and C, h) in parts, one thread each,
                      // no hand-over (the state's columns evolve apart)
};

Plan plan_of(const Problem& p, int64_t NC, bool reverse) {
  const int64_t T = std::max(1, p.num_threads), heads = p.B * p.NH;
  const double head_bytes = double(NC + 1) * double(p.DK * p.DV + p.DK) * 4.0;
  Plan pl;
  if (!reverse) {  // one thread per (head, column part): parts so that the items divide over the threads
    pl.parts = heads >= 4 * T ? 1 : std::clamp<int64_t>(T / std::gcd(heads, T), 1, std::max<int64_t>(1, p.DV / 4));
    pl.teams = int(std::min(T, heads * pl.parts));
    return pl;
  }
  int64_t size = std::clamp<int64_t>(NC / 4, 1, T);
  if ((heads % T == 0 || heads >= 4 * T) && double(T) * head_bytes <= kStateBudget) size = 1;
  const int64_t teams = std::min(heads, std::max<int64_t>(1, T / size));
  if (teams * size < T) size = std::clamp<int64_t>(T / teams, 1, std::max<int64_t>(NC, 1));
  pl.size = int(size), pl.teams = int(teams);
  return pl;
}

struct Team {
  HeadBufs hb;
  Chain chain;
  std::barrier<> sync;
  Team(int64_t NC, int size) : chain(NC), sync(size) {}
};

// For each head: `fwd` over its chunks in order, then (with `rev`) `rev` over them in reverse and
// `fin` once after every member is done. `fused` (forward_backward): the team waits for every
// member's `fwd` before any `rev` (`fwd` reads C_j after publishing C_{j+1}, and `rev` writes dC_j
// over C_j), and keeps each chunk's forward quantities for `rev` (HeadBufs::saved).
template <class Fwd, class Rev, class Fin>
void run_heads(const Problem& p, Fwd&& fwd, Rev&& rev, Fin&& fin, bool reverse, bool fused = false) {
  const int64_t Lc = std::min(chunk_of(p), p.S), NC = (p.S + Lc - 1) / Lc, DK = p.DK, DV = p.DV;
  const Plan pl = plan_of(p, NC, reverse);
  const Ctx cx{p, Lc, NC, DK, DV, 1.0f / std::sqrt(float(DK)), use_kernel_gemm(), pl.size};
  const int T = pl.size * pl.teams;
  const bool save = fused && double(pl.teams) * saved_bytes(NC, Lc) <= kSavedBudget;
  std::vector<std::unique_ptr<Team>> teams;
  for (int t = 0; t < pl.teams; ++t) teams.push_back(std::make_unique<Team>(NC, pl.size));
  std::vector<ThreadBufs> tbs(T);
  const int64_t slots = !reverse && pl.size == 1 ? 1 : NC + 1;  // a forward on one thread: in place
  auto carve = [&](Arena& ar) {
    for (auto& team : teams) {
      HeadBufs& h = team->hb;
      h.in_place = slots == 1;
      h.C = ar.take<float>(slots * DK * DV), h.n = ar.take<float>(slots * DK);
      h.cum = ar.take<double>(p.S), h.gl = ar.take<double>(p.S), h.lmax = ar.take<double>(p.S);
      h.seg = ar.take<int32_t>(p.S), h.hs = ar.take<uint8_t>(p.S), h.m = ar.take<double>(NC + 1);
      if (save) h.saved = ar.take<float>(NC * (2 * Lc * Lc + 5 * Lc)), h.saved_mt = ar.take<double>(NC * Lc);
    }
    for (ThreadBufs& b : tbs) {
      b.E = ar.take<float>(Lc * Lc), b.P = ar.take<float>(Lc * Lc), b.dP = ar.take<float>(Lc * Lc);
      b.dnum = ar.take<float>(Lc * DV), b.sc = ar.take<float>(Lc * std::max(DK, DV));
      b.mt = ar.take<double>(Lc);
      b.w = ar.take<float>(Lc), b.den = ar.take<float>(Lc), b.den_raw = ar.take<float>(Lc), b.ddr = ar.take<float>(Lc);
      b.qn = ar.take<float>(Lc), b.cs = ar.take<float>(Lc), b.ones = ar.take<float>(Lc);
      b.dn = ar.take<float>(DK);
      if (cx.kern) {
        const int64_t most = std::max({Lc, DK, DV}), n = f32::packed_floats(most, most);  // K × N ≤ most × most
        b.pk = ar.take<float>(n), b.pk2 = ar.take<float>(n), b.xt = ar.take<float>(std::max(DK, DV) * Lc);
      }
    }
  };
  Arena size;
  carve(size);
  const ScratchLease scratch(size.used);
  Arena ar{scratch.base()};
  carve(ar);
  for (auto& team : teams) advise_huge_pages(team->hb.C, slots * DK * DV * int64_t(sizeof(float)));
  for (ThreadBufs& b : tbs) std::fill_n(b.ones, Lc, 1.f);
  // The team members wait for each other (barrier, chain) and allocate nothing (the arena above):
  // noexcept keeps a broken promise a crash rather than members waiting for one that threw.
  cpu_threads::run_threads(T, true, "mlstm cpu", [&](int tid) noexcept {
    Team& team = *teams[tid / pl.size];
    const int rank = tid % pl.size;
    int64_t seq = 0;
    for (int64_t it = tid / pl.size; it < p.B * p.NH * pl.parts; it += pl.teams, ++seq) {
      const int64_t bh = it / pl.parts, part = it % pl.parts, y0 = part * DV / pl.parts;
      const int64_t ny = (part + 1) * DV / pl.parts - y0;
      auto chunk = [&](int64_t j) {
        return ChunkRef{cx, team.hb, tbs[tid], bh / p.NH, bh, j, j * Lc, std::min(Lc, p.S - j * Lc), y0, ny};
      };
      for (int64_t j = rank; j < NC; j += pl.size) fwd(chunk(j), team.chain, seq);
      if (fused && pl.size > 1) team.sync.arrive_and_wait();
      if (reverse)
        for (int64_t j = NC - 1 - rank; j >= 0; j -= pl.size) rev(chunk(j), team.chain, seq);
      {
        TESSERA_TRACE_SCOPE("mlstm.cpu.head_barrier");
        team.sync.arrive_and_wait();  // the head's buffers are free for the next head
      }
      if (reverse && rank == 0) fin(cx, bh / p.NH, bh, team.hb.dot_last);
    }
  });
}

class Cpu final : public Implementation {
 public:
  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return "chunkwise form: sgemms with the decay matrix, chunk states as one axpy chain; threads over chunks "
           "within a head";
  }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU) return Availability::no("the cpu backend runs on host memory");
    if (p.DK > kMaxHeadDim || p.DV > kMaxHeadDim)
      return Availability::no("DHQK and DHV must be <= " + std::to_string(kMaxHeadDim) + " (cpu), got " +
                              std::to_string(p.DK) + " and " + std::to_string(p.DV));
    if (chunk_of(p) > kMaxChunk)
      return Availability::no("chunk_size must be <= " + std::to_string(kMaxChunk) + " (cpu), got " +
                              std::to_string(p.chunk));
    return Availability::yes();
  }

  void forward(const Problem& p, const ForwardOut& out) const override {
    auto fwd = [&](const ChunkRef& c, Chain&, int64_t) {
      sequential_chunk(c, out.h + (c.bh * p.S + c.start) * p.DV, out.c_last != nullptr);
      if (c.j + 1 < c.cx.NC || !out.c_last) return;
      for (int64_t x = 0; x < p.DK; ++x)
        std::copy_n(c.C(c.j + 1) + x * c.ny, c.ny, out.c_last + (c.bh * p.DK + x) * p.DV + c.y0);
      if (c.y0 > 0) return;
      std::copy_n(c.n(c.j + 1), p.DK, out.n_last + c.bh * p.DK);
      out.m_last[c.bh] = float(c.hb.m[c.j + 1]);
    };
    auto none = [](auto&&...) {};
    run_heads(p, fwd, none, none, false);
  }

  void backward(const Problem& p, const BackwardArgs& a) const override {
    const bool need_last = a.dc_last || a.dn_last;
    auto fwd = [&](const ChunkRef& c, Chain& chain, int64_t seq) { sweep_chunk(c, chain, seq, need_last); };
    reverse_pass(p, a, fwd, false);
  }

  // v0.4: the forward and the backward in one pass over the chunk states. The backward's sweep
  // forms every C_j anyway; each chunk's h comes from it right after the chain step, so the
  // forward's state products are not issued twice (a forward call, then a backward call, would).
  // TESSERA_MLSTM_CPU_FUSED=0: the two calls one after the other (v0.3, for side-by-side timing).
  void forward_backward(const Problem& p, const ForwardOut& out, const BackwardArgs& a) const override {
    if (!env::flag("TESSERA_MLSTM_CPU_FUSED", true)) {
      forward(p, out);
      backward(p, a);
      return;
    }
    const bool need_last = out.c_last || a.dc_last || a.dn_last;
    auto fwd = [&](const ChunkRef& c, Chain& chain, int64_t seq) {
      sweep_chunk(c, chain, seq, need_last);  // C_j final, C_{j+1} published
      chunk_output(c, out.h + (c.bh * p.S + c.start) * p.DV);
      if (c.j + 1 < c.cx.NC || !out.c_last) return;
      std::copy_n(c.C(c.j + 1), p.DK * p.DV, out.c_last + c.bh * p.DK * p.DV);
      std::copy_n(c.n(c.j + 1), p.DK, out.n_last + c.bh * p.DK);
      out.m_last[c.bh] = float(c.hb.m[c.j + 1]);
    };
    reverse_pass(p, a, fwd, true);
  }

 private:
  template <class Fwd>
  void reverse_pass(const Problem& p, const BackwardArgs& a, Fwd& fwd, bool fused) const {
    auto rev = [&](const ChunkRef& c, Chain& chain, int64_t seq) {
      const int64_t g0 = c.bh * p.S + c.start, NC = c.cx.NC;
      const GradOut g{a.dq + g0 * p.DK, a.dk + g0 * p.DK, a.dv + g0 * p.DV};
      chain.wait(seq, NC);  // C_j for every chunk (and the last state) is final
      chunk_backward_local(c, a.dh + g0 * p.DV, g, a.di + g0, a.df + g0);
      if (c.j + 1 == NC)
        grad_top(c, a);
      else
        chain.wait_reverse(seq, NC - c.j);  // dC_{j+1} is final
      if (c.cx.kern)
        chunk_grad_state_folded(c);
      else
        chunk_grad_chain(c);
      chain.publish_reverse(seq, NC - c.j + 1);
      if (c.j == 0 && a.dc0) {
        std::copy_n(c.C(0), p.DK * p.DV, a.dc0 + c.bh * p.DK * p.DV);
        std::copy_n(c.n(0), p.DK, a.dn0 + c.bh * p.DK);
      }
      chunk_backward_state(c, g, a.di + g0, a.df + g0);
    };
    auto fin = [&](const Ctx& cx, int64_t b, int64_t bh, double dot_last) { gate_suffix(cx, b, bh, dot_last, a); };
    run_heads(p, fwd, rev, fin, true, fused);
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cpu_implementation() { return std::make_unique<Cpu>(); }

}  // namespace tessera::mlstm
