// slstm: the reference against hand-computed steps and central finite differences, saturated
// gates, and two calls chained through the last state = one call. Every implementation's parity
// with the reference is the check grid (AllKernels/Parity.CheckGrid/slstm_*) and slstm_cpu_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/random.h"
#include "harness/process.h"
#include "kernels/slstm/testing.h"
#include "tessera/error.h"
#include "tessera/slstm.h"
#include "cpu_backend.h"

namespace tessera {
namespace {

using slstm::testing::CaseData;
using slstm::testing::CaseSpec;

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double logsig(double x) { return -std::log1p(std::exp(-x)); }

struct Out {
  Tensor h, hl, cl, nl, ml, dwx, dr, db, dh0, dc0, dn0;
};

TensorView v(const Tensor& t) { return t.numel() ? t.view() : TensorView{}; }

Out run(const CaseSpec& s, const CaseData& d, const std::string& impl, bool grad, int64_t batch_block = 0,
        DType h_dtype = DType::kF32) {
  const Shape st{s.B, s.NH, s.DH};
  Out o;
  o.h = Tensor::zeros(h_dtype, {s.B, s.S, s.NH, s.DH});
  o.hl = Tensor::zeros(DType::kF32, st), o.cl = Tensor::zeros(DType::kF32, st);
  o.nl = Tensor::zeros(DType::kF32, st), o.ml = Tensor::zeros(DType::kF32, st);
  slstm::Options opt;
  opt.implementation = impl;
  opt.batch_block = batch_block;
  const slstm::Outputs out{o.h.view(), o.hl.view(), o.cl.view(), o.nl.view(), o.ml.view()};
  if (!grad) {
    slstm::forward(d.inputs(), out, opt);
    return o;
  }
  o.dwx = Tensor::zeros(s.dtype, d.wx.shape()), o.dr = Tensor::zeros(s.dtype, d.r.shape());
  o.db = Tensor::zeros(s.dtype, d.b.shape());
  if (s.initial) o.dh0 = Tensor::zeros(DType::kF32, st), o.dc0 = Tensor::zeros(DType::kF32, st), o.dn0 = Tensor::zeros(DType::kF32, st);
  slstm::forward_backward(d.inputs(), d.upstream(), out, {o.dwx.view(), o.dr.view(), o.db.view(), v(o.dh0), v(o.dc0), v(o.dn0)}, opt);
  return o;
}

TEST(SlstmReference, MatchesHandSteps) {
  CaseSpec s;
  s.B = 1, s.S = 2, s.NH = 1, s.DH = 1;
  CaseData d = slstm::testing::make_case(s);
  const float wx[2][4] = {{0.5f, 1.0f, 0.3f, -0.2f}, {-0.4f, 2.0f, -0.7f, 0.6f}};
  const float r[4] = {0.1f, 0.2f, 0.3f, 0.4f}, b[4] = {0.05f, -0.1f, 0.0f, 0.2f};
  for (int t = 0; t < 2; ++t)
    for (int g = 0; g < 4; ++g) d.wx.data_as<float>()[t * 4 + g] = wx[t][g];
  for (int g = 0; g < 4; ++g) d.r.data_as<float>()[g] = r[g], d.b.data_as<float>()[g] = b[g];
  const Out o = run(s, d, "reference", false);
  // t = 0, a first step: m = ī, I = 1, F = 0 (h_{-1} = 0, so no recurrent term).
  const double i0 = 0.55, z0 = 0.3, o0 = 0.0;
  const double c0 = std::tanh(z0), n0 = 1.0, h0 = sig(o0) * c0 / n0, m0 = i0;
  // t = 1: pre = wx + r·h0 + b.
  const double i1 = -0.4 + 0.1 * h0 + 0.05, f1 = 2.0 + 0.2 * h0 - 0.1, z1 = -0.7 + 0.3 * h0, o1 = 0.6 + 0.4 * h0 + 0.2;
  const double m1 = std::max(i1, m0 + logsig(f1));
  const double I1 = std::exp(i1 - m1), F1 = std::exp(m0 + logsig(f1) - m1);
  const double c1 = F1 * c0 + I1 * std::tanh(z1), n1 = F1 * n0 + I1, h1 = sig(o1) * c1 / n1;
  EXPECT_NEAR(o.h.data_as<float>()[0], h0, 1e-6);
  EXPECT_NEAR(o.h.data_as<float>()[1], h1, 1e-6);
  EXPECT_NEAR(o.hl.data_as<float>()[0], h1, 1e-6);
  EXPECT_NEAR(o.cl.data_as<float>()[0], c1, 1e-6);
  EXPECT_NEAR(o.nl.data_as<float>()[0], n1, 1e-6);
  EXPECT_NEAR(o.ml.data_as<float>()[0], m1, 1e-6);
}

// L = Σ dh·h + Σ dh_last·h_last, in double from the outputs.
double loss(const CaseSpec& s, const CaseData& d) {
  const Out o = run(s, d, "reference", false);
  double L = 0;
  for (int64_t i = 0; i < o.h.numel(); ++i) L += double(d.dh.data_as<float>()[i]) * o.h.data_as<float>()[i];
  for (int64_t i = 0; i < o.hl.numel(); ++i)
    L += double(d.dh_last.data_as<float>()[i]) * o.hl.data_as<float>()[i];
  return L;
}

// Central differences with eps = 2^-7 (x ± eps exact in f32 for |x| < 2): the truncation error
// eps²/6·|L'''| is ~1e-5 and the f32 rounding of the outputs (~1e-7 of L's terms, summed) over
// 2·eps ~6e-5; 1e-3 absolute + 1e-3 relative covers both by 10x, and a wrong term (a missing
// gate path, a gradient through a reset) is off by O(0.01..1).
void expect_fd(const CaseSpec& s) {
  CaseData d = slstm::testing::make_case(s);
  d.dc_last = d.dn_last = Tensor{};  // their gradients hold m (not a plain derivative of the outputs)
  const Out g = run(s, d, "reference", true);
  const float eps = 1.0f / 128;
  auto check = [&](Tensor& x, const Tensor& grad, const char* what) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      float& xi = x.data_as<float>()[i];
      const float keep = xi;
      xi = keep + eps;
      const double up = loss(s, d);
      xi = keep - eps;
      const double dn = loss(s, d);
      xi = keep;
      const double fd = (up - dn) / (2.0 * eps), an = grad.data_as<float>()[i];
      EXPECT_NEAR(an, fd, 1e-3 + 1e-3 * std::abs(fd)) << what << "[" << i << "] " << s.name();
    }
  };
  check(d.wx, g.dwx, "dwx");
  check(d.r, g.dr, "dr");
  check(d.b, g.db, "db");
  if (s.initial) check(d.h0, g.dh0, "dh0"), check(d.c0, g.dc0, "dc0"), check(d.n0, g.dn0, "dn0");
}

