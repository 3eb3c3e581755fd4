// mlstm: the CPU backend — the chunkwise form. Per (batch, head), a worker thread walks the
// chunks of L steps; within a chunk, with the state (C, n, m) it entered with:
//   cum_t   = Σ_{u ≤ t in chunk} logsigmoid(f_u)
//   D_ts    = cum_t − cum_s + i_s  for s in the segment of t (since the last reset), s ≤ t
//   g_t     = m_prev + cum_t       when no reset lies between the chunk start and t (else no
//                                  inter term: the state entering t's segment is zero)
//   m_t     = max(g_t, max_s D_ts) — the recurrence's stabilizer exactly (also with resets, where
//             the segment's start contributes the m = 0 of the zero state: g_t = cum_t − cum_{r−1})
//   h_t     = (Σ_s e^{D_ts − m_t}(q̂_t·k_s) v_s + e^{g_t − m_t} C_prevᵀ q̂_t) / (max(|den_t|, e^{−m_t}) + eps)
// as three sgemms (Q̂Kᵀ, P·V, Q̂·C_prev), and the state at the chunk's end as one more
// (Kᵀ diag(e^{D_last,s − m_last}) V). The backward recomputes each chunk from the chunk-start
// states of a forward sweep (kept: S/L·(DK·DV + DK + 1) floats per head) and walks the chunks
// in reverse with the gradient of the state, m held constant (the contract).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "core/trace.h"
#include "kernels/mlstm/impl.h"
#include "primitives/cpu_blas.h"
#include "primitives/cpu_threads.h"

namespace tessera::mlstm {
namespace {

constexpr int64_t kMaxHeadDim = 1024;

using cpu_blas::sgemm;

// One chunk's forward quantities (row-major, L rows).
struct Chunk {
  int64_t L = 0, start = 0;
  std::vector<double> cum, g, m;
  std::vector<float> w;                 // e^{g − m}, 0 without a state to decay (after a reset)
  std::vector<int64_t> seg;             // first step of t's segment (local)
  std::vector<float> qs, E, Sm, P;      // q̂ [L, DK]; e^{D − m}, q̂·k, their product [L, L] (0 outside)
  std::vector<float> qc, qn;            // q̂·C_prev [L, DV], q̂·n_prev [L]
  std::vector<float> num, den_raw, den;  // [L, DV], [L], [L]
};

struct Head {
  const Problem& p;
  int64_t b, bh;
  const float* q(int64_t t) const { return p.q + (bh * p.S + t) * p.DK; }
  const float* k(int64_t t) const { return p.k + (bh * p.S + t) * p.DK; }
  const float* v(int64_t t) const { return p.v + (bh * p.S + t) * p.DV; }
  float gi(int64_t t) const { return p.i[bh * p.S + t]; }
  float gf(int64_t t) const { return p.f[bh * p.S + t]; }
};

double logsigmoid(double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::fabs(x))); }

// The denominator's floor exp(−m) in f32, never 0: past m ≈ 103 it would underflow, and with
// eps = 0 and q̂ᵀn = 0 (a zero query) h would be 0/0.
float den_floor(double m) { return std::max(static_cast<float>(std::exp(-m)), std::numeric_limits<float>::min()); }

