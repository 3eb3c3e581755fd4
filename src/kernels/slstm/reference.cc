// slstm reference: the recurrence of include/tessera/slstm.h in plain loops in double, and its
// backward through time from the stored activations. The oracle: no shortcut, no fast path.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/slstm/impl.h"

namespace tessera::slstm {
namespace {

double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }
double logsigmoid(double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::abs(x))); }

// One step's activations for one (batch, head) and unit k.
struct Step {
  double i = 0, f = 0, z = 0, o = 0;  // pre-activations
  double I = 0, F = 0, zt = 0, og = 0;
  double c = 0, n = 0, m = 0, h = 0;
};

// The sequence of one (batch row, head): states before each step and the steps.
struct Trace {
  std::vector<std::vector<double>> hprev, cprev, nprev;  // [S][DH]: the state each step starts from
  std::vector<std::vector<Step>> steps;                  // [S][DH]
  std::vector<bool> first;                               // [S]
};

Trace run_forward(const Problem& p, int64_t bi, int64_t hd) {
  const int64_t DH = p.DH;
  auto ld = [&](const void* base, int64_t i) { return static_cast<double>(load_as_f32(base, p.dtype, i)); };
  std::vector<double> h(DH, 0.0), c(DH, 0.0), n(DH, 0.0), m(DH, 0.0);
  if (p.has_initial())
    for (int64_t k = 0; k < DH; ++k) {
      const int64_t s = p.state_at(bi, hd, k);
      h[k] = p.h0[s], c[k] = p.c0[s], n[k] = p.n0[s], m[k] = p.m0[s];
    }
  Trace tr;
  for (int64_t t = 0; t < p.S; ++t) {
    const bool first = (t == 0 && !p.has_initial()) || p.reset(bi, t);
    if (p.reset(bi, t)) std::fill(h.begin(), h.end(), 0.0), std::fill(c.begin(), c.end(), 0.0),
                        std::fill(n.begin(), n.end(), 0.0), std::fill(m.begin(), m.end(), 0.0);
    tr.hprev.push_back(h), tr.cprev.push_back(c), tr.nprev.push_back(n), tr.first.push_back(first);
    std::vector<Step> st(DH);
    for (int64_t k = 0; k < DH; ++k) {
      double pre[4];
      for (int g = 0; g < 4; ++g) {
        double acc = ld(p.wx, p.wx_at(bi, t, g, hd, k)) + ld(p.b, p.b_at(g, hd, k));
        for (int64_t j = 0; j < DH; ++j) acc += h[j] * ld(p.r, p.r_at(g, hd, j, k));
        pre[g] = acc;
      }
      Step& s = st[k];
      s.i = pre[0], s.f = pre[1], s.z = pre[2], s.o = pre[3];
      const double lsf = logsigmoid(s.f);
      if (first) {
        s.m = s.i, s.I = 1.0, s.F = 0.0;
      } else {
        s.m = std::max(s.i, m[k] + lsf);
        s.I = std::exp(s.i - s.m);
        s.F = std::exp(m[k] + lsf - s.m);
      }
      s.zt = std::tanh(s.z);
      s.og = sigmoid(s.o);
      s.c = s.F * c[k] + s.I * s.zt;
      s.n = s.F * n[k] + s.I;
      s.h = s.og * s.c / s.n;
    }
    for (int64_t k = 0; k < DH; ++k) h[k] = st[k].h, c[k] = st[k].c, n[k] = st[k].n, m[k] = st[k].m;
    tr.steps.push_back(std::move(st));
  }
  return tr;
}

void write_forward(const Problem& p, int64_t bi, int64_t hd, const Trace& tr) {
  for (int64_t t = 0; t < p.S; ++t)
    for (int64_t k = 0; k < p.DH; ++k)
      if (p.h) store_from_f32(p.h, p.h_dtype, p.h_at(bi, t, hd, k), static_cast<float>(tr.steps[t][k].h));
  if (!p.h_last) return;
  for (int64_t k = 0; k < p.DH; ++k) {
    const Step& s = tr.steps[p.S - 1][k];
    const int64_t o = p.state_at(bi, hd, k);
    p.h_last[o] = float(s.h), p.c_last[o] = float(s.c), p.n_last[o] = float(s.n), p.m_last[o] = float(s.m);
  }
}

// Gradient accumulators in double for the whole problem.
struct GradAcc {
  std::vector<double> dwx, dr, db;
};