TEST(SlstmReference, GradientsMatchFiniteDifferences) {
  CaseSpec s;
  s.B = 2, s.S = 4, s.NH = 2, s.DH = 3, s.seed = 7;
  expect_fd(s);
}

TEST(SlstmReference, GradientsMatchFiniteDifferencesWithResetsAndInitialState) {
  CaseSpec s;
  s.B = 2, s.S = 5, s.NH = 1, s.DH = 3, s.seed = 8, s.initial = true, s.resets = "random";
  CaseData probe = slstm::testing::make_case(s);
  int resets = 0;
  for (int64_t i = 0; i < probe.resets.numel(); ++i) resets += (i % s.S) > 0 && probe.resets.data_as<int32_t>()[i];
  ASSERT_GT(resets, 0) << "the case must hold a reset at t >= 1";
  expect_fd(s);
  s.resets = "at1", s.seed = 9;
  expect_fd(s);
}

TEST(SlstmReference, LargeGatesStayFinite) {
  for (const char* impl : tessera::testing::reference_and_cpu()) {
    CaseSpec s;
    s.B = 3, s.S = 20, s.NH = 2, s.DH = 8, s.gate_scale = 50.0f, s.resets = "random", s.initial = true;
    const CaseData d = slstm::testing::make_case(s);
    Out o;
    try {
      o = run(s, d, impl, true);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kNotFound || e.code() == ErrorCode::kUnsupported) continue;  // cpu not built
      throw;
    }
    for (const Tensor* t : {&o.h, &o.hl, &o.cl, &o.nl, &o.ml, &o.dwx, &o.dr, &o.db, &o.dh0, &o.dc0, &o.dn0})
      for (int64_t i = 0; i < t->numel(); ++i) ASSERT_TRUE(std::isfinite(t->data_as<float>()[i])) << impl << " " << i;
    // h is sigmoid(ō) times a weighted mean of tanh values (|·| ≤ 1) and c0/n0 (≤ 2 here).
    for (int64_t i = 0; i < o.h.numel(); ++i) ASSERT_LE(std::abs(o.h.data_as<float>()[i]), 2.0f);
  }
}

