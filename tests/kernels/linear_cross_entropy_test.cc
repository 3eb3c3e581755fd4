// linear_cross_entropy: the reference against hand-computed values and central finite
// differences, the API's validation (clear errors, outputs untouched), shapes and layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cpu_backend.h"
#include "kernels/lce_test_util.h"
#include "kernels/linear_cross_entropy/testing.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy {
namespace {

using lce_test::f32_tensor;
using lce_test::i64_tensor;
using lce_test::scalar_f32;

Options ref_opts(Reduction r = Reduction::kMean) {
  Options o;
  o.implementation = "reference";
  o.reduction = r;
  return o;
}

// ---------------------------------------------------------------------------------------------
// Hand-computed values.

TEST(LceReference, MatchesHandComputedSoftmax) {
  // H=1, V=2, x=[1], w=[[0, ln 3]] -> z=[0, ln 3], lse=ln 4.
  Tensor x = f32_tensor({1, 1}, {1.0f});
  Tensor w = f32_tensor({1, 2}, {0.0f, std::log(3.0f)});
  Tensor y = i64_tensor({1}, {0});
  Inputs in{x, w, std::nullopt, y, std::nullopt};
  Options o = ref_opts(Reduction::kSum);
  o.return_argmax = true;
  Result r = compute(in, o);
  EXPECT_NEAR(r.lse.data_as<float>()[0], std::log(4.0), 1e-6);
  EXPECT_NEAR(r.loss.data_as<float>()[0], std::log(4.0), 1e-6);
  EXPECT_EQ(r.argmax.data_as<int64_t>()[0], 1);
  // Label smoothing (PyTorch definition): (1-ε)·nll + ε·(lse − mean z).
  o.label_smoothing = 0.25;
  r = compute(in, o);
  const double lse = std::log(4.0), nll = lse, smooth = lse - std::log(3.0) / 2;
  EXPECT_NEAR(r.loss.data_as<float>()[0], 0.75 * nll + 0.25 * smooth, 1e-6);
  // z-loss adds λ·lse².
  o.label_smoothing = 0;
  o.z_loss_weight = 0.5;
  r = compute(in, o);
  EXPECT_NEAR(r.loss.data_as<float>()[0], lse + 0.5 * lse * lse, 1e-6);
  // Soft cap c: z = c·tanh(z/c).
  o.z_loss_weight = 0;
  o.softcap = 1.0;
  r = compute(in, o);
  const double z1 = std::tanh(std::log(3.0));
  EXPECT_NEAR(r.loss.data_as<float>()[0], std::log(1 + std::exp(z1)), 1e-6);
}

TEST(LceReference, IgnoredRowsAndWeightedMean) {
  // Two tokens, the second ignored; weights 2 and 5: mean = 2·loss0 / 2.
  Tensor x = f32_tensor({2, 1}, {1.0f, 1.0f});
  Tensor w = f32_tensor({1, 2}, {0.0f, std::log(3.0f)});
  Tensor y = i64_tensor({2}, {0, -100});
  Tensor wt = f32_tensor({2}, {2.0f, 5.0f});
  Inputs in{x, w, std::nullopt, y, wt.view()};
  Result r = compute(in, ref_opts(Reduction::kMean));
  EXPECT_NEAR(r.loss.data_as<float>()[0], std::log(4.0), 1e-6);
  r = compute(in, ref_opts(Reduction::kSum));
  EXPECT_NEAR(r.loss.data_as<float>()[0], 2 * std::log(4.0), 1e-6);
  r = compute(in, ref_opts(Reduction::kNone));
  EXPECT_NEAR(r.loss.data_as<float>()[0], 2 * std::log(4.0), 1e-6);
  EXPECT_EQ(r.loss.data_as<float>()[1], 0.0f);
  // With skip_ignored (the default) the ignored row was skipped: lse 0; without it, its real
  // logsumexp.
  EXPECT_EQ(r.lse.data_as<float>()[1], 0.0f);
  Options all_rows = ref_opts(Reduction::kNone);
  all_rows.skip_ignored = false;
  r = compute(in, all_rows);
  EXPECT_NEAR(r.loss.data_as<float>()[0], 2 * std::log(4.0), 1e-6);
  EXPECT_NEAR(r.lse.data_as<float>()[1], std::log(4.0), 1e-6);
}

TEST(LceReference, AllIgnoredMeanIsZeroWithZeroGradients) {
  Tensor x = f32_tensor({2, 1}, {1.0f, -1.0f});
  Tensor w = f32_tensor({1, 2}, {0.5f, 0.25f});
  Tensor b = f32_tensor({2}, {0.1f, 0.2f});
  Tensor y = i64_tensor({2}, {-100, -100});
  Inputs in{x, w, b.view(), y, std::nullopt};
  Result r = compute_with_grad(in, ref_opts(Reduction::kMean));
  EXPECT_EQ(r.loss.data_as<float>()[0], 0.0f);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(r.dx.data_as<float>()[i], 0.0f);
    EXPECT_EQ(r.dw.data_as<float>()[i], 0.0f);
    EXPECT_EQ(r.dbias.data_as<float>()[i], 0.0f);
  }
}

