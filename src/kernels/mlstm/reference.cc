// mlstm: the reference — the oracle. The recurrence of include/tessera/mlstm.h step by step, in
// double, one (batch, head) at a time. Its backward keeps every step's state (S·DK·DV doubles per
// head) and walks back through time with the stabilizer m held constant (the contract).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/mlstm/impl.h"
#include "tessera/error.h"

namespace tessera::mlstm {
namespace {

double logsigmoid(double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::fabs(x))); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// One head's state: C [DK, DV], n [DK], m.
struct State {
  std::vector<double> C, n;
  double m = 0.0;
};

struct Step {  // what the backward needs of step t
  double F = 0.0, I = 0.0, m = 0.0, den_raw = 0.0, den = 0.0;
  bool reset = false;
};

class Head {
 public:
  Head(const Problem& p, int64_t b, int64_t h) : p_(p), b_(b), bh_(b * p.NH + h) {}

  State initial() const {
    State s{std::vector<double>(size_t(p_.DK * p_.DV), 0.0), std::vector<double>(size_t(p_.DK), 0.0), 0.0};
    if (!p_.c0) return s;
    for (int64_t j = 0; j < p_.DK * p_.DV; ++j) s.C[size_t(j)] = p_.c0[bh_ * p_.DK * p_.DV + j];
    for (int64_t j = 0; j < p_.DK; ++j) s.n[size_t(j)] = p_.n0[bh_ * p_.DK + j];
    s.m = p_.m0[bh_];
    return s;
  }

  // State s from t−1 to t; h_t written to `h` (DV doubles). Returns the step's scalars.
  Step step(State& s, int64_t t, double* h) const {
    const int64_t DK = p_.DK, DV = p_.DV, g = bh_ * p_.S + t;
    Step r;
    r.reset = p_.reset_at(b_, t);
    if (r.reset) {
      std::fill(s.C.begin(), s.C.end(), 0.0);
      std::fill(s.n.begin(), s.n.end(), 0.0);
      s.m = 0.0;
    }
    const double logf = logsigmoid(p_.f[g]), i = p_.i[g];
    r.m = std::max(logf + s.m, i);
    r.F = std::exp(logf + s.m - r.m);
    r.I = std::exp(i - r.m);
    s.m = r.m;
    const float *k = p_.k + g * DK, *v = p_.v + g * DV, *q = p_.q + g * DK;
    for (int64_t a = 0; a < DK; ++a) {
      s.n[size_t(a)] = r.F * s.n[size_t(a)] + r.I * k[a];
      for (int64_t c = 0; c < DV; ++c)
        s.C[size_t(a * DV + c)] = r.F * s.C[size_t(a * DV + c)] + r.I * double(k[a]) * v[c];
    }
    const double scale = 1.0 / std::sqrt(double(DK));
    for (int64_t a = 0; a < DK; ++a) r.den_raw += s.n[size_t(a)] * q[a] * scale;
    r.den = std::max(std::fabs(r.den_raw), std::exp(-r.m)) + p_.eps;
    for (int64_t c = 0; c < DV; ++c) {
      double num = 0.0;
      for (int64_t a = 0; a < DK; ++a) num += s.C[size_t(a * DV + c)] * q[a] * scale;
      h[c] = num / r.den;
    }
    return r;
  }

  void forward(const ForwardOut& out) const {
    State s = initial();
    std::vector<double> h(static_cast<size_t>(p_.DV));
    for (int64_t t = 0; t < p_.S; ++t) {
      step(s, t, h.data());
      for (int64_t c = 0; c < p_.DV; ++c) out.h[(bh_ * p_.S + t) * p_.DV + c] = float(h[size_t(c)]);
    }
    if (!out.c_last) return;
    for (int64_t j = 0; j < p_.DK * p_.DV; ++j) out.c_last[bh_ * p_.DK * p_.DV + j] = float(s.C[size_t(j)]);
    for (int64_t j = 0; j < p_.DK; ++j) out.n_last[bh_ * p_.DK + j] = float(s.n[size_t(j)]);
    out.m_last[bh_] = float(s.m);
  }