// Saturated gates keep their relative accuracy: sigmoid(ō) at ō = −30 is 9.4e-14, not 0 (0.5 +
// 0.5·tanh(ō/2) flushed it below −17), and the f̄ gradient's sigmoid(−f̄) at f̄ = 30 likewise. h and
// dwx of such cells are tiny, so the grid's scale-relative tolerance cannot see a flush: here each
// element is compared relative to itself (1e-3: a few f32 ulp, with room for the cancellation in
// c = F·c_{t−1} + I·tanh z̄ and in the f̄ gradient; a flush to 0 is an error of 1).
TEST(SlstmReference, SaturatedSigmoidsKeepRelativeAccuracy) {
  CaseSpec s;
  s.B = 2, s.S = 3, s.NH = 1, s.DH = 4, s.initial = true;
  CaseData d = slstm::testing::make_case(s);
  for (int64_t i = 0; i < d.wx.numel(); ++i) {
    const int64_t g = (i / s.DH) % 4;
    if (g == 3) d.wx.data_as<float>()[i] = -30.0f - float(i % 3);  // ō: sigmoid ~1e-13
    if (g == 1) d.wx.data_as<float>()[i] = 30.0f + float(i % 3);   // f̄: sigmoid(−f̄) ~1e-13
  }
  const Out want = run(s, d, "reference", true);
  Out got;
  try {
    got = run(s, d, "cpu", true);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kNotFound || e.code() == ErrorCode::kUnsupported) GTEST_SKIP() << e.what();
    throw;
  }
  auto close = [](const Tensor& a, const Tensor& b, const char* what) {
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double x = a.data_as<float>()[i], y = b.data_as<float>()[i];
      ASSERT_LE(std::abs(x - y), 1e-3 * std::abs(y) + 1e-30) << what << " " << i << ": " << x << " vs " << y;
    }
  };
  close(got.h, want.h, "h");
  // dwx of ō (through sigmoid'(ō)) and of f̄ (through sigmoid(−f̄)) are ~1e-13 relative to the others.
  for (int64_t i = 0; i < got.dwx.numel(); ++i) {
    const int64_t g = (i / s.DH) % 4;
    if (g != 1 && g != 3) continue;
    const double x = got.dwx.data_as<float>()[i], y = want.dwx.data_as<float>()[i];
    ASSERT_LE(std::abs(x - y), 1e-3 * std::abs(y) + 1e-30) << "dwx " << i << ": " << x << " vs " << y;
  }
}

// Chaining: the last state of a call on steps [0, S1) fed as the initial state of a call on
// [S1, S) gives the same h as one call on [0, S) (no reset at S1: a reset at a call's t = 0 is
// ignored by the contract).
// The tuned block size of cpu (batch rows per task) changes the partition, not the result: rows
// are independent in the forward (bitwise the same when the step GEMM treats rows alike; 1e-6
// allowed for a different row-tail path), and dr / db sum the blocks' partials in another
// order (f32 sums over B·S = 68 terms of O(1): 1e-5). A negative block is a named error.
TEST(SlstmReference, TheBatchBlockChangesNothingButThePartition) {
  CaseSpec s;
  s.B = 17, s.S = 4, s.NH = 2, s.DH = 8, s.initial = true, s.resets = "random";
  const CaseData d = slstm::testing::make_case(s);
  Out want;
  try {
    want = run(s, d, "cpu", true, 64);
  } catch (const Error& e) {
    GTEST_SKIP() << "cpu not built: " << e.what();
  }
  for (int64_t block : {1, 3, 8}) {
    const Out got = run(s, d, "cpu", true, block);
    auto near = [&](const Tensor& a, const Tensor& b, double tol, const char* what) {
      for (int64_t i = 0; i < a.numel(); ++i)
        ASSERT_NEAR(load_as_f32(a.data(), a.dtype(), i), load_as_f32(b.data(), b.dtype(), i), tol)
            << what << " " << i << " block " << block;
    };
    near(got.h, want.h, 1e-6, "h"), near(got.dwx, want.dwx, 1e-6, "dwx");
    near(got.dr, want.dr, 1e-5, "dr"), near(got.db, want.db, 1e-5, "db");
  }
  try {
    run(s, d, "cpu", false, -1);
    FAIL() << "batch_block -1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch_block must be >= 1"), std::string::npos) << e.what();
  }
}

