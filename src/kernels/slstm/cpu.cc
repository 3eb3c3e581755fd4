// slstm CPU backend. Work is split over (batch block, head) tasks on the worker pool; a task
// runs its rows of one head through all S steps:
//   forward, per step: one GEMM G[Bb, 4·DH] = h_{t-1}[Bb, DH] · R_h[DH, 4·DH] (R_h: the head's
//   four recurrent matrices, packed once per call as one f32 matrix, hot in L2 across steps;
//   cpu_simd::gemm_step, which streams it without the per-call packing of a BLAS), then the
//   fused pointwise gates per row (cpu_simd.cc);
//   backward, per step in reverse: the pointwise gate gradients from the stored activations,
//   then dh_{t-1} = dpre[Bb, 4·DH] · R_hᵀ (R_hᵀ packed once as well); at the end
//   dR_h = Σ_t h_{t-1}ᵀ·dpre_t as one sgemm over all steps, summed over batch blocks after the join.
#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "core/trace.h"
#include "kernels/slstm/cpu_simd.h"
#include "kernels/slstm/impl.h"
#include "primitives/cpu_blas.h"
#include "primitives/cpu_convert.h"
#include "primitives/cpu_threads.h"

namespace tessera::slstm {
namespace {

constexpr int64_t kMaxDH = 1024;   // R_h is 16·DH² bytes: 64 MiB at 1024
constexpr int64_t kMaxBlock = 64;  // batch rows per task: the step's GEMM stays in L1/L2
constexpr int64_t kPartialBytes = int64_t(256) << 20;  // the backward's dR / db partials, all tasks

// Batch blocks: enough tasks (block, head) for every thread, blocks of at most batch_block rows
// (tuned), and in the backward the tasks' f32 dR / db partials within kPartialBytes — B = 256,
// NH = 8, DH = 512 at batch_block = 8 held 1 GiB of them: fewer, larger blocks then (the same
// math; dr and db summed over the blocks in another grouping).
int64_t batch_blocks(const Problem& p) {
  const int64_t block = p.batch_block > 0 ? p.batch_block : kMaxBlock;
  const int64_t want = std::max<int64_t>((p.num_threads + p.NH - 1) / p.NH, (p.B + block - 1) / block);
  const int64_t per_block = p.NH * 16 * p.DH * (p.DH + 1);  // bytes of one block's partials, every head
  return std::min({p.B, want, p.backward ? std::max<int64_t>(1, kPartialBytes / per_block) : p.B});
}

void load_f32(const void* base, DType dt, int64_t off, int64_t n, float* dst) {
  if (dt == DType::kF32) {
    std::memcpy(dst, static_cast<const float*>(base) + off, size_t(n) * sizeof(float));
    return;
  }
  cpu_convert::half_to_f32(static_cast<const uint16_t*>(base) + off, dt == DType::kBF16, dst, n);
}

void store_dtype(const float* src, DType dt, void* base, int64_t off, int64_t n) {
  if (dt == DType::kF32)
    std::memcpy(static_cast<float*>(base) + off, src, size_t(n) * sizeof(float));
  else if (dt == DType::kBF16)
    cpu_convert::f32_to_bf16(src, static_cast<uint16_t*>(base) + off, n);
  else
    cpu_convert::f32_to_f16(src, static_cast<uint16_t*>(base) + off, n);
}

// R_h [DH, 4·DH] f32 per head: R_h[j, g·DH + k] = r[g, h, j, k].
std::vector<float> pack_r(const Problem& p) {
  const int64_t DH = p.DH, W = 4 * DH;
  std::vector<float> out(size_t(p.NH * DH * W));
  for (int64_t hd = 0; hd < p.NH; ++hd)
    for (int g = 0; g < 4; ++g)
      for (int64_t j = 0; j < DH; ++j) load_f32(p.r, p.dtype, p.r_at(g, hd, j, 0), DH, &out[size_t((hd * DH + j) * W + g * DH)]);
  return out;
}

// R_hᵀ [4·DH, DH] per head (the backward's dh_{t-1} = dpre·R_hᵀ in the same row-broadcast GEMM).
std::vector<float> transpose_r(const Problem& p, const std::vector<float>& R) {
  const int64_t DH = p.DH, W = 4 * DH;
  std::vector<float> out(R.size());
  for (int64_t hd = 0; hd < p.NH; ++hd)
    for (int64_t j = 0; j < DH; ++j)
      for (int64_t c = 0; c < W; ++c) out[size_t((hd * W + c) * DH + j)] = R[size_t((hd * DH + j) * W + c)];
  return out;
}

// What a task keeps per step for its backward ([S][Bb][...]).
// A thread's tasks reuse it: the buffers are sized once per call per thread, not per task.
struct Tape {
  std::vector<float> hprev, cprev, nprev, c, n, h;  // [S][Bb][DH]
  std::vector<float> act;                           // [S][Bb][5·DH]: I, F, zt, og, sigmoid(−f̄)
  std::vector<uint8_t> first;                       // [S][Bb]
  std::vector<float> dpre;                          // [S][Bb][4·DH]: all steps, dr is one GEMM at the end
};

struct Task {
  const Problem& p;
  const float* R;   // this head's R_h [DH, 4·DH]
  const float* RT;  // its transpose [4·DH, DH] (backward)
  int64_t b0, Bb, hd;
  float* dR;       // [DH, 4·DH] this task's share of dr (backward)
  float* db;       // [4·DH] this task's share of db

