// attention: the reference implementation (the oracle).
//
// Plain loops, double accumulation everywhere, one query row at a time, streaming over the keys
// of its sequence: O(Sk) doubles per row in forward (the row's scores), never Sq × Sk. Backward
// recomputes each row's probabilities from the saved lse (P = exp(s − lse)), uses the saved o
// for Δ_i = Σ_c dO_ic·o_ic (exactly the quantities every backend is given), and accumulates dk
// and dv in gradient-sized double buffers. Obviously correct rather than fast; never edited to
// make a fast path pass: it changes only when the math changes. Dropout multiplies each
// probability by z_ij = 0 or 1/(1 − p) (impl.h's dropout_keep) where it meets v: o, dv and dP;
// lse and the P of dS = P·(dP − Δ) are the undropped ones. The bias is added after ALiBi; its
// gradient is dS (before the soft cap's factor) summed over the bias's broadcast dims.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "kernels/attention/impl.h"

namespace tessera::attention {
namespace {

double at(const void* base, DType t, int64_t i) { return load_as_f32(base, t, i); }

// z_ij: 1 without dropout, else 0 (dropped) or 1 / (1 − p) (kept).
double dropout_factor(const Problem& p, int64_t n, int64_t h, int64_t i, int64_t j) {
  if (!p.dropout()) return 1.0;
  return p.dropout_keep(n, h, i, j) ? 1.0 / (1.0 - p.dropout_p) : 0.0;
}

struct Row {
  int64_t n, h, i;     // sequence, query head, row within the sequence
  int64_t qrow, kv;    // global row of q, kv head
};

// The score of (row, key j) and, through *capped, its value right after the soft cap (before
// ALiBi and the bias) — the softcap derivative needs it.
double score(const Problem& p, const Row& r, int64_t j, double* capped) {
  const int64_t krow = p.k_begin(r.n) + j;
  double dot = 0.0;
  for (int64_t d = 0; d < p.D; ++d)
    dot += at(p.q, p.dtype, (r.qrow * p.Hq + r.h) * p.D + d) * at(p.k, p.dtype, (krow * p.Hkv + r.kv) * p.D + d);
  double s = p.scale * dot;
  if (p.softcap > 0.0) s = p.softcap * std::tanh(s / p.softcap);
  *capped = s;
  if (p.alibi) {
    const int64_t c = r.i + p.k_len(r.n) - p.q_len(r.n);  // i + off
    s -= static_cast<double>(p.slope(r.n, r.h)) * static_cast<double>(std::llabs(c - j));
  }
  if (p.bias) s += static_cast<double>(p.bias_at(r.n, r.h, r.i, j));
  return s;
}

class Reference final : public Implementation {
 public:
  std::string name() const override { return "reference"; }
  std::string description() const override {
    return "plain loops in double precision, streaming over keys; the oracle (slow)";
  }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU)
      return Availability::no("inputs are on " + p.device.str() + ", reference runs on host memory");
    return Availability::yes();
  }
  BlockSizes default_block_sizes(const Problem&) const override { return {}; }
  void validate_block_sizes(const BlockSizes&) const override {}  // unblocked: ignores them