// The backward's per-task dR partials stay within 256 MiB: B = 64, NH = 8, DH = 256 at
// batch_block = 1 asked for 64 blocks × 8 heads × 1 MiB = 514 MiB of them before (the process's
// peak RSS grew by ~560 MiB); now 31 blocks, and dr matches the default partition's.
TEST(SlstmCpu, WeightGradientPartialsStayWithinTheirBudget) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  CaseSpec s;
  s.B = 64, s.S = 2, s.NH = 8, s.DH = 256;
  const CaseData d = slstm::testing::make_case(s);
  const Out want = run(s, d, "cpu", true);
  if (!harness::reset_peak_rss()) GTEST_SKIP() << "the peak RSS cannot be reset here";
  const size_t before = harness::rss_bytes().value_or(0);
  const Out got = run(s, d, "cpu", true, 1);
  const size_t peak = harness::peak_rss_bytes().value_or(0);
  ASSERT_GT(peak, before);
  // Partials 256 MiB, R packed and transposed 16 MiB, the outputs 13 MiB, the tapes a few MiB.
  EXPECT_LT(peak - before, size_t(384) << 20) << "peak RSS grew by " << ((peak - before) >> 20) << " MiB";
  double m = 0;
  for (int64_t i = 0; i < want.dr.numel(); ++i) m = std::max(m, double(std::abs(want.dr.data_as<float>()[i])));
  ASSERT_GT(m, 0.0);
  for (int64_t i = 0; i < want.dr.numel(); ++i)
    ASSERT_NEAR(got.dr.data_as<float>()[i], want.dr.data_as<float>()[i], 1e-5 * m) << i;
}

// A non-finite pre-activation (check_finite is off by default) gives the cpu the reference's
// non-finite pattern in h and the last state: NaN in any gate, or ī = +inf, makes the cell NaN
// from that step on (its batch row, then every unit through R). cpu's gates (Max, Min, Ge and a
// clamped Exp) turned a NaN ī, f̄ or ō into a finite cell: a diverged projection looked healthy.
TEST(SlstmCpu, NonFinitePreActivationsAsTheReference) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  for (const float bad : {NAN, INFINITY, -INFINITY})
    for (int gate = 0; gate < 4; ++gate) {
      CaseSpec s;
      s.B = 2, s.S = 9, s.NH = 2, s.DH = 8;
      CaseData d = slstm::testing::make_case(s);
      d.wx.data_as<float>()[(((0 * s.S + 4) * 4 + gate) * s.NH + 1) * s.DH + 3] = bad;  // batch 0, step 4, head 1, unit 3
      const Out want = run(s, d, "reference", false), got = run(s, d, "cpu", false);
      int64_t non_finite = 0;
      for (const auto& [w, g] : {std::pair{&want.h, &got.h}, {&want.hl, &got.hl}, {&want.cl, &got.cl}, {&want.nl, &got.nl}})
        for (int64_t e = 0; e < w->numel(); ++e) {
          const float a = w->data_as<float>()[e], b = g->data_as<float>()[e];
          ASSERT_EQ(std::isnan(b), std::isnan(a)) << "gate " << gate << " = " << bad << ", element " << e << ": cpu " << b << ", reference " << a;
          ASSERT_EQ(std::isfinite(b), std::isfinite(a)) << "gate " << gate << " = " << bad << ", element " << e;
          non_finite += !std::isfinite(a);
          if (std::isfinite(a)) EXPECT_NEAR(b, a, 1e-4 * std::max(1.0f, std::abs(a))) << e;
        }
      if (std::isnan(bad)) EXPECT_GT(non_finite, 0) << "gate " << gate;
    }
}