// The chunk [start, start + L) from the state (C, n, m_prev): fills c. Without `full`, only what
// chunk_state needs (m, w, the decay matrix E): the backward's state sweep.
void chunk_forward(const Head& hd, int64_t start, int64_t L, const float* C, const float* n, double m_prev, Chunk& c,
                   bool full = true) {
  const Problem& p = hd.p;
  const int64_t DK = p.DK, DV = p.DV;
  c.L = L, c.start = start;
  c.cum.assign(L, 0.0), c.g.assign(L, 0.0), c.m.assign(L, 0.0), c.w.assign(L, 0.f), c.seg.assign(L, 0);
  c.qs.resize(L * DK), c.E.assign(L * L, 0.f), c.Sm.resize(L * L), c.P.assign(L * L, 0.f);
  c.qc.resize(L * DV), c.qn.assign(L, 0.f), c.num.resize(L * DV), c.den_raw.assign(L, 0.f), c.den.resize(L);
  const float scale = 1.0f / std::sqrt(float(DK));
  for (int64_t t = 0; t < L; ++t)
    for (int64_t x = 0; x < DK; ++x) c.qs[t * DK + x] = hd.q(start + t)[x] * scale;
  int64_t seg = 0;
  bool has_state = true;
  double acc = 0.0, seg_base = 0.0;  // cum at the step before the segment's start
  for (int64_t t = 0; t < L; ++t) {
    if (p.reset_at(hd.b, start + t)) seg = t, has_state = false, seg_base = acc;
    acc += logsigmoid(hd.gf(start + t));
    c.cum[t] = acc, c.seg[t] = seg;
    c.g[t] = has_state ? m_prev + acc : acc - seg_base;
    double m = c.g[t];
    for (int64_t s = seg; s <= t; ++s) m = std::max(m, acc - c.cum[s] + hd.gi(start + s));
    c.m[t] = m;
    c.w[t] = has_state ? float(std::exp(c.g[t] - m)) : 0.f;
    for (int64_t s = seg; s <= t; ++s) c.E[t * L + s] = float(std::exp(acc - c.cum[s] + hd.gi(start + s) - m));
  }
  if (!full) return;
  sgemm(false, true, L, L, DK, 1.f, c.qs.data(), DK, hd.k(start), DK, 0.f, c.Sm.data(), L);
  for (int64_t j = 0; j < L * L; ++j) c.P[j] = c.Sm[j] * c.E[j];
  sgemm(false, false, L, DV, L, 1.f, c.P.data(), L, hd.v(start), DV, 0.f, c.num.data(), DV);
  sgemm(false, false, L, DV, DK, 1.f, c.qs.data(), DK, C, DV, 0.f, c.qc.data(), DV);
  for (int64_t t = 0; t < L; ++t) {
    float qn = 0.f, den = 0.f;
    for (int64_t x = 0; x < DK; ++x) qn += c.qs[t * DK + x] * n[x];
    for (int64_t s = 0; s <= t; ++s) den += c.P[t * L + s];
    c.qn[t] = qn;
    c.den_raw[t] = den + c.w[t] * qn;
    for (int64_t y = 0; y < DV; ++y) c.num[t * DV + y] += c.w[t] * c.qc[t * DV + y];
    c.den[t] = std::max(std::fabs(c.den_raw[t]), den_floor(c.m[t])) + float(p.eps);
  }
}

// The state at the chunk's end, in place: C = w_last·C + Kᵀ diag(A) V, n = w_last·n + Kᵀ A.
void chunk_state(const Head& hd, const Chunk& c, float* C, float* n, double& m, std::vector<float>& ka) {
  const int64_t L = c.L, DK = hd.p.DK, DV = hd.p.DV, last = L - 1;
  ka.resize(L * DK);
  const float wl = c.w[last];
  for (int64_t x = 0; x < DK; ++x) n[x] *= wl;
  for (int64_t s = 0; s < L; ++s) {
    const float a = c.E[last * L + s];
    for (int64_t x = 0; x < DK; ++x) {
      ka[s * DK + x] = a * hd.k(c.start + s)[x];
      n[x] += ka[s * DK + x];
    }
  }
  sgemm(true, false, DK, DV, L, 1.f, ka.data(), DK, hd.v(c.start), DV, wl, C, DV);
  m = c.m[last];
}

int64_t chunk_of(const Problem& p) { return p.chunk > 0 ? p.chunk : kDefaultChunk; }

void initial_state(const Head& hd, std::vector<float>& C, std::vector<float>& n, double& m) {
  const Problem& p = hd.p;
  C.assign(p.DK * p.DV, 0.f), n.assign(p.DK, 0.f), m = 0.0;
  if (!p.c0) return;
  std::copy_n(p.c0 + hd.bh * p.DK * p.DV, p.DK * p.DV, C.begin());
  std::copy_n(p.n0 + hd.bh * p.DK, p.DK, n.begin());
  m = p.m0[hd.bh];
}

void head_forward(const Head& hd, const ForwardOut& out) {
  TESSERA_TRACE_SCOPE("mlstm.cpu.forward_head");
  const Problem& p = hd.p;
  const int64_t Lc = chunk_of(p), DV = p.DV;
  std::vector<float> C, n, ka;
  double m;
  initial_state(hd, C, n, m);
  Chunk c;
  for (int64_t start = 0; start < p.S; start += Lc) {
    const int64_t L = std::min(Lc, p.S - start);
    chunk_forward(hd, start, L, C.data(), n.data(), m, c);
    for (int64_t t = 0; t < L; ++t)
      for (int64_t y = 0; y < DV; ++y) out.h[(hd.bh * p.S + start + t) * DV + y] = c.num[t * DV + y] / c.den[t];
    chunk_state(hd, c, C.data(), n.data(), m, ka);
  }
  if (!out.c_last) return;
  std::copy(C.begin(), C.end(), out.c_last + hd.bh * p.DK * DV);
  std::copy(n.begin(), n.end(), out.n_last + hd.bh * p.DK);
  out.m_last[hd.bh] = float(m);
}