TEST(LceReference, EmptyBatchGivesZeroLossAndZeroWeightGradient) {
  Tensor x = Tensor::empty(DType::kF32, {0, 3});
  Tensor w = f32_tensor({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor b = f32_tensor({2}, {1, 1});
  Tensor y = Tensor::empty(DType::kI64, {0});
  Inputs in{x, w, b.view(), y, std::nullopt};
  for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    Result r = compute_with_grad(in, ref_opts(red));
    if (red != Reduction::kNone) EXPECT_EQ(r.loss.data_as<float>()[0], 0.0f);
    EXPECT_EQ(r.lse.numel(), 0);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(r.dw.data_as<float>()[i], 0.0f);
    for (int i = 0; i < 2; ++i) EXPECT_EQ(r.dbias.data_as<float>()[i], 0.0f);
  }
}

TEST(LceReference, BiasAddedExactlyOnceToTheLabelLogit) {
  // A peer bug added the bias to the label logit twice, giving negative losses.
  // With x = 0 the logits are the bias: loss = lse(b) − b[y] >= 0 exactly.
  Tensor x = f32_tensor({1, 2}, {0.0f, 0.0f});
  Tensor w = f32_tensor({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = f32_tensor({3}, {5.0f, 0.0f, 0.0f});
  Tensor y = i64_tensor({1}, {0});
  Inputs in{x, w, b.view(), y, std::nullopt};
  const double want = std::log(std::exp(5.0) + 2.0) - 5.0;
  for (const char* impl : ::tessera::testing::reference_and_cpu()) {
    Options o = ref_opts(Reduction::kSum);
    o.implementation = impl;
    Result r = compute(in, o);
    EXPECT_NEAR(r.loss.data_as<float>()[0], want, 1e-6) << impl;
    EXPECT_GE(r.loss.data_as<float>()[0], 0.0f) << impl;
  }
}

// ---------------------------------------------------------------------------------------------
// Gradient of the reference against central finite differences.
//
// Inputs lie on a 2^-12 grid and δ = 2^-7, so x ± δ is exact in f32 and the reference (double
// inside) sees exactly the perturbed values. The objective L = Σ_t g_t·loss_t (none) or g·loss
// is read back from f32 outputs, which rounds it by ≤ 2^-24·|L|; divided by 2δ that is < 1e-5
// here. The central difference's truncation error is δ²/6·|L'''| ≈ 1e-5·|L'''|. With |L'''|
// bounded by a few units at these logit scales, an error budget of 2e-3·max|grad| + 2e-3·|grad|
// is > 10x the expected error and far below the error of any wrong term (a missing factor of
// (1 − (z/c)²), 2λ·lse or ε/V changes gradients by ≥ 1e-2 relative).

struct FdCase {
  const char* name;
  Reduction red = Reduction::kMean;
  bool bias = false, weights = false, class_weights = false;
  WLayout mem = WLayout::kHV;
  bool tview = false;
  double eps = 0, z = 0, cap = 0;
  int64_t ignore_index = -100;
};

void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name; }

float grid_value(std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  return static_cast<float>(std::round(u(rng) * 4096.0) / 4096.0);
}

class LceFiniteDifference : public ::testing::TestWithParam<FdCase> {};

TEST_P(LceFiniteDifference, ReferenceGradientMatchesCentralDifferences) {
  const FdCase& c = GetParam();
  const int64_t B = 4, H = 5, V = 7;
  std::mt19937_64 rng(42);
  Tensor x = Tensor::empty(DType::kF32, {2, 2, H});
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = grid_value(rng, -1, 1);
  const Shape mem = c.mem == WLayout::kHV ? Shape{H, V} : Shape{V, H};
  Tensor wm = Tensor::empty(DType::kF32, mem);
  for (int64_t i = 0; i < wm.numel(); ++i) wm.data_as<float>()[i] = grid_value(rng, -1.5, 1.5);
  Tensor w = c.tview ? wm.as_strided({mem[1], mem[0]}, {1, mem[1]}) : wm;
  Tensor b = f32_tensor({V}, {0.5f, -0.25f, 0.125f, 1.0f, -1.0f, 0.0f, 0.75f});
  Tensor y = i64_tensor({2, 2}, {3, c.ignore_index, 0, 6});
  Tensor wt = f32_tensor({2, 2}, {1.5f, 0.5f, 2.0f, 0.75f});
  Inputs in{x, w, std::nullopt, y, std::nullopt};
  if (c.bias) in.bias = b.view();
  if (c.weights) in.token_weights = wt.view();
  // PyTorch's weight [V]; label 3 weighs 0: that token keeps only its smoothing term.
  Tensor cw = f32_tensor({V}, {0.5f, 2.0f, 1.0f, 0.0f, 3.0f, 1.25f, 0.75f});
  if (c.class_weights) in.class_weights = cw.view();
  Options o = ref_opts(c.red);
  o.label_smoothing = c.eps;
  o.z_loss_weight = c.z;
  o.softcap = c.cap;
  o.ignore_index = c.ignore_index;
  Tensor g = c.red == Reduction::kNone ? f32_tensor({2, 2}, {0.5f, -1.25f, 2.0f, 0.75f}) : scalar_f32(1.5f);

  // Analytic.
  Tensor dx = Tensor::empty(DType::kF32, x.shape());
  Tensor dwm = Tensor::empty(DType::kF32, mem);
  Tensor dw = c.tview ? dwm.as_strided(w.shape(), w.view().strides) : dwm;
  Tensor db = Tensor::empty(DType::kF32, {V});
  Gradients grads{dx.view(), dw.view(), std::nullopt};
  if (c.bias) grads.dbias = db.view();
  backward(in, g.view(), grads, o);

  auto objective = [&]() {
    Result r = compute(in, o);
    double L = 0;
    for (int64_t i = 0; i < r.loss.numel(); ++i)
      L += static_cast<double>(g.data_as<float>()[i]) * r.loss.data_as<float>()[i];
    return L;
  };
  const float delta = 1.0f / 128;
  auto fd_check = [&](Tensor& param, const Tensor& grad, const char* what) {
    double scale = 0;
    for (int64_t i = 0; i < grad.numel(); ++i) scale = std::max(scale, std::fabs(double(grad.data_as<float>()[i])));
    for (int64_t i = 0; i < param.numel(); ++i) {
      float& p = param.data_as<float>()[i];
      const float saved = p;
      p = saved + delta;
      const double lp = objective();
      p = saved - delta;
      const double lm = objective();
      p = saved;
      const double fd = (lp - lm) / (2.0 * delta);
      const double an = grad.data_as<float>()[i];
      EXPECT_NEAR(an, fd, 2e-3 * scale + 2e-3 * std::fabs(fd)) << what << "[" << i << "] in " << c.name;
    }
  };
  fd_check(x, dx, "dx");
  fd_check(wm, dwm, "dw");  // memory order of both
  if (c.bias) fd_check(b, db, "dbias");
  // Ignored row: exactly zero dx.
  if (c.ignore_index == -100)
    for (int64_t h = 0; h < H; ++h) EXPECT_EQ(dx.data_as<float>()[1 * H + h], 0.0f);
  (void)B;
}

FdCase make_fd(const char* name, Reduction red) {
  FdCase c;
  c.name = name;
  c.red = red;
  return c;
}

std::vector<FdCase> fd_cases() {
  std::vector<FdCase> v;
  v.push_back(make_fd("mean", Reduction::kMean));
  v.push_back(make_fd("sum", Reduction::kSum));
  v.push_back(make_fd("none", Reduction::kNone));
  for (Reduction r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    FdCase c = make_fd("bias+weights", r);
    c.bias = c.weights = true;
    v.push_back(c);
    c = make_fd("softcap", r);
    c.cap = 1.5;
    v.push_back(c);
    c = make_fd("z_loss", r);
    c.z = 0.3;
    v.push_back(c);
    c = make_fd("smoothing", r);
    c.eps = 0.2;
    v.push_back(c);
    c = make_fd("everything", r);
    c.bias = c.weights = true;
    c.cap = 2.0;
    c.z = 0.1;
    c.eps = 0.1;
    v.push_back(c);
    c = make_fd("class_weights", r);  // issue #17: PyTorch's weight, mean over Σ w[y]
    c.class_weights = true;
    v.push_back(c);
    c = make_fd("class_weights+token weights+z_loss+softcap", r);
    c.class_weights = c.weights = c.bias = true;
    c.z = 0.2;
    c.cap = 2.0;
    v.push_back(c);
    c = make_fd("class_weights+label smoothing", r);  // PyTorch: ε/V·Σ_c w[c]·(−log p_c)
    c.class_weights = true;
    c.eps = 0.2;
    v.push_back(c);
    c = make_fd("class_weights+smoothing+token weights+z_loss+softcap+bias", r);
    c.class_weights = c.weights = c.bias = true;
    c.eps = 0.3;
    c.z = 0.1;
    c.cap = 2.5;
    v.push_back(c);
  }
  FdCase c = make_fd("vh layout", Reduction::kMean);
  c.mem = WLayout::kVH;
  c.bias = true;
  v.push_back(c);
  c = make_fd("vh transposed view", Reduction::kNone);
  c.mem = WLayout::kVH;
  c.tview = true;
  c.cap = 3;
  v.push_back(c);
  c = make_fd("hv transposed view", Reduction::kSum);
  c.tview = true;
  c.eps = 0.3;
  v.push_back(c);
  c = make_fd("ignore_index inside range", Reduction::kMean);
  c.ignore_index = 6;  // y = {3, 6, 0, 6}: tokens 1 and 3 are ignored
  c.weights = true;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllOptions, LceFiniteDifference, ::testing::ValuesIn(fd_cases()),
                         [](const ::testing::TestParamInfo<FdCase>& info) {
                           std::string s = std::to_string(info.index) + "_" + info.param.name;
                           for (char& ch : s)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace tessera::linear_cross_entropy

namespace tessera::linear_cross_entropy {
namespace {

// An ignored row's lse is unspecified under skip_ignored (0 on the host path, the true value on a
// device): comparisons see those rows, and only those, as 0; without skip_ignored every row counts.
TEST(LceTesting, SpecifiedLseBlanksExactlyTheIgnoredRows) {
  testing::CaseSpec s;
  s.lead = {40};
  s.ignore_fraction = 0.25;
  s.label_dtype = DType::kI32;
  const testing::CaseData d = testing::make_case(s);
  const std::vector<double> lse(40, 7.0);
  const std::vector<double> got = testing::specified_lse(s, d, lse);
  int ignored = 0;
  for (int64_t t = 0; t < 40; ++t) {
    const bool ign = d.labels.data_as<int32_t>()[t] == s.opt.ignore_index;
    ignored += ign;
    EXPECT_EQ(got[static_cast<size_t>(t)], ign ? 0.0 : 7.0) << t;
  }
  EXPECT_GT(ignored, 0);
  EXPECT_LT(ignored, 40);
  s.opt.skip_ignored = false;
  EXPECT_EQ(testing::specified_lse(s, d, lse), lse);
}

}  // namespace
}  // namespace tessera::linear_cross_entropy