// h in the inputs' dtype (what a bf16 model's next layer takes): each element the f32 h of the same
// call rounded once, forward and fused, on every host implementation; the gradients the same bits.
// Any other dtype of h is refused by name.
TEST(SlstmReference, HInTheInputsDtypeIsTheF32HRoundedOnce) {
  for (const std::string impl : testing::reference_and_cpu()) {
    for (DType dt : {DType::kBF16, DType::kF16})
      for (bool grad : {false, true}) {
        SCOPED_TRACE(impl + " " + dtype_name(dt) + (grad ? " fused" : " forward"));
        CaseSpec s;
        s.dtype = dt, s.B = 3, s.S = 7, s.NH = 2, s.DH = 8, s.initial = true, s.resets = "random";
        const CaseData d = slstm::testing::make_case(s);
        const Out want = run(s, d, impl, grad), got = run(s, d, impl, grad, 0, dt);
        ASSERT_EQ(got.h.dtype(), dt);
        for (int64_t i = 0; i < got.h.numel(); ++i) {
          Tensor r = Tensor::empty(dt, {1});
          store_from_f32(r.data(), dt, 0, want.h.data_as<float>()[i]);
          ASSERT_EQ(load_as_f32(got.h.data(), dt, i), load_as_f32(r.data(), dt, 0)) << "h[" << i << "]";
        }
        if (grad)
          for (const auto& [a, b] : {std::pair{&want.dwx, &got.dwx}, {&want.dr, &got.dr}, {&want.dh0, &got.dh0}})
            ASSERT_EQ(0, std::memcmp(a->data(), b->data(), a->view().nbytes()));
      }
  }
  for (auto [wx, h] : {std::pair{DType::kBF16, DType::kF16}, {DType::kF32, DType::kBF16}}) {
    CaseSpec s;
    s.dtype = wx;
    const CaseData d = slstm::testing::make_case(s);
    try {
      run(s, d, "reference", false, 0, h);
      FAIL() << "h in " << dtype_name(h) << " for " << dtype_name(wx) << " inputs accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("h must be f32"), std::string::npos) << e.what();
    }
  }
}

// An output that shares memory with an input (an in-place state carry h_last = h0, a gradient
// over its upstream) or with another output is refused before anything is written.
TEST(SlstmReference, OutputsThatAliasInputsAreRefused) {
  CaseSpec s;
  s.initial = true;
  CaseData d = slstm::testing::make_case(s);
  const Shape cell{s.B, s.NH, s.DH};
  Tensor h = Tensor::zeros(DType::kF32, {s.B, s.S, s.NH, s.DH}), hl = Tensor::zeros(DType::kF32, cell),
         cl = Tensor::zeros(DType::kF32, cell), nl = Tensor::zeros(DType::kF32, cell), ml = Tensor::zeros(DType::kF32, cell);
  const std::vector<float> h0(d.h0.data_as<float>(), d.h0.data_as<float>() + d.h0.numel());
  try {
    forward(d.inputs(), {h.view(), d.h0.view(), cl.view(), nl.view(), ml.view()});
    ADD_FAILURE() << "h_last = h0 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h_last shares memory with h0"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::equal(h0.begin(), h0.end(), d.h0.data_as<float>())) << "h0 was written";
  Tensor dwx = Tensor::zeros(DType::kF32, d.wx.shape()), dr = Tensor::zeros(DType::kF32, d.r.shape()),
         db = Tensor::zeros(DType::kF32, d.b.shape()), dh0 = Tensor::zeros(DType::kF32, cell),
         dc0 = Tensor::zeros(DType::kF32, cell), dn0 = Tensor::zeros(DType::kF32, cell);
  EXPECT_THROW(backward(d.inputs(), d.upstream(), {dwx.view(), dr.view(), db.view(), d.dh_last.view(), dc0.view(), dn0.view()}), Error);
  EXPECT_THROW(forward(d.inputs(), {h.view(), hl.view(), cl.view(), nl.view(), cl.view()}), Error);
  // Apart, the same buffers are fine.
  forward(d.inputs(), {h.view(), hl.view(), cl.view(), nl.view(), ml.view()});
  backward(d.inputs(), d.upstream(), {dwx.view(), dr.view(), db.view(), dh0.view(), dc0.view(), dn0.view()});
}