// Gradients of one chunk; dC, dn: the gradient of the state at the chunk's end, replaced by that
// of the state it entered with.
void chunk_backward(const Head& hd, const Chunk& c, const float* C, const float* n, const BackwardArgs& a,
                    std::vector<float>& dC, std::vector<float>& dn) {
  const Problem& p = hd.p;
  const int64_t L = c.L, DK = p.DK, DV = p.DV, last = L - 1, g0 = hd.bh * p.S + c.start;
  const float* dh = a.dh + g0 * DV;
  std::vector<float> dnum(L * DV), ddr(L), dP(L * L), dS(L * L), dD(L * L, 0.f), dnw(L * DV);
  std::vector<float> dqs(L * DK), dk(L * DK), dv(L * DV), tmp(L * std::max(DK, DV)), dg(L, 0.f);
  for (int64_t t = 0; t < L; ++t) {
    float dden = 0.f;
    for (int64_t y = 0; y < DV; ++y) {
      dnum[t * DV + y] = dh[t * DV + y] / c.den[t];
      dden -= dh[t * DV + y] * c.num[t * DV + y] / (c.den[t] * c.den[t]);
    }
    const bool live = std::fabs(c.den_raw[t]) > den_floor(c.m[t]);
    ddr[t] = live ? (c.den_raw[t] > 0 ? dden : -dden) : 0.f;
    for (int64_t y = 0; y < DV; ++y) dnw[t * DV + y] = c.w[t] * dnum[t * DV + y];
  }
  // Intra-chunk: num = P V, den = rowsum P, P = (q̂kᵀ) ∘ E.
  sgemm(false, true, L, L, DV, 1.f, dnum.data(), DV, hd.v(c.start), DV, 0.f, dP.data(), L);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t s = 0; s < L; ++s) {
      const int64_t j = t * L + s;
      const bool valid = s >= c.seg[t] && s <= t;
      const float d = valid ? dP[j] + ddr[t] : 0.f;
      dS[j] = d * c.E[j];
      dD[j] = d * c.P[j];
    }
  sgemm(true, false, L, DV, L, 1.f, c.P.data(), L, dnum.data(), DV, 0.f, dv.data(), DV);
  sgemm(false, false, L, DK, L, 1.f, dS.data(), L, hd.k(c.start), DK, 0.f, dqs.data(), DK);
  sgemm(true, false, L, DK, L, 1.f, dS.data(), L, c.qs.data(), DK, 0.f, dk.data(), DK);
  // Inter-chunk: num += w q̂ᵀC_prev, den += w q̂·n_prev.
  sgemm(false, true, L, DK, DV, 1.f, dnw.data(), DV, C, DV, 1.f, dqs.data(), DK);
  for (int64_t t = 0; t < L; ++t) {
    float dw = c.qn[t] * ddr[t];
    for (int64_t y = 0; y < DV; ++y) dw += c.qc[t * DV + y] * dnum[t * DV + y];
    dg[t] = dw * c.w[t];
    for (int64_t x = 0; x < DK; ++x) dqs[t * DK + x] += c.w[t] * ddr[t] * n[x];
  }
  std::vector<float> dC_prev(DK * DV), dn_prev(DK, 0.f);
  sgemm(true, false, DK, DV, L, 1.f, c.qs.data(), DK, dnw.data(), DV, 0.f, dC_prev.data(), DV);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t x = 0; x < DK; ++x) dn_prev[x] += c.w[t] * ddr[t] * c.qs[t * DK + x];
  // The state out: C_out = w_last C_prev + Σ_s A_s k_s v_sᵀ, n_out = w_last n_prev + Σ_s A_s k_s.
  const float wl = c.w[last];
  if (wl != 0.f) {
    float dwl = 0.f;
    for (int64_t j = 0; j < DK * DV; ++j) dwl += dC[j] * C[j], dC_prev[j] += wl * dC[j];
    for (int64_t x = 0; x < DK; ++x) dwl += dn[x] * n[x], dn_prev[x] += wl * dn[x];
    dg[last] += dwl * wl;
  }
  sgemm(false, true, L, DK, DV, 1.f, hd.v(c.start), DV, dC.data(), DV, 0.f, tmp.data(), DK);  // (dC v_s)
  for (int64_t s = 0; s < L; ++s) {
    const float A = c.E[last * L + s];
    if (A == 0.f) continue;
    const float* ks = hd.k(c.start + s);
    float dA = 0.f;
    for (int64_t x = 0; x < DK; ++x) {
      const float u = tmp[s * DK + x] + dn[x];
      dA += ks[x] * u;
      dk[s * DK + x] += A * u;
    }
    dD[last * L + s] += dA * A;
  }
  sgemm(false, false, L, DV, DK, 1.f, hd.k(c.start), DK, dC.data(), DV, 0.f, tmp.data(), DV);  // (dCᵀ k_s)
  for (int64_t s = 0; s < L; ++s)
    for (int64_t y = 0; y < DV; ++y) dv[s * DV + y] += c.E[last * L + s] * tmp[s * DV + y];
  // Gates: D_ts = cum_t − cum_s + i_s, g_t = m_prev + cum_t, cum_t = Σ_{u ≤ t} logf_u.
  std::vector<double> dcum(L, 0.0);
  for (int64_t t = 0; t < L; ++t) {
    dcum[t] += dg[t];
    for (int64_t s = 0; s <= t; ++s) dcum[t] += dD[t * L + s], dcum[s] -= dD[t * L + s];
  }
  double suffix = 0.0;
  const float scale = 1.0f / std::sqrt(float(DK));
  for (int64_t t = L - 1; t >= 0; --t) {
    suffix += dcum[t];
    double di = 0.0;
    for (int64_t u = t; u < L; ++u) di += dD[u * L + t];
    const double f = hd.gf(c.start + t);
    a.di[g0 + t] = float(di);
    a.df[g0 + t] = float(suffix * (1.0 / (1.0 + std::exp(f))));  // d logsigmoid(f)/df = σ(−f)
  }
  for (int64_t j = 0; j < L * DK; ++j) a.dq[g0 * DK + j] = dqs[j] * scale, a.dk[g0 * DK + j] = dk[j];
  std::copy(dv.begin(), dv.end(), a.dv + g0 * DV);
  dC.swap(dC_prev);
  dn.swap(dn_prev);
}