  void backward(const BackwardArgs& a) const {
    const int64_t S = p_.S, DK = p_.DK, DV = p_.DV;
    // states[t + 1] is the state after step t; states[0] the initial one (after a reset at t, the
    // state step t starts from is zero: kept in `from`).
    std::vector<State> states{initial()};
    std::vector<Step> steps;
    std::vector<std::vector<double>> hs;
    for (int64_t t = 0; t < S; ++t) {
      State s = states.back();
      hs.emplace_back(size_t(DV));
      steps.push_back(step(s, t, hs.back().data()));
      states.push_back(std::move(s));
    }
    std::vector<double> dC(size_t(DK * DV), 0.0), dn(size_t(DK), 0.0);
    if (a.dc_last)
      for (int64_t j = 0; j < DK * DV; ++j) dC[size_t(j)] = a.dc_last[bh_ * DK * DV + j];
    if (a.dn_last)
      for (int64_t j = 0; j < DK; ++j) dn[size_t(j)] = a.dn_last[bh_ * DK + j];
    const double scale = 1.0 / std::sqrt(double(DK));
    for (int64_t t = S - 1; t >= 0; --t) {
      const int64_t g = bh_ * S + t;
      const Step& st = steps[size_t(t)];
      const State& cur = states[size_t(t + 1)];
      const float *q = p_.q + g * DK, *k = p_.k + g * DK, *v = p_.v + g * DV, *dh = a.dh + g * DV;
      // h = num / den, num = Cᵀq̂, den = max(|nᵀq̂|, e^{−m}) + eps.
      double dden = 0.0;
      std::vector<double> dnum(static_cast<size_t>(DV));
      for (int64_t c = 0; c < DV; ++c) {
        dnum[size_t(c)] = dh[c] / st.den;
        dden -= dh[c] * hs[size_t(t)][size_t(c)] / st.den;
      }
      const double dden_raw = std::fabs(st.den_raw) > std::exp(-st.m) ? (st.den_raw > 0 ? dden : -dden) : 0.0;
      for (int64_t x = 0; x < DK; ++x) {
        double dqx = cur.n[size_t(x)] * dden_raw;
        for (int64_t c = 0; c < DV; ++c) {
          dqx += cur.C[size_t(x * DV + c)] * dnum[size_t(c)];
          dC[size_t(x * DV + c)] += q[x] * scale * dnum[size_t(c)];
        }
        dn[size_t(x)] += q[x] * scale * dden_raw;
        a.dq[g * DK + x] = float(dqx * scale);
      }
      // C_t = F·C_{t−1} + I·k vᵀ, n_t = F·n_{t−1} + I·k (C_{t−1} = 0 after a reset).
      const bool has_prev = !st.reset;
      const State& prev = states[size_t(t)];
      double dF = 0.0, dI = 0.0;
      for (int64_t x = 0; x < DK; ++x) {
        double dkx = dn[size_t(x)];
        dI += dn[size_t(x)] * k[x];
        if (has_prev) dF += dn[size_t(x)] * prev.n[size_t(x)];
        for (int64_t c = 0; c < DV; ++c) {
          const double d = dC[size_t(x * DV + c)];
          dkx += d * v[c];
          dI += d * k[x] * v[c];
          if (has_prev) dF += d * prev.C[size_t(x * DV + c)];
        }
        a.dk[g * DK + x] = float(st.I * dkx);
      }
      for (int64_t c = 0; c < DV; ++c) {
        double dvc = 0.0;
        for (int64_t x = 0; x < DK; ++x) dvc += dC[size_t(x * DV + c)] * k[x];
        a.dv[g * DV + c] = float(st.I * dvc);
      }
      a.di[g] = float(dI * st.I);
      a.df[g] = float(dF * st.F * sigmoid(-p_.f[g]));  // dlogsigmoid(x)/dx = 1 − σ(x) = σ(−x), exact for large x
      for (auto& d : dC) d = has_prev ? d * st.F : 0.0;
      for (auto& d : dn) d = has_prev ? d * st.F : 0.0;
    }
    if (!a.dc0) return;
    for (int64_t j = 0; j < DK * DV; ++j) a.dc0[bh_ * DK * DV + j] = float(dC[size_t(j)]);
    for (int64_t j = 0; j < DK; ++j) a.dn0[bh_ * DK + j] = float(dn[size_t(j)]);
  }

 private:
  const Problem& p_;
  int64_t b_, bh_;
};

class Reference final : public Implementation {
 public:
  std::string name() const override { return "reference"; }
  std::string description() const override { return "the recurrence step by step in double, the oracle"; }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU) return Availability::no("the reference runs on host memory");
    return Availability::yes();
  }
  void forward(const Problem& p, const ForwardOut& out) const override {
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.NH; ++h) Head(p, b, h).forward(out);
  }
  void backward(const Problem& p, const BackwardArgs& a) const override {
    // Every step's state is kept: bounded so that a benchmark shape fails by name, not by swapping.
    check(double(p.S) * double(p.DK) * double(p.DV) <= double(1 << 26), ErrorCode::kUnsupported,
          std::string(kKernelName) + ": the reference backward keeps S·DHQK·DHV doubles per head; limit 2^26");
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.NH; ++h) Head(p, b, h).backward(a);
  }
};

}  // namespace

std::unique_ptr<Implementation> make_reference_implementation() { return std::make_unique<Reference>(); }

}  // namespace tessera::mlstm