TEST(SlstmReference, TwoCallsEqualOneCall) {
  for (const char* impl : tessera::testing::reference_and_cpu()) {
    CaseSpec s;
    s.B = 3, s.S = 9, s.NH = 2, s.DH = 5, s.resets = "random";
    const CaseData d = slstm::testing::make_case(s);
    for (int64_t bi = 0; bi < s.B; ++bi) d.resets.data_as<int32_t>()[bi * s.S + 4] = 0;
    Out whole;
    try {
      whole = run(s, d, impl, false);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kNotFound || e.code() == ErrorCode::kUnsupported) continue;
      throw;
    }
    auto part = [&](int64_t t0, int64_t len, const Out* prev) {
      CaseSpec p = s;
      p.S = len, p.initial = prev != nullptr;
      CaseData q;
      q.wx = Tensor::empty(DType::kF32, {s.B, len, 4, s.NH, s.DH});
      q.resets = Tensor::empty(DType::kI32, {s.B, len});
      const int64_t row = 4 * s.NH * s.DH;
      for (int64_t bi = 0; bi < s.B; ++bi)
        for (int64_t t = 0; t < len; ++t) {
          for (int64_t e = 0; e < row; ++e)
            q.wx.data_as<float>()[(bi * len + t) * row + e] = d.wx.data_as<float>()[(bi * s.S + t0 + t) * row + e];
          q.resets.data_as<int32_t>()[bi * len + t] = d.resets.data_as<int32_t>()[bi * s.S + t0 + t];
        }
      q.r = d.r, q.b = d.b, q.dh = Tensor::zeros(DType::kF32, {s.B, len, s.NH, s.DH});
      if (prev) q.h0 = prev->hl, q.c0 = prev->cl, q.n0 = prev->nl, q.m0 = prev->ml;
      return run(p, q, impl, false);
    };
    const Out a = part(0, 4, nullptr), b = part(4, 5, &a);
    const int64_t cell = s.NH * s.DH;
    for (int64_t bi = 0; bi < s.B; ++bi)
      for (int64_t t = 0; t < s.S; ++t)
        for (int64_t e = 0; e < cell; ++e) {
          const float got = t < 4 ? a.h.data_as<float>()[(bi * 4 + t) * cell + e] : b.h.data_as<float>()[(bi * 5 + t - 4) * cell + e];
          ASSERT_NEAR(got, whole.h.data_as<float>()[(bi * s.S + t) * cell + e], 1e-6) << impl << " b" << bi << " t" << t;
        }
    for (int64_t i = 0; i < whole.hl.numel(); ++i) {
      ASSERT_NEAR(b.hl.data_as<float>()[i], whole.hl.data_as<float>()[i], 1e-6);
      ASSERT_NEAR(b.cl.data_as<float>()[i], whole.cl.data_as<float>()[i], 1e-6);
      ASSERT_NEAR(b.nl.data_as<float>()[i], whole.nl.data_as<float>()[i], 1e-6);
      ASSERT_NEAR(b.ml.data_as<float>()[i], whole.ml.data_as<float>()[i], 1e-6);
    }
  }
}