  void forward(const Problem& p, const BlockSizes&, const ForwardOut& out) const override {
    std::vector<double> s, acc(static_cast<size_t>(p.Dv));
    std::vector<char> ok;
    for (int64_t n = 0; n < p.N; ++n) {
      const int64_t sk = p.k_len(n);
      s.resize(static_cast<size_t>(sk));
      ok.resize(static_cast<size_t>(sk));
      for (int64_t h = 0; h < p.Hq; ++h)
        for (int64_t i = 0; i < p.q_len(n); ++i) {
          const Row r{n, h, i, p.q_begin(n) + i, h / p.group()};
          double m = -INFINITY, capped;
          for (int64_t j = 0; j < sk; ++j) {
            ok[j] = p.allowed(n, i, j);
            if (!ok[j]) continue;
            s[j] = score(p, r, j, &capped);
            m = std::max(m, s[j]);
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          double lse = -INFINITY;
          if (m > -INFINITY) {
            double sum = 0.0;
            for (int64_t j = 0; j < sk; ++j)
              if (ok[j]) sum += std::exp(s[j] - m);
            lse = m + std::log(sum);
            for (int64_t j = 0; j < sk; ++j) {
              if (!ok[j]) continue;
              const double pj = std::exp(s[j] - lse) * dropout_factor(p, n, h, i, j);
              const int64_t krow = p.k_begin(n) + j;
              for (int64_t c = 0; c < p.Dv; ++c) acc[c] += pj * at(p.v, p.dtype, (krow * p.Hkv + r.kv) * p.Dv + c);
            }
          }
          for (int64_t c = 0; c < p.Dv; ++c)
            store_from_f32(out.o, out.o_dtype, (r.qrow * p.Hq + h) * p.Dv + c, static_cast<float>(acc[c]));
          out.lse[p.lse_index(n, h, i)] = static_cast<float>(lse);
        }
    }
  }

  void backward(const Problem& p, const BlockSizes&, const BackwardIn& in, const GradOut& out) const override {
    std::vector<double> dk(static_cast<size_t>(p.total_k * p.Hkv * p.D), 0.0);
    std::vector<double> dv(static_cast<size_t>(p.total_k * p.Hkv * p.Dv), 0.0);
    std::vector<double> dq(static_cast<size_t>(p.D));
    std::vector<double> dbias(out.dbias ? static_cast<size_t>(p.bias_numel()) : 0, 0.0);
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t h = 0; h < p.Hq; ++h)
        for (int64_t i = 0; i < p.q_len(n); ++i) {
          const Row r{n, h, i, p.q_begin(n) + i, h / p.group()};
          std::fill(dq.begin(), dq.end(), 0.0);
          const double lse = in.lse[p.lse_index(n, h, i)];
          const int64_t orow = (r.qrow * p.Hq + h) * p.Dv;
          if (lse > -INFINITY) {
            double delta = 0.0;  // Δ_i = Σ_c dO_ic · o_ic
            for (int64_t c = 0; c < p.Dv; ++c)
              delta += at(in.grad_o, in.grad_o_dtype, orow + c) * at(in.o, in.o_dtype, orow + c);
            for (int64_t j = 0; j < p.k_len(n); ++j) {
              if (!p.allowed(n, i, j)) continue;
              double capped;
              const double pj = std::exp(score(p, r, j, &capped) - lse);
              const int64_t krow = p.k_begin(n) + j;
              const int64_t kbase = (krow * p.Hkv + r.kv) * p.D, vbase = (krow * p.Hkv + r.kv) * p.Dv;
              const double z = dropout_factor(p, n, h, i, j);
              double dp = 0.0;  // dP_ij = z_ij · dO_i · v_j
              for (int64_t c = 0; c < p.Dv; ++c) {
                const double g = at(in.grad_o, in.grad_o_dtype, orow + c);
                dp += g * at(p.v, p.dtype, vbase + c);
                dv[static_cast<size_t>(vbase + c)] += pj * z * g;
              }
              dp *= z;
              double ds = pj * (dp - delta);  // d loss / d s_ij
              if (out.dbias) dbias[static_cast<size_t>(p.bias_offset(n, h, i, j))] += ds;
              // Through the soft cap t = c·tanh(u/c): dt/du = 1 − (t/c)²; then u = scale·q·k.
              if (p.softcap > 0.0) ds *= 1.0 - (capped / p.softcap) * (capped / p.softcap);
              ds *= p.scale;
              const int64_t qbase = (r.qrow * p.Hq + h) * p.D;
              for (int64_t d = 0; d < p.D; ++d) {
                dq[d] += ds * at(p.k, p.dtype, kbase + d);
                dk[static_cast<size_t>(kbase + d)] += ds * at(p.q, p.dtype, qbase + d);
              }
            }
          }
          for (int64_t d = 0; d < p.D; ++d)
            store_from_f32(out.dq, out.dq_dtype, (r.qrow * p.Hq + h) * p.D + d, static_cast<float>(dq[d]));
        }
    for (size_t i = 0; i < dk.size(); ++i)
      store_from_f32(out.dk, out.dk_dtype, static_cast<int64_t>(i), static_cast<float>(dk[i]));
    for (size_t i = 0; i < dv.size(); ++i)
      store_from_f32(out.dv, out.dv_dtype, static_cast<int64_t>(i), static_cast<float>(dv[i]));
    for (size_t i = 0; i < dbias.size(); ++i)
      store_from_f32(out.dbias, out.dbias_dtype, static_cast<int64_t>(i), static_cast<float>(dbias[i]));
  }
};

}  // namespace

std::unique_ptr<Implementation> make_reference_implementation() { return std::make_unique<Reference>(); }

}  // namespace tessera::attention