void run_backward(const Problem& p, int64_t bi, int64_t hd, const Trace& tr, GradAcc& acc) {
  const int64_t DH = p.DH;
  auto ld = [&](const void* base, int64_t i) { return static_cast<double>(load_as_f32(base, p.dtype, i)); };
  auto opt = [&](const float* v, int64_t k) { return v ? double(v[p.state_at(bi, hd, k)]) : 0.0; };
  std::vector<double> dh_rec(DH), dc(DH), dn(DH);
  for (int64_t k = 0; k < DH; ++k) dh_rec[k] = opt(p.dh_last, k), dc[k] = opt(p.dc_last, k), dn[k] = opt(p.dn_last, k);
  for (int64_t t = p.S - 1; t >= 0; --t) {
    std::vector<double> dpre(4 * DH);
    for (int64_t k = 0; k < DH; ++k) {
      const Step& s = tr.steps[t][k];
      const double dh = p.dh[p.h_at(bi, t, hd, k)] + dh_rec[k];
      const double dog = dh * s.c / s.n;
      const double dct = dc[k] + dh * s.og / s.n;
      const double dnt = dn[k] - dh * s.h / s.n;
      const double dF = dct * tr.cprev[t][k] + dnt * tr.nprev[t][k];
      const double dI = dct * s.zt + dnt;
      dpre[0 * DH + k] = dI * s.I;
      dpre[1 * DH + k] = tr.first[t] ? 0.0 : dF * s.F * sigmoid(-s.f);
      dpre[2 * DH + k] = dct * s.I * (1.0 - s.zt * s.zt);
      dpre[3 * DH + k] = dog * s.og * (1.0 - s.og);
      dc[k] = dct * s.F;
      dn[k] = dnt * s.F;
    }
    for (int g = 0; g < 4; ++g)
      for (int64_t k = 0; k < DH; ++k) {
        const double d = dpre[g * DH + k];
        acc.dwx[p.wx_at(bi, t, g, hd, k)] += d;
        acc.db[p.b_at(g, hd, k)] += d;
        for (int64_t j = 0; j < DH; ++j) acc.dr[p.r_at(g, hd, j, k)] += tr.hprev[t][j] * d;
      }
    for (int64_t j = 0; j < DH; ++j) {
      double s = 0;
      for (int g = 0; g < 4; ++g)
        for (int64_t k = 0; k < DH; ++k) s += ld(p.r, p.r_at(g, hd, j, k)) * dpre[g * DH + k];
      dh_rec[j] = s;
    }
    if (tr.first[t]) {  // nothing flows to the zeroed (or absent) previous state
      std::fill(dh_rec.begin(), dh_rec.end(), 0.0), std::fill(dc.begin(), dc.end(), 0.0),
          std::fill(dn.begin(), dn.end(), 0.0);
    }
  }
  if (!p.has_initial()) return;
  for (int64_t k = 0; k < DH; ++k) {
    const int64_t o = p.state_at(bi, hd, k);
    p.dh0[o] = float(dh_rec[k]), p.dc0[o] = float(dc[k]), p.dn0[o] = float(dn[k]);
  }
}

class Reference final : public Implementation {
 public:
  std::string name() const override { return "reference"; }
  std::string description() const override { return "the recurrence in plain loops in double (the oracle)"; }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU) return Availability::no("reference runs on the CPU");
    return Availability::yes();
  }
  void run(const Problem& p) const override {
    GradAcc acc;
    if (p.backward) {
      acc.dwx.assign(static_cast<size_t>(p.B * p.S * 4 * p.NH * p.DH), 0.0);
      acc.dr.assign(static_cast<size_t>(4 * p.NH * p.DH * p.DH), 0.0);
      acc.db.assign(static_cast<size_t>(4 * p.NH * p.DH), 0.0);
    }
    for (int64_t bi = 0; bi < p.B; ++bi)
      for (int64_t hd = 0; hd < p.NH; ++hd) {
        const Trace tr = run_forward(p, bi, hd);
        write_forward(p, bi, hd, tr);
        if (p.backward) run_backward(p, bi, hd, tr, acc);
      }
    if (!p.backward) return;
    auto store = [&](void* dst, const std::vector<double>& v) {
      for (size_t i = 0; i < v.size(); ++i) store_from_f32(dst, p.dtype, static_cast<int64_t>(i), float(v[i]));
    };
    store(p.dwx, acc.dwx), store(p.dr, acc.dr), store(p.db, acc.db);
  }
};

}  // namespace

std::unique_ptr<Implementation> make_reference_implementation() { return std::make_unique<Reference>(); }

}  // namespace tessera::slstm