// Gradients chain through calls: the second call's dh0, dc0, dn0 fed to the first call's backward
// as dh_last, dc_last, dn_last give the one-call gradients (m held in both: a next call depends on
// c·e^m and n·e^m only). Without dc_last/dn_last the gradient through the carried state is lost.
TEST(SlstmReference, TwoCallsChainTheirGradients) {
  for (const char* impl : tessera::testing::reference_and_cpu()) {
    CaseSpec s;
    s.B = 2, s.S = 9, s.NH = 2, s.DH = 5, s.resets = "none", s.seed = 33;
    const CaseData d = slstm::testing::make_case(s);
    const Shape st{s.B, s.NH, s.DH};
    const int64_t row = 4 * s.NH * s.DH;
    // Steps [t0, t0 + len) of a [B, S, ...] tensor whose step holds `width` floats.
    auto slice = [&](const Tensor& src, int64_t t0, int64_t len, Shape shape) {
      const int64_t width = src.numel() / (s.B * s.S);
      shape[1] = len;
      Tensor out = Tensor::empty(DType::kF32, shape);
      for (int64_t bi = 0; bi < s.B; ++bi)
        for (int64_t step = 0; step < len; ++step)
          for (int64_t e = 0; e < width; ++e)
            out.data_as<float>()[(bi * len + step) * width + e] = src.data_as<float>()[(bi * s.S + t0 + step) * width + e];
      return out;
    };
    struct Call {
      Tensor h, hl, cl, nl, ml, dwx, dr, db, dh0, dc0, dn0;
    };
    auto call = [&](const Tensor& wx, const Tensor& dh, const Call* prev, const Call* next) {
      Call c;
      const int64_t len = wx.shape()[1];
      c.h = Tensor::zeros(DType::kF32, {s.B, len, s.NH, s.DH});
      for (Tensor* t : {&c.hl, &c.cl, &c.nl, &c.ml, &c.dh0, &c.dc0, &c.dn0}) *t = Tensor::zeros(DType::kF32, st);
      c.dwx = Tensor::zeros(DType::kF32, wx.shape()), c.dr = Tensor::zeros(DType::kF32, d.r.shape());
      c.db = Tensor::zeros(DType::kF32, d.b.shape());
      slstm::Inputs in{wx.view(), d.r.view(), d.b.view()};
      if (prev) in.h0 = prev->hl.view(), in.c0 = prev->cl.view(), in.n0 = prev->nl.view(), in.m0 = prev->ml.view();
      slstm::Upstream up{dh.view()};
      if (next) up.dh_last = next->dh0.view(), up.dc_last = next->dc0.view(), up.dn_last = next->dn0.view();
      slstm::Options opt;
      opt.implementation = impl;
      const slstm::Grads g{c.dwx.view(), c.dr.view(), c.db.view(), prev ? c.dh0.view() : TensorView{},
                           prev ? c.dc0.view() : TensorView{}, prev ? c.dn0.view() : TensorView{}};
      slstm::forward_backward(in, up, {c.h.view(), c.hl.view(), c.cl.view(), c.nl.view(), c.ml.view()}, g, opt);
      return c;
    };
    const Call whole = call(d.wx, d.dh, nullptr, nullptr);
    const Tensor wx_a = slice(d.wx, 0, 4, d.wx.shape()), wx_b = slice(d.wx, 4, 5, d.wx.shape());
    const Tensor dh_a = slice(d.dh, 0, 4, d.dh.shape()), dh_b = slice(d.dh, 4, 5, d.dh.shape());
    const Call a_fwd = call(wx_a, dh_a, nullptr, nullptr);   // the state the second call starts from
    const Call b = call(wx_b, dh_b, &a_fwd, nullptr);
    const Call a = call(wx_a, dh_a, nullptr, &b);
    // f32 sums over 9 steps of O(1) terms: 2e-5 absolute is a few hundred ulps of the largest.
    for (int64_t bi = 0; bi < s.B; ++bi)
      for (int64_t t = 0; t < s.S; ++t)
        for (int64_t e = 0; e < row; ++e) {
          const float got = t < 4 ? a.dwx.data_as<float>()[(bi * 4 + t) * row + e]
                                  : b.dwx.data_as<float>()[(bi * 5 + t - 4) * row + e];
          ASSERT_NEAR(got, whole.dwx.data_as<float>()[(bi * s.S + t) * row + e], 2e-5) << impl << " dwx b" << bi << " t" << t;
        }
    for (int64_t i = 0; i < whole.dr.numel(); ++i)
      ASSERT_NEAR(a.dr.data_as<float>()[i] + b.dr.data_as<float>()[i], whole.dr.data_as<float>()[i], 2e-5) << impl << " dr";
  }
}

// A reset starts a fresh sequence: h after a reset at t equals a call on steps [t, S) with no
// initial state. (ANCHORS: the peers have no resets; a community fork forces f̄ = −1000 at
// document boundaries, which still feeds h_{t-1} into the gates through r: not a reset.)
TEST(SlstmReference, AResetIsAFreshSequence) {
  for (const char* impl : tessera::testing::reference_and_cpu()) {
    CaseSpec s;
    s.B = 1, s.S = 7, s.NH = 2, s.DH = 6, s.resets = "none", s.seed = 21;
    CaseData d = slstm::testing::make_case(s);
    d.resets = Tensor::zeros(DType::kI32, {1, s.S});
    d.resets.data_as<int32_t>()[3] = 1;
    Out whole;
    try {
      whole = run(s, d, impl, false);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kNotFound || e.code() == ErrorCode::kUnsupported) continue;
      throw;
    }
    CaseSpec t = s;
    t.S = 4;
    CaseData q = d;
    q.resets = Tensor{};
    const int64_t row = 4 * s.NH * s.DH, cell = s.NH * s.DH;
    q.wx = Tensor::empty(DType::kF32, {1, 4, 4, s.NH, s.DH});
    std::copy_n(d.wx.data_as<float>() + 3 * row, 4 * row, q.wx.data_as<float>());
    q.dh = Tensor::zeros(DType::kF32, {1, 4, s.NH, s.DH});
    const Out tail = run(t, q, impl, false);
    for (int64_t i = 0; i < 4 * cell; ++i)
      ASSERT_EQ(tail.h.data_as<float>()[i], whole.h.data_as<float>()[3 * cell + i]) << impl << " " << i;
  }
}

}  // namespace
}  // namespace tessera