void head_backward(const Head& hd, const BackwardArgs& a) {
  TESSERA_TRACE_SCOPE("mlstm.cpu.backward_head");
  const Problem& p = hd.p;
  const int64_t Lc = chunk_of(p), DK = p.DK, DV = p.DV, NC = (p.S + Lc - 1) / Lc;
  // Forward sweep: the state each chunk enters with.
  std::vector<float> Cs(NC * DK * DV), ns(NC * DK), ka, C, n;
  std::vector<double> ms(NC);
  double m;
  initial_state(hd, C, n, m);
  Chunk c;
  for (int64_t j = 0; j < NC; ++j) {
    std::copy(C.begin(), C.end(), Cs.begin() + j * DK * DV);
    std::copy(n.begin(), n.end(), ns.begin() + j * DK);
    ms[j] = m;
    if (j + 1 == NC) break;
    chunk_forward(hd, j * Lc, Lc, C.data(), n.data(), m, c, /*full=*/false);
    chunk_state(hd, c, C.data(), n.data(), m, ka);
  }
  std::vector<float> dC(DK * DV, 0.f), dn(DK, 0.f);
  if (a.dc_last) std::copy_n(a.dc_last + hd.bh * DK * DV, DK * DV, dC.begin());
  if (a.dn_last) std::copy_n(a.dn_last + hd.bh * DK, DK, dn.begin());
  for (int64_t j = NC - 1; j >= 0; --j) {
    const int64_t start = j * Lc, L = std::min(Lc, p.S - start);
    chunk_forward(hd, start, L, Cs.data() + j * DK * DV, ns.data() + j * DK, ms[j], c);
    chunk_backward(hd, c, Cs.data() + j * DK * DV, ns.data() + j * DK, a, dC, dn);
  }
  if (!a.dc0) return;
  std::copy(dC.begin(), dC.end(), a.dc0 + hd.bh * DK * DV);
  std::copy(dn.begin(), dn.end(), a.dn0 + hd.bh * DK);
}

// body(head) for every (batch, head), spread over the problem's threads.
template <class F>
void for_heads(const Problem& p, F&& body) {
  const int64_t heads = p.B * p.NH;
  const int T = int(std::min<int64_t>(p.num_threads, heads));
  std::atomic<int64_t> next{0};
  cpu_threads::run_threads(T, true, "mlstm cpu", [&](int) {
    for (int64_t bh; (bh = next.fetch_add(1)) < heads;) body(Head{p, bh / p.NH, bh});
  });
}

class Cpu final : public Implementation {
 public:
  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return "chunkwise form: intra-chunk sgemms with the decay matrix, inter-chunk state recurrence; threads over heads";
  }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU) return Availability::no("the cpu backend runs on host memory");
    if (p.DK > kMaxHeadDim || p.DV > kMaxHeadDim)
      return Availability::no("DHQK and DHV must be <= " + std::to_string(kMaxHeadDim) + " (cpu), got " +
                              std::to_string(p.DK) + " and " + std::to_string(p.DV));
    if (chunk_of(p) > 1024) return Availability::no("chunk_size must be <= 1024 (cpu), got " + std::to_string(p.chunk));
    return Availability::yes();
  }
  void forward(const Problem& p, const ForwardOut& out) const override {
    for_heads(p, [&](const Head& hd) { head_forward(hd, out); });
  }
  void backward(const Problem& p, const BackwardArgs& a) const override {
    for_heads(p, [&](const Head& hd) { head_backward(hd, a); });
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cpu_implementation() { return std::make_unique<Cpu>(); }

}  // namespace tessera::mlstm
