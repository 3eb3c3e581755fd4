// mlstm: the reference against hand-computed steps and central finite differences; the API's
// error paths (an error touches no output); large gates; two calls = one call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <limits>
#include <vector>

#include "kernels/mlstm/testing.h"
#include "tessera/error.h"
#include "tessera/mlstm.h"
#include "cpu_backend.h"

namespace tessera {
namespace {

using mlstm::testing::CaseData;
using mlstm::testing::CaseSpec;
using mlstm::testing::forward_backward_outputs;

TensorView f32(std::vector<float>& x, Shape s) { return TensorView(x.data(), DType::kF32, std::move(s)); }

struct Hand {  // B = NH = 1, S = 2, DHQK = DHV = 1
  std::vector<float> q{2, 1}, k{1, 2}, v{3, -1}, i{0, 1}, f{0, 0}, h{-7, -7}, c{-7}, n{-7}, m{-7};
  std::vector<int32_t> r{0, 0};
  mlstm::Inputs in(bool resets = false) {
    mlstm::Inputs x{f32(q, {1, 1, 2, 1}), f32(k, {1, 1, 2, 1}), f32(v, {1, 1, 2, 1}), f32(i, {1, 1, 2}), f32(f, {1, 1, 2})};
    if (resets) x.resets = TensorView(r.data(), DType::kI32, {1, 2});
    return x;
  }
  mlstm::LastStates last() { return {f32(c, {1, 1, 1, 1}), f32(n, {1, 1, 1}), f32(m, {1, 1})}; }
};

mlstm::Options impl_opt(const std::string& impl, double eps = 0.0) {
  mlstm::Options o;
  o.implementation = impl;
  o.eps = eps;
  return o;
}

// logf = log ½. t=0: m = max(log ½, 0) = 0, C = 3, n = 1, h = 3·2 / max(2, 1) = 3.
// t=1: m = max(log ½, 1) = 1, F = ½e^{-1}, I = 1: C = 1.5/e − 2, n = 0.5/e + 2, h = C/n.
TEST(MlstmReference, MatchesHandComputedSteps) {
  for (const char* impl : tessera::testing::reference_and_cpu()) {
    Hand x;
    mlstm::forward(x.in(), f32(x.h, {1, 1, 2, 1}), x.last(), impl_opt(impl));
    const double C = 1.5 / std::exp(1.0) - 2.0, n = 0.5 / std::exp(1.0) + 2.0;
    EXPECT_NEAR(x.h[0], 3.0, 1e-6) << impl;
    EXPECT_NEAR(x.h[1], C / n, 1e-6) << impl;
    EXPECT_NEAR(x.c[0], C, 1e-6) << impl;
    EXPECT_NEAR(x.n[0], n, 1e-6) << impl;
    EXPECT_NEAR(x.m[0], 1.0, 1e-6) << impl;
  }
}

// A reset at t = 1 starts from zero with m = 0: m = max(log ½, 1) = 1, C = −2, n = 2, h = −1.
// A reset at t = 0 has no effect. eps = 1e-6 enters the denominator: h0 = 6 / (2 + 1e-6).
TEST(MlstmReference, ResetsAndEps) {
  for (const char* impl : tessera::testing::reference_and_cpu()) {
    Hand x;
    x.r = {1, 1};
    mlstm::forward(x.in(true), f32(x.h, {1, 1, 2, 1}), x.last(), impl_opt(impl, 1e-6));
    EXPECT_NEAR(x.h[0], 6.0 / (2.0 + 1e-6), 1e-7) << impl;
    EXPECT_NEAR(x.h[1], -2.0 / (2.0 + 1e-6), 1e-6) << impl;
    EXPECT_NEAR(x.c[0], -2.0, 1e-6) << impl;
    EXPECT_NEAR(x.m[0], 1.0, 1e-6) << impl;
  }
}

// The lower bound exp(−m) of the denominator: q = 0.1 at t = 0 gives max(0.1, e^0) = 1, h = 0.3.
TEST(MlstmReference, DenominatorLowerBound) {
  Hand x;
  x.q[0] = 0.1f;
  mlstm::forward(x.in(), f32(x.h, {1, 1, 2, 1}), {}, impl_opt("reference"));
  EXPECT_NEAR(x.h[0], 0.3, 1e-6);
}

// ---- central finite differences of the reference ----
// loss = Σ dh·h (+ Σ dc_last·c_last + Σ dn_last·n_last), all in f32 through the API: a step of
// 1e-2 keeps the O(step²) truncation and the f32 rounding of the outputs (~1e-7 relative,
// divided by the step) well under the 3e-3 tolerance relative to the largest gradient.
double loss(const CaseData& d, bool with_states, double eps) {
  const Shape hs = d.v.shape();
  Tensor h = Tensor::zeros(DType::kF32, hs), c = Tensor::zeros(DType::kF32, d.dc_last.shape()),
         n = Tensor::zeros(DType::kF32, d.dn_last.shape()), m = Tensor::zeros(DType::kF32, {hs[0], hs[1]});
  mlstm::forward(d.inputs(), h.view(), {c.view(), n.view(), m.view()}, impl_opt("reference", eps));
  double l = 0.0;
  for (int64_t j = 0; j < h.numel(); ++j) l += double(h.data_as<float>()[j]) * d.dh.data_as<float>()[j];
  if (!with_states) return l;
  for (int64_t j = 0; j < c.numel(); ++j) l += double(c.data_as<float>()[j]) * d.dc_last.data_as<float>()[j];
  for (int64_t j = 0; j < n.numel(); ++j) l += double(n.data_as<float>()[j]) * d.dn_last.data_as<float>()[j];
  return l;
}

void expect_fd(CaseData& d, Tensor& x, const Tensor& grad, const char* name, bool with_states, double eps) {
  double scale = 0.0;
  for (int64_t j = 0; j < grad.numel(); ++j) scale = std::max(scale, std::fabs(double(grad.data_as<float>()[j])));
  for (int64_t j = 0; j < x.numel(); ++j) {
    float& e = x.data_as<float>()[j];
    const float keep = e;
    e = keep + 1e-2f;
    const float up = e;
    const double lp = loss(d, with_states, eps);
    e = keep - 1e-2f;
    const float down = e;
    const double lm = loss(d, with_states, eps);
    e = keep;
    const double fd = (lp - lm) / (double(up) - double(down));
    EXPECT_NEAR(grad.data_as<float>()[j], fd, 3e-3 * std::max(scale, 1.0)) << name << "[" << j << "]";
  }
}

struct Grads {
  Tensor dq, dk, dv, di, df, dc0, dn0;
};
Grads reference_grads(const CaseData& d, bool with_states, double eps) {
  Grads g{Tensor::zeros(DType::kF32, d.q.shape()), Tensor::zeros(DType::kF32, d.k.shape()),
          Tensor::zeros(DType::kF32, d.v.shape()), Tensor::zeros(DType::kF32, d.i.shape()),
          Tensor::zeros(DType::kF32, d.f.shape()), Tensor::zeros(DType::kF32, d.dc_last.shape()),
          Tensor::zeros(DType::kF32, d.dn_last.shape())};
  mlstm::backward(d.inputs(), d.dh.view(),
                  {g.dq.view(), g.dk.view(), g.dv.view(), g.di.view(), g.df.view(), g.dc0.view(), g.dn0.view()},
                  impl_opt("reference", eps), with_states ? d.dc_last.view() : TensorView{},
                  with_states ? d.dn_last.view() : TensorView{});
  return g;
}

CaseSpec fd_case() {
  CaseSpec s;
  s.B = 2, s.NH = 1, s.S = 6, s.DK = 3, s.DV = 2;
  s.resets = "pair";  // resets at t = 3 and 4: two in a row
  s.initial_state = true;
  s.seed = 7;
  return s;
}

// eps = 0: the m-constant gradients are exact (the contract), so every input is checked.
TEST(MlstmReference, GradientsMatchFiniteDifferences) {
  CaseData d = mlstm::testing::make_case(fd_case());
  const Grads g = reference_grads(d, false, 0.0);
  expect_fd(d, d.q, g.dq, "dq", false, 0.0);
  expect_fd(d, d.k, g.dk, "dk", false, 0.0);
  expect_fd(d, d.v, g.dv, "dv", false, 0.0);
  expect_fd(d, d.i, g.di, "di", false, 0.0);
  expect_fd(d, d.f, g.df, "df", false, 0.0);
  expect_fd(d, d.c0, g.dc0, "dc0", false, 0.0);
  expect_fd(d, d.n0, g.dn0, "dn0", false, 0.0);
}

// Upstream gradients of the (m-stabilized) last state: checked through the inputs the
// stabilizer does not depend on (q, k, v, c0, n0), with the default eps.
TEST(MlstmReference, LastStateGradientsMatchFiniteDifferences) {
  CaseData d = mlstm::testing::make_case(fd_case());
  const Grads g = reference_grads(d, true, 1e-6);
  expect_fd(d, d.q, g.dq, "dq", true, 1e-6);
  expect_fd(d, d.k, g.dk, "dk", true, 1e-6);
  expect_fd(d, d.v, g.dv, "dv", true, 1e-6);
  expect_fd(d, d.c0, g.dc0, "dc0", true, 1e-6);
  expect_fd(d, d.n0, g.dn0, "dn0", true, 1e-6);
}


// ---- large gates, two calls = one call (reference and cpu) ----
TEST(Mlstm, LargeGatesStayFinite) {
  for (const char* impl : tessera::testing::reference_and_cpu())
    for (float big : {100.0f, 1000.0f}) {
      CaseSpec s;
      s.S = 24, s.resets = "random", s.initial_state = true;
      s.opt.chunk_size = 8;
      CaseData d = mlstm::testing::make_case(s);
      for (int64_t j = 0; j < d.i.numel(); ++j) {  // all four sign combinations, in runs
        d.i.data_as<float>()[j] = (j / 3) % 2 ? big : -big;
        d.f.data_as<float>()[j] = (j / 5) % 2 ? big : -big;
      }
      const auto outputs = forward_backward_outputs(d, impl, 8);
      for (size_t o = 0; o < outputs.size(); ++o)
        for (size_t j = 0; j < outputs[o].size(); ++j)
          ASSERT_TRUE(std::isfinite(outputs[o][j])) << impl << " gates ±" << big << " output " << o << " element " << j;
    }
}

// Forget gates near 1 (f = 40: σ(−f) = 4e-18): df = dF·F·σ(−f) keeps its relative precision in
// the reference (1 − σ(f) was 0 in double past f ≈ 37) and agrees with cpu's σ(−f) = 1/(1 + e^f).
TEST(Mlstm, ForgetGradientOfGatesNearOneKeepsItsPrecision) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  CaseSpec s;
  s.NH = 1, s.S = 4, s.DK = 2, s.DV = 2, s.initial_state = true;
  CaseData d = mlstm::testing::make_case(s);
  for (int64_t t = 0; t < s.S; ++t) d.f.data_as<float>()[t] = 40.f;
  const std::vector<float> want = forward_backward_outputs(d, "reference", 4)[8], got = forward_backward_outputs(d, "cpu", 4)[8];
  for (int64_t t = 0; t < s.S; ++t) {
    EXPECT_NE(want[t], 0.f) << t;
    EXPECT_NEAR(got[t], want[t], 1e-3 * std::abs(want[t])) << t;
  }
}

// A forget gate that erases the state (f = −inf, or −FLT_MAX as masked_fill(finfo.min) writes):
// F = 0 there, so the step acts as a reset of its head, with m = i. The chunkwise sums took
// logσ(f) into their running sum: −inf made h NaN to the chunk's end, −FLT_MAX absorbed every
// later gate of the chunk (h = {1, 2, 2.5, 3} here instead of {1, 2, 8/3, 24/7}).
TEST(Mlstm, ErasingForgetGatesMatchTheReference) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  for (float erase : {-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::max()}) {
    CaseSpec one;  // the 1×1 case: q = k = 1, i = 0, v = 1..4, the state erased at t = 1
    one.NH = 1, one.S = 4, one.DK = 1, one.DV = 1;
    CaseData d = mlstm::testing::make_case(one);
    for (int64_t t = 0; t < 4; ++t) {
      d.q.data_as<float>()[t] = d.k.data_as<float>()[t] = 1.f, d.v.data_as<float>()[t] = float(t + 1);
      d.i.data_as<float>()[t] = 0.f, d.f.data_as<float>()[t] = t == 1 ? erase : 0.f;
    }
    Tensor h = Tensor::zeros(DType::kF32, {1, 1, 4, 1});
    mlstm::forward(d.inputs(), h.view(), {}, impl_opt("cpu"));
    const float want[4] = {1.f, 2.f, 8.f / 3.f, 24.f / 7.f};
    for (int t = 0; t < 4; ++t) EXPECT_NEAR(h.data_as<float>()[t], want[t], 1e-6) << "f[1] = " << erase << ", t = " << t;
    // Random cases: erasing gates at step 0 (with an initial state), at a chunk's first and last
    // step, twice in one chunk, beside resets; S = 29 leaves a tail chunk; every output.
    const CaseData r = mlstm::testing::erasing_forget_case(erase);
    const auto want_all = forward_backward_outputs(r, "reference", 8), got = forward_backward_outputs(r, "cpu", 8);
    for (size_t o = 0; o < got.size(); ++o) {
      double scale = 0.0;
      for (float v : want_all[o]) scale = std::max(scale, double(std::abs(v)));
      for (size_t j = 0; j < got[o].size(); ++j)
        ASSERT_NEAR(got[o][j], want_all[o][j], 1e-4 * (1.0 + scale)) << "output " << o << " element " << j << " f = " << erase;
    }
  }
}