  int64_t DH() const { return p.DH; }
  float* at(std::vector<float>& v, int64_t t, int64_t row, int64_t width) const {
    return &v[size_t((t * Bb + row) * width)];
  }
  cpu_simd::Act act_of(Tape& tp, int64_t t, int64_t row) const {
    float* a = at(tp.act, t, row, 5 * DH());
    const int64_t d = DH();
    return {a, a + d, a + 2 * d, a + 3 * d, a + 4 * d};
  }

  // The next step's wx of this task's rows (and, backward, its dh): scattered 4·DH-element runs.
  void prefetch_step(int64_t t) const {
    const int64_t esz = int64_t(dtype_size(p.dtype));
    for (int64_t r = 0; r < Bb; ++r)
      for (int g = 0; g < 4; ++g) {
        const char* base = static_cast<const char*>(p.wx) + p.wx_at(b0 + r, t, g, hd, 0) * esz;
        for (int64_t off = 0; off < DH() * esz; off += 64) __builtin_prefetch(base + off, 0, 1);  // to L2: the step GEMM streams R_h through L1
      }
  }

  void run(Tape& tp) const {
    const int64_t D = DH(), W = 4 * D;
    std::vector<float> h(size_t(Bb * D), 0.f), c(h), n(h), m(h), G(size_t(Bb * W), 0.f), bias(size_t(W), 0.f);
    for (int g = 0; g < 4; ++g) load_f32(p.b, p.dtype, p.b_at(g, hd, 0), D, &bias[size_t(g * D)]);
    if (p.has_initial())
      for (int64_t r = 0; r < Bb; ++r) {
        const int64_t s = p.state_at(b0 + r, hd, 0);
        std::copy_n(p.h0 + s, D, &h[size_t(r * D)]), std::copy_n(p.c0 + s, D, &c[size_t(r * D)]);
        std::copy_n(p.n0 + s, D, &n[size_t(r * D)]), std::copy_n(p.m0 + s, D, &m[size_t(r * D)]);
      }
    if (p.backward) {
      const size_t cells = size_t(p.S * Bb * D);
      for (auto* v : {&tp.hprev, &tp.cprev, &tp.nprev, &tp.c, &tp.n, &tp.h}) v->resize(cells);
      tp.act.resize(cells * 5);
      tp.first.resize(size_t(p.S * Bb));
      tp.dpre.resize(cells * 4);
    }
    std::vector<float> wxrow(static_cast<size_t>(D));
    {
      TESSERA_TRACE_SCOPE("slstm.forward");
      for (int64_t t = 0; t < p.S; ++t) {
        for (int64_t r = 0; r < Bb; ++r)
          if (p.reset(b0 + r, t))
            for (auto* v : {&h, &c, &n, &m}) std::fill_n(&(*v)[size_t(r * D)], D, 0.f);
        if (p.backward) {
          std::copy(h.begin(), h.end(), at(tp.hprev, t, 0, D));
          std::copy(c.begin(), c.end(), at(tp.cprev, t, 0, D));
          std::copy(n.begin(), n.end(), at(tp.nprev, t, 0, D));
        }
        if (t + 1 < p.S) prefetch_step(t + 1);  // wx rows are 4·NH·DH apart per step: the prefetcher misses them
        cpu_simd::gemm_step(h.data(), Bb, D, R, W, G.data());
        for (int64_t r = 0; r < Bb; ++r) {
          const int64_t bi = b0 + r;
          float* pre = &G[size_t(r * W)];
          for (int g = 0; g < 4; ++g) {
            const int64_t off = p.wx_at(bi, t, g, hd, 0);
            const float* w = static_cast<const float*>(p.wx) + off;  // f32: read in place
            if (p.dtype != DType::kF32) load_f32(p.wx, p.dtype, off, D, wxrow.data()), w = wxrow.data();
            float* pg = pre + g * D;
            const float* bg = &bias[size_t(g * D)];
            for (int64_t k = 0; k < D; ++k) pg[k] += w[k] + bg[k];
          }
          const bool first = (t == 0 && !p.has_initial()) || p.reset(bi, t);
          const cpu_simd::Act act = p.backward ? act_of(tp, t, r) : cpu_simd::Act{};
          float* hr = &h[size_t(r * D)];
          cpu_simd::forward_row(pre, D, first, &m[size_t(r * D)], &c[size_t(r * D)], &n[size_t(r * D)], hr, act);
          if (p.h) store_dtype(hr, p.h_dtype, p.h, p.h_at(bi, t, hd, 0), D);
          if (p.backward) tp.first[size_t(t * Bb + r)] = first;
        }
        if (p.backward) {
          std::copy(h.begin(), h.end(), at(tp.h, t, 0, D));
          std::copy(c.begin(), c.end(), at(tp.c, t, 0, D));
          std::copy(n.begin(), n.end(), at(tp.n, t, 0, D));
        }
      }
    }
    if (p.h_last)
      for (int64_t r = 0; r < Bb; ++r) {
        const int64_t s = p.state_at(b0 + r, hd, 0);
        std::copy_n(&h[size_t(r * D)], D, p.h_last + s), std::copy_n(&c[size_t(r * D)], D, p.c_last + s);
        std::copy_n(&n[size_t(r * D)], D, p.n_last + s), std::copy_n(&m[size_t(r * D)], D, p.m_last + s);
      }
    if (p.backward) backward(tp);
  }