// An output that shares memory with an input (an in-place state carry c_last = c0, a gradient
// written over its input df = f) or with another output is refused before anything is written:
// the cpu backend reads f after writing df, and an autotune sweep zeroed c_last (= c0) first.
TEST(Mlstm, OutputsThatAliasInputsAreRefused) {
  CaseSpec s;
  s.S = 9, s.initial_state = true;
  CaseData d = mlstm::testing::make_case(s);
  Tensor h = Tensor::zeros(DType::kF32, d.v.shape()), c = Tensor::zeros(DType::kF32, d.c0.shape()),
         n = Tensor::zeros(DType::kF32, d.n0.shape()), m = Tensor::zeros(DType::kF32, d.m0.shape());
  const auto refused = [](const std::function<void()>& call, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const std::vector<float> c0(d.c0.data_as<float>(), d.c0.data_as<float>() + d.c0.numel());
  refused([&] { mlstm::forward(d.inputs(), h.view(), {d.c0.view(), n.view(), m.view()}); }, "c_last shares memory with c0");
  const TensorView m_in_n(n.view().data, DType::kF32, d.m0.shape());  // m_last over n_last's first elements
  refused([&] { mlstm::forward(d.inputs(), h.view(), {c.view(), n.view(), m_in_n}); }, "n_last shares memory with m_last");
  EXPECT_TRUE(std::equal(c0.begin(), c0.end(), d.c0.data_as<float>())) << "c0 was written";
  Grads g{Tensor::zeros(DType::kF32, d.q.shape()), Tensor::zeros(DType::kF32, d.k.shape()),
          Tensor::zeros(DType::kF32, d.v.shape()), Tensor::zeros(DType::kF32, d.i.shape()),
          Tensor::zeros(DType::kF32, d.f.shape()), Tensor::zeros(DType::kF32, d.c0.shape()),
          Tensor::zeros(DType::kF32, d.n0.shape())};
  refused([&] {
    mlstm::backward(d.inputs(), d.dh.view(), {g.dq.view(), g.dk.view(), g.dv.view(), g.di.view(), d.f.view(), g.dc0.view(), g.dn0.view()});
  }, "df shares memory with f");
  refused([&] {
    mlstm::backward(d.inputs(), d.dh.view(), {g.dq.view(), g.dk.view(), d.dh.view(), g.di.view(), g.df.view(), g.dc0.view(), g.dn0.view()});
  }, "dv shares memory with dh");
  // Apart, the same buffers are fine.
  mlstm::forward(d.inputs(), h.view(), {c.view(), n.view(), m.view()});
}

Tensor slice_s(const Tensor& t, int64_t s0, int64_t s1, int64_t seq_dim) {  // [.., S, ..] f32 or i32
  Shape shape = t.shape();
  const int64_t S = shape[seq_dim];
  int64_t outer = 1, inner = 1;
  for (int64_t j = 0; j < seq_dim; ++j) outer *= shape[j];
  for (size_t j = seq_dim + 1; j < shape.size(); ++j) inner *= shape[j];
  shape[seq_dim] = s1 - s0;
  Tensor o = Tensor::empty(t.dtype(), shape);
  const size_t es = dtype_size(t.dtype());
  for (int64_t a = 0; a < outer; ++a)
    std::memcpy(static_cast<char*>(o.data()) + a * (s1 - s0) * inner * es,
                static_cast<const char*>(t.data()) + (a * S + s0) * inner * es, (s1 - s0) * inner * es);
  return o;
}

TEST(Mlstm, TwoCallsEqualOneCall) {
  for (const char* impl : tessera::testing::reference_and_cpu()) {
    CaseSpec s;
    s.B = 2, s.S = 21, s.resets = "random", s.initial_state = true;
    const int64_t cut = 11;
    CaseData d = mlstm::testing::make_case(s);
    // No reset at the cut: the second call ignores one at its step 0 (it starts from c1, n1, m1).
    for (int64_t b = 0; b < s.B; ++b) d.resets.data_as<int32_t>()[b * s.S + cut] = 0;
    mlstm::Options o = impl_opt(impl, 1e-6);
    o.chunk_size = 4;
    auto run = [&](const mlstm::Inputs& in, int64_t S, Tensor& h, Tensor& c, Tensor& n, Tensor& m) {
      h = Tensor::zeros(DType::kF32, {s.B, s.NH, S, s.DV}), c = Tensor::zeros(DType::kF32, d.c0.shape());
      n = Tensor::zeros(DType::kF32, d.n0.shape()), m = Tensor::zeros(DType::kF32, d.m0.shape());
      mlstm::forward(in, h.view(), {c.view(), n.view(), m.view()}, o);
    };
    Tensor h, c, n, m, h1, c1, n1, m1, h2, c2, n2, m2;
    run(d.inputs(), s.S, h, c, n, m);
    const Tensor q1 = slice_s(d.q, 0, cut, 2), k1 = slice_s(d.k, 0, cut, 2), v1 = slice_s(d.v, 0, cut, 2),
                 i1 = slice_s(d.i, 0, cut, 2), f1 = slice_s(d.f, 0, cut, 2), r1 = slice_s(d.resets, 0, cut, 1);
    const Tensor q2 = slice_s(d.q, cut, s.S, 2), k2 = slice_s(d.k, cut, s.S, 2), v2 = slice_s(d.v, cut, s.S, 2),
                 i2 = slice_s(d.i, cut, s.S, 2), f2 = slice_s(d.f, cut, s.S, 2), r2 = slice_s(d.resets, cut, s.S, 1);
    run({q1.view(), k1.view(), v1.view(), i1.view(), f1.view(), r1.view(), d.c0.view(), d.n0.view(), d.m0.view()}, cut,
        h1, c1, n1, m1);
    run({q2.view(), k2.view(), v2.view(), i2.view(), f2.view(), r2.view(), c1.view(), n1.view(), m1.view()},
        s.S - cut, h2, c2, n2, m2);
    const Tensor ha = slice_s(h, 0, cut, 2), hb = slice_s(h, cut, s.S, 2);
    // Same terms, same order up to the chunk boundaries: f32 rounding only.
    for (int64_t j = 0; j < ha.numel(); ++j) EXPECT_NEAR(h1.data_as<float>()[j], ha.data_as<float>()[j], 1e-5) << impl;
    for (int64_t j = 0; j < hb.numel(); ++j) EXPECT_NEAR(h2.data_as<float>()[j], hb.data_as<float>()[j], 1e-4) << impl;
    for (int64_t j = 0; j < c.numel(); ++j) EXPECT_NEAR(c2.data_as<float>()[j], c.data_as<float>()[j], 1e-4) << impl;
    for (int64_t j = 0; j < n.numel(); ++j) EXPECT_NEAR(n2.data_as<float>()[j], n.data_as<float>()[j], 1e-4) << impl;
    for (int64_t j = 0; j < m.numel(); ++j) EXPECT_NEAR(m2.data_as<float>()[j], m.data_as<float>()[j], 1e-5) << impl;
  }
}

// ---- API errors: one line, thrown before any output is written ----
TEST(MlstmApi, ErrorsNameTheProblem) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();  // some cases name the cpu implementation
  std::vector<float> q(4), k(4), v(4), i(2), f(2), h(4, -7.0f);
  auto call = [&](mlstm::Inputs in, TensorView hv, mlstm::Options o = {}) {
    try {
      mlstm::forward(in, hv, {}, o);
    } catch (const Error& e) {
      for (float x : h) EXPECT_EQ(x, -7.0f);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const mlstm::Inputs ok{f32(q, {1, 1, 2, 2}), f32(k, {1, 1, 2, 2}), f32(v, {1, 1, 2, 2}), f32(i, {1, 1, 2}), f32(f, {1, 1, 2})};
  const TensorView hv = f32(h, {1, 1, 2, 2});
  auto has = [](const std::string& msg, const std::string& needle) {
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  };
  mlstm::Inputs in = ok;
  in.q = f32(q, {1, 2, 2});
  has(call(in, hv), "q must be [B, NH, S, DHQK], got [1, 2, 2]");
  in = ok, in.q = f32(q, {1, 1, 0, 2}), in.k = f32(k, {1, 1, 0, 2}), in.v = f32(v, {1, 1, 0, 2});
  in.i = f32(i, {1, 1, 0}), in.f = f32(f, {1, 1, 0});
  has(call(in, hv), "S must be >= 1");
  in = ok, in.k = f32(k, {1, 1, 2, 1});
  has(call(in, hv), "k must be [B=1, NH=1, S=2, DHQK=2], got [1, 1, 2, 1]");
  in = ok, in.v = TensorView(v.data(), DType::kBF16, {1, 1, 2, 2});
  has(call(in, hv), "v must be f32 like q, got bf16");
  in = ok, in.i = f32(i, {1, 2});
  has(call(in, hv), "i must be [B=1, NH=1, S=2], got [1, 2]");
  in = ok, in.f = TensorView(f.data(), DType::kBF16, {1, 1, 2});
  has(call(in, hv), "f must be f32 like i, got bf16");
  std::vector<int32_t> r(4);
  in = ok, in.resets = TensorView(r.data(), DType::kI32, {2, 2});
  has(call(in, hv), "resets must be [B=1, S=2], got [2, 2]");
  in = ok, in.resets = f32(i, {1, 2});
  has(call(in, hv), "resets must be int32 or int64, got f32");
  std::vector<float> c0(4), n0(2), m0(1);
  in = ok, in.c0 = f32(c0, {1, 1, 2, 2});
  has(call(in, hv), "c0, n0 and m0 go together");
  in = ok, in.c0 = f32(c0, {1, 1, 2, 2}), in.n0 = f32(n0, {1, 1, 2}), in.m0 = f32(m0, {1});
  has(call(in, hv), "m0 must be [B=1, NH=1], got [1]");
  has(call(ok, f32(h, {1, 1, 2, 1})), "h must be [B=1, NH=1, S=2, DHV=2], got [1, 1, 2, 1]");
  mlstm::Options o;
  o.eps = -1;
  has(call(ok, hv, o), "eps must be finite in f32 and >= 0");
  o.eps = 1e39;  // inf in f32
  has(call(ok, hv, o), "eps must be finite in f32 and >= 0");
  o = {}, o.chunk_size = -3;
  has(call(ok, hv, o), "chunk_size must be >= 1");
  q[0] = NAN;
  o = {}, o.check_finite = true;
  has(call(ok, hv, o), "q contains NaN or Inf");
  q[0] = 0;
  {  // the upstream gradients of the last states too (dc_last and dn_last were not scanned)
    std::vector<float> dh(4, 0.5f), dc(4, 0.f), dn(2, 0.f), g(4, -7.f), gk(4, -7.f), gv(4, -7.f), gi(2, -7.f),
        gf(2, -7.f);
    const mlstm::Grads gr{f32(g, {1, 1, 2, 2}), f32(gk, {1, 1, 2, 2}), f32(gv, {1, 1, 2, 2}), f32(gi, {1, 1, 2}),
                          f32(gf, {1, 1, 2})};
    for (auto [vec, name] : {std::pair{&dc, "dc_last"}, {&dn, "dn_last"}}) {
      (*vec)[1] = INFINITY;
      try {
        mlstm::backward(ok, f32(dh, {1, 1, 2, 2}), gr, o, f32(dc, {1, 1, 2, 2}), f32(dn, {1, 1, 2}));
        ADD_FAILURE() << name << " with Inf accepted under check_finite";
      } catch (const Error& e) {
        has(e.what(), std::string(name) + " contains NaN or Inf");
      }
      (*vec)[1] = 0.f;
      for (float x : g) EXPECT_EQ(x, -7.0f);
    }
  }
  o = {}, o.implementation = "cpu", o.chunk_size = 4096;
  has(call(ok, hv, o), "chunk_size must be <= 1024 (cpu)");
  std::vector<float> big(2 * 2048);
  in = ok, in.q = f32(big, {1, 1, 2, 2048}), in.k = f32(big, {1, 1, 2, 2048});
  o = {}, o.implementation = "cpu";
  has(call(in, hv, o), "DHQK and DHV must be <= 1024 (cpu)");
  // Every array lives on q's device; a device call runs on the cuda backend or fails by name
  // (here: no usable device, or host memory labelled cuda:0 refused by the backend).
  in = ok, in.k.device = Device::cuda();
  has(call(in, hv), "k is on cuda:0 but q is on cpu");
  in = ok;
  for (TensorView* t : {&in.q, &in.k, &in.v, &in.i, &in.f}) t->device = Device::cuda();
  TensorView hd = hv;
  hd.device = Device::cuda();
  has(call(in, hv), "h is on cpu but q is on cuda:0");
  EXPECT_NE(call(in, hd), "accepted");
}

// forward_backward checks the forward's outputs and the backward's arguments, all before it writes
// anything: a wrong h, a wrong gradient, a wrong dh, a missing dc0 each throw with every output
// untouched.
TEST(MlstmApi, ForwardBackwardChecksEverythingFirst) {
  CaseSpec s;
  s.initial_state = true;
  const CaseData d = mlstm::testing::make_case(s);
  auto sentinel = [](const Shape& shape) {
    Tensor t = Tensor::empty(DType::kF32, shape);
    std::fill_n(t.data_as<float>(), t.numel(), -7.0f);
    return t;
  };
  Tensor h = sentinel(d.v.shape()), dq = sentinel(d.q.shape()), dk = sentinel(d.k.shape()), dv = sentinel(d.v.shape()),
         di = sentinel(d.i.shape()), df = sentinel(d.f.shape()), dc0 = sentinel(d.c0.shape()), dn0 = sentinel(d.n0.shape());
  const mlstm::Grads g{dq.view(), dk.view(), dv.view(), di.view(), df.view(), dc0.view(), dn0.view()};
  auto message = [&](const TensorView& hv, const TensorView& dh, const mlstm::Grads& gr) {
    try {
      mlstm::forward_backward(d.inputs(), hv, {}, dh, gr);
    } catch (const Error& e) {
      for (const Tensor* t : {&h, &dq, &dk, &dv, &di, &df, &dc0, &dn0})
        for (int64_t j = 0; j < t->numel(); ++j) EXPECT_EQ(t->data_as<float>()[j], -7.0f) << e.what();
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  auto has = [](const std::string& msg, const std::string& needle) { EXPECT_NE(msg.find(needle), std::string::npos) << msg; };
  Tensor small = sentinel({1, 1, 1, 1});
  has(message(small.view(), d.dh.view(), g), "h must be");
  has(message(h.view(), small.view(), g), "dh must be");
  mlstm::Grads bad = g;
  bad.dk = small.view();
  has(message(h.view(), d.dh.view(), bad), "dk must be");
  bad = g, bad.dc0 = TensorView{}, bad.dn0 = TensorView{};
  has(message(h.view(), d.dh.view(), bad), "dc0 and dn0 are required");
  EXPECT_EQ(message(h.view(), d.dh.view(), g), "accepted");
}

TEST(MlstmApi, BackwardInitialStateGradientsGoWithTheInitialState) {
  CaseSpec s;
  s.initial_state = true;
  const CaseData d = mlstm::testing::make_case(s);
  auto sentinel = [](const Tensor& like) {
    Tensor t = Tensor::empty(DType::kF32, like.shape());
    std::fill_n(t.data_as<float>(), t.numel(), -7.0f);
    return t;
  };
  Tensor dq = sentinel(d.q), dk = sentinel(d.k), dv = sentinel(d.v), di = sentinel(d.i), df = sentinel(d.f),
         dc0 = sentinel(d.c0), dn0 = sentinel(d.n0);
  auto message = [&](const mlstm::Inputs& in, const mlstm::Grads& g) {
    try {
      mlstm::backward(in, d.dh.view(), g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  mlstm::Inputs no_state = d.inputs();
  no_state.c0 = no_state.n0 = no_state.m0 = TensorView{};
  EXPECT_NE(message(d.inputs(), {dq.view(), dk.view(), dv.view(), di.view(), df.view()}).find("dc0 and dn0 are required"),
            std::string::npos);
  EXPECT_NE(message(no_state, {dq.view(), dk.view(), dv.view(), di.view(), df.view(), dc0.view(), dn0.view()})
                .find("only with an initial state"),
            std::string::npos);
  for (const Tensor* t : {&dq, &dk, &dv, &di, &df, &dc0, &dn0})
    for (int64_t j = 0; j < t->numel(); ++j) ASSERT_EQ(t->data_as<float>()[j], -7.0f);
}

}  // namespace
}  // namespace tessera