  void backward(Tape& tp) const {
    TESSERA_TRACE_SCOPE("slstm.backward");
    const int64_t D = DH(), W = 4 * D;
    std::vector<float> dhrec(size_t(Bb * D), 0.f), dc(dhrec), dn(dhrec), dh(static_cast<size_t>(D));
    std::vector<float>& dpre = tp.dpre;
    auto init = [&](const float* src, std::vector<float>& dst) {
      if (src)
        for (int64_t r = 0; r < Bb; ++r) std::copy_n(src + p.state_at(b0 + r, hd, 0), D, &dst[size_t(r * D)]);
    };
    init(p.dh_last, dhrec);
    init(p.dc_last, dc);
    init(p.dn_last, dn);
    for (int64_t t = p.S - 1; t >= 0; --t) {
      float* dp = &dpre[size_t(t * Bb * W)];
      if (t > 0)
        for (int64_t r = 0; r < Bb; ++r) {
          const float* up = p.dh + p.h_at(b0 + r, t - 1, hd, 0);
          for (int64_t off = 0; off < D; off += 16) __builtin_prefetch(up + off);
        }
      for (int64_t r = 0; r < Bb; ++r) {
        const int64_t bi = b0 + r;
        const float* up = p.dh + p.h_at(bi, t, hd, 0);
        for (int64_t k = 0; k < D; ++k) dh[size_t(k)] = up[k] + dhrec[size_t(r * D + k)];
        const bool first = tp.first[size_t(t * Bb + r)] != 0;
        float* dpr = dp + r * W;
        cpu_simd::backward_row(dh.data(), &dc[size_t(r * D)], &dn[size_t(r * D)], act_of(tp, t, r), at(tp.c, t, r, D),
                               at(tp.n, t, r, D), at(tp.h, t, r, D), at(tp.cprev, t, r, D), at(tp.nprev, t, r, D), D,
                               first, dpr);
        for (int g = 0; g < 4; ++g) store_dtype(dpr + g * D, p.dtype, p.dwx, p.wx_at(bi, t, g, hd, 0), D);
      }
      cpu_simd::gemm_step(dp, Bb, W, RT, D, dhrec.data());
      for (int64_t r = 0; r < Bb; ++r)
        if (tp.first[size_t(t * Bb + r)]) std::fill_n(&dhrec[size_t(r * D)], D, 0.f);
    }
    if (p.has_initial())
      for (int64_t r = 0; r < Bb; ++r) {
        const int64_t s = p.state_at(b0 + r, hd, 0);
        std::copy_n(&dhrec[size_t(r * D)], D, p.dh0 + s), std::copy_n(&dc[size_t(r * D)], D, p.dc0 + s);
        std::copy_n(&dn[size_t(r * D)], D, p.dn0 + s);
      }
    {
      TESSERA_TRACE_SCOPE("slstm.dr");
      cpu_blas::sgemm(true, false, D, W, p.S * Bb, 1.f, tp.hprev.data(), D, dpre.data(), W, 0.f, dR, W);
      for (int64_t i = 0; i < p.S * Bb; ++i)
        for (int64_t k = 0; k < W; ++k) db[k] += dpre[size_t(i * W + k)];
    }
  }
};

class Cpu final : public Implementation {
 public:
  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return "threads over (batch block, head): one small GEMM per step against the packed recurrent weights, "
           "fused Highway gates, backward through time from stored activations";
  }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU) return Availability::no("cpu runs on host memory");
    if (p.DH > kMaxDH) return Availability::no("DH=" + std::to_string(p.DH) + " is over the cpu limit of " + std::to_string(kMaxDH));
    const int64_t nb = batch_blocks(p), rows = (p.B + nb - 1) / nb;  // the dR GEMM's K = S · rows of a block
    if (p.backward && p.S > INT_MAX / rows)
      return Availability::no("S times a batch block's rows (" + std::to_string(p.S) + " x " + std::to_string(rows) +
                              ") must fit a BLAS int for the dr GEMM");
    return Availability::yes();
  }

  void run(const Problem& p) const override {
    const std::vector<float> R = pack_r(p);
    const std::vector<float> RT = p.backward ? transpose_r(p, R) : std::vector<float>{};
    const int64_t D = p.DH, W = 4 * D;
    const int64_t nb = batch_blocks(p), tasks = nb * p.NH;
    std::vector<float> dR(p.backward ? size_t(tasks * D * W) : 0), db(p.backward ? size_t(tasks * W) : 0);
    const int T = int(std::min<int64_t>(p.num_threads, tasks));
    cpu_threads::run_threads(T, true, "slstm cpu", [&](int tid) {
      Tape tape;
      for (int64_t k = tid; k < tasks; k += T) {
        const int64_t blk = k / p.NH, hd = k % p.NH;
        const int64_t b0 = p.B * blk / nb, b1 = p.B * (blk + 1) / nb;
        const float* rt = p.backward ? &RT[size_t(hd * D * W)] : nullptr;
        Task{p, &R[size_t(hd * D * W)], rt, b0, b1 - b0, hd, p.backward ? &dR[size_t(k * D * W)] : nullptr,
             p.backward ? &db[size_t(k * W)] : nullptr}
            .run(tape);
      }
    });
    if (p.backward) reduce_weights(p, nb, dR, db);
  }

 private:
  // dr[g, h, j, k] = Σ_blocks dR[blk, h][j, g·DH + k]; db likewise; stored in the inputs' dtype.
  static void reduce_weights(const Problem& p, int64_t nb, const std::vector<float>& dR, const std::vector<float>& db) {
    const int64_t D = p.DH, W = 4 * D;
    std::vector<float> row(static_cast<size_t>(D));
    for (int64_t hd = 0; hd < p.NH; ++hd)
      for (int g = 0; g < 4; ++g) {
        for (int64_t j = 0; j < D; ++j) {
          std::fill(row.begin(), row.end(), 0.f);
          for (int64_t blk = 0; blk < nb; ++blk) {
            const float* src = &dR[size_t(((blk * p.NH + hd) * D + j) * W + g * D)];
            for (int64_t k = 0; k < D; ++k) row[size_t(k)] += src[k];
          }
          store_dtype(row.data(), p.dtype, p.dr, p.r_at(g, hd, j, 0), D);
        }
        std::fill(row.begin(), row.end(), 0.f);
        for (int64_t blk = 0; blk < nb; ++blk)
          for (int64_t k = 0; k < D; ++k) row[size_t(k)] += db[size_t((blk * p.NH + hd) * W + g * D + k)];
        store_dtype(row.data(), p.dtype, p.db, p.b_at(g, hd, 0), D);
      }
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cpu_implementation() { return std::make_unique<Cpu>(); }

}  // namespace tessera::slstm
