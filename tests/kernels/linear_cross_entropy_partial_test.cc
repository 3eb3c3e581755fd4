// linear_cross_entropy's vocab-parallel partial form (Options::vocab_total, forward_partial, and
// backward from the combined lse): the classifier split into 2 and 3 slices, the slices'
// statistics combined as the header says (what the engine's all-reduces do), against the
// unsplit kernel — every option, every reduction, every host implementation (cpu_v2 shares cpu's code).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/random.h"
#include "kernels/lce_test_util.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy {
namespace {

using lce_test::f32_tensor;
using lce_test::i64_tensor;

constexpr int64_t kB = 9, kH = 6, kV = 11;
constexpr int64_t kIgnore = -1000;  // outside (−V, V): labels are relative in the partial form

struct Case {
  std::string name;
  double smoothing = 0.0, z_loss = 0.0, cap = 0.0;
  bool bias = false, class_weights = false, token_weights = false;
};

std::vector<Case> cases() {
  return {{"plain"},
          {"smoothing", 0.1},
          {"z_loss", 0.0, 1e-2},
          {"softcap_bias", 0.0, 0.0, 2.5, true},
          {"class_weights", 0.0, 0.0, 0.0, false, true},
          {"class_weights_smoothing_tokens", 0.2, 1e-3, 0.0, true, true, true}};
}

struct Full {
  Tensor x, w, bias, labels, cw, tw;
  Full() {
    x = random_uniform(DType::kF32, {kB, kH}, 1.0f, 11);
    w = random_uniform(DType::kF32, {kV, kH}, 1.0f, 12);  // [V, H]
    bias = random_uniform(DType::kF32, {kV}, 0.5f, 13);
    labels = i64_tensor({kB}, {3, 0, 10, kIgnore, 5, 4, 7, 9, 1});
    cw = f32_tensor({kV}, {0.5f, 1.0f, 2.0f, 0.0f, 1.5f, 3.0f, 1.0f, 0.25f, 1.0f, 0.75f, 4.0f});
    tw = f32_tensor({kB}, {1.0f, 0.5f, 2.0f, 1.0f, 0.25f, 1.5f, 1.0f, 3.0f, 0.75f});
  }
  Inputs inputs(const Case& c) const {
    Inputs in{x.view(), w.view(), std::nullopt, labels.view(), std::nullopt};
    if (c.bias) in.bias = bias.view();
    if (c.class_weights) in.class_weights = cw.view();
    if (c.token_weights) in.token_weights = tw.view();
    return in;
  }
};

Options options(const Case& c, const std::string& impl, Reduction r, int64_t vocab_total) {
  Options o;
  o.implementation = impl;
  o.reduction = r;
  o.ignore_index = kIgnore;
  o.label_smoothing = c.smoothing;
  o.z_loss_weight = c.z_loss;
  o.softcap = c.cap;
  o.w_layout = WLayout::kVH;
  o.vocab_total = vocab_total;
  return o;
}

// One slice [a, b) of the classes: its w rows, bias, relative labels, rotated class weights.
struct Slice {
  int64_t a, b;
  Tensor w, bias, labels, cw;
  Slice(const Full& f, int64_t a_, int64_t b_) : a(a_), b(b_) {
    const int64_t n = b - a;
    w = Tensor::empty(DType::kF32, {n, kH});
    bias = Tensor::empty(DType::kF32, {n});
    for (int64_t i = 0; i < n * kH; ++i) w.data_as<float>()[i] = f.w.data_as<float>()[a * kH + i];
    for (int64_t i = 0; i < n; ++i) bias.data_as<float>()[i] = f.bias.data_as<float>()[a + i];
    labels = Tensor::empty(DType::kI64, {kB});
    for (int64_t t = 0; t < kB; ++t) {
      const int64_t y = f.labels.data_as<int64_t>()[t];
      labels.data_as<int64_t>()[t] = y == kIgnore ? kIgnore : y - a;
    }
    cw = Tensor::empty(DType::kF32, {kV});
    for (int64_t c = 0; c < kV; ++c) cw.data_as<float>()[c] = f.cw.data_as<float>()[(c + a) % kV];
  }
  Inputs inputs(const Full& f, const Case& c) const {
    Inputs in{x_of(f), w.view(), std::nullopt, labels.view(), std::nullopt};
    if (c.bias) in.bias = bias.view();
    if (c.class_weights) in.class_weights = cw.view();
    if (c.token_weights) in.token_weights = f.tw.view();
    return in;
  }
  static TensorView x_of(const Full& f) { return f.x.view(); }
};

struct Stats {
  std::vector<double> lse, zy, sz, maxz;
  std::vector<int64_t> argmax;
};

// The slices' statistics combined in double: what the engine's max / sum all-reduces do.
Stats combine(const Full& f, const Case& c, const std::vector<Slice>& slices, const std::string& impl) {
  Stats s{std::vector<double>(kB, 0.0), std::vector<double>(kB, 0.0), std::vector<double>(kB, 0.0),
          std::vector<double>(kB, -INFINITY), std::vector<int64_t>(kB, 0)};
  std::vector<double> sumexp(kB, 0.0);
  std::vector<std::vector<float>> lses;
  for (const Slice& sl : slices) {
    Tensor lse = Tensor::empty(DType::kF32, {kB}), zy = Tensor::empty(DType::kF32, {kB}),
           sz = Tensor::empty(DType::kF32, {kB}), am = Tensor::empty(DType::kI64, {kB}),
           mx = Tensor::empty(DType::kF32, {kB});
    Options o = options(c, impl, Reduction::kMean, kV);
    o.return_argmax = true;
    const std::string ran = forward_partial(sl.inputs(f, c), {lse.view(), zy.view(), sz.view(), am.view(), mx.view()}, o);
    EXPECT_EQ(ran, impl);
    for (int64_t t = 0; t < kB; ++t) {
      s.zy[t] += zy.data_as<float>()[t];
      s.sz[t] += sz.data_as<float>()[t];
      const double m = mx.data_as<float>()[t];
      if (m > s.maxz[t]) {  // strictly greater: the first slice wins ties, as one argmax would
        s.maxz[t] = m;
        s.argmax[t] = am.data_as<int64_t>()[t] + sl.a;
      }
    }
    lses.emplace_back(lse.data_as<float>(), lse.data_as<float>() + kB);
  }
  for (int64_t t = 0; t < kB; ++t) {
    double m = -INFINITY;
    for (const auto& l : lses) m = std::max(m, static_cast<double>(l[t]));
    for (const auto& l : lses) sumexp[t] += std::exp(l[t] - m);
    s.lse[t] = m + std::log(sumexp[t]);
  }
  return s;
}

// loss_t from the combined statistics (the header's formula).
std::vector<double> losses(const Full& f, const Case& c, const Stats& s, double* weight_sum) {
  std::vector<double> out(kB, 0.0);
  double sigma_sum = 0.0;
  for (int64_t k = 0; k < kV; ++k) sigma_sum += c.class_weights ? f.cw.data_as<float>()[k] : 1.0;
  *weight_sum = 0.0;
  for (int64_t t = 0; t < kB; ++t) {
    const int64_t y = f.labels.data_as<int64_t>()[t];
    if (y == kIgnore) continue;
    const double tw = c.token_weights ? f.tw.data_as<float>()[t] : 1.0;
    const double w = tw * (c.class_weights ? f.cw.data_as<float>()[y] : 1.0);
    *weight_sum += w;
    const double eps = c.smoothing, lse = s.lse[t];
    out[t] = w * ((1.0 - eps) * (lse - s.zy[t]) + c.z_loss * lse * lse) +
             tw * eps / static_cast<double>(kV) * (sigma_sum * lse - s.sz[t]);
  }
  return out;
}

class LcePartial : public ::testing::TestWithParam<std::string> {};

void expect_near_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_NEAR(got, want, tol * (1.0 + std::fabs(want))) << what;
}

// f32 throughout, sums of ≤ 11 terms: the combined loss and gradients agree with the unsplit
// kernel to a few f32 ulps of their magnitudes; 2e-5 relative leaves room for the different
// summation order of the slices.
constexpr double kTol = 2e-5;

TEST_P(LcePartial, SlicesCombineToTheUnsplitLossAndGradients) {
  const std::string impl = GetParam();
  bool available = false;
  for (const auto& i : implementations()) available |= i.name == impl && i.available;
  if (!available) GTEST_SKIP() << impl << " is not built here";
  const Full f;
  for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{0, 4, 11}, std::vector<int64_t>{0, 3, 7, 11}}) {
    std::vector<Slice> slices;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) slices.emplace_back(f, cuts[i], cuts[i + 1]);
    for (const Case& c : cases()) {
      const std::string tag = c.name + " with " + std::to_string(slices.size()) + " slices";
      Options whole = options(c, impl, Reduction::kNone, 0);
      whole.return_argmax = true;
      whole.ignore_index = kIgnore;
      const Result ref = compute(f.inputs(c), whole);
      const Stats s = combine(f, c, slices, impl);
      double wsum = 0.0;
      const std::vector<double> loss = losses(f, c, s, &wsum);
      for (int64_t t = 0; t < kB; ++t) {
        expect_near_rel(loss[t], ref.loss.data_as<float>()[t], kTol, tag + " loss at token " + std::to_string(t));
        if (f.labels.data_as<int64_t>()[t] != kIgnore)
          expect_near_rel(s.lse[t], ref.lse.data_as<float>()[t], kTol, tag + " lse at token " + std::to_string(t));
        EXPECT_EQ(s.argmax[t], ref.argmax.data_as<int64_t>()[t]) << tag << " argmax at token " << t;
      }
      // Backward, mean reduction: each slice from the combined lse; dx summed over the slices.
      const Options mean_whole = [&] { Options o = options(c, impl, Reduction::kMean, 0); return o; }();
      const Result g = compute_with_grad(f.inputs(c), mean_whole);
      std::vector<double> dx(kB * kH, 0.0);
      Tensor lse = Tensor::empty(DType::kF32, {kB});
      for (int64_t t = 0; t < kB; ++t) lse.data_as<float>()[t] = static_cast<float>(s.lse[t]);
      for (const Slice& sl : slices) {
        const int64_t n = sl.b - sl.a;
        Tensor sdx = Tensor::empty(DType::kF32, {kB, kH}), sdw = Tensor::empty(DType::kF32, {n, kH}),
               sdb = Tensor::empty(DType::kF32, {n});
        Gradients gr{sdx.view(), sdw.view(), std::nullopt};
        if (c.bias) gr.dbias = sdb.view();
        backward(sl.inputs(f, c), lce_test::scalar_f32(1.0f).view(), lse.view(), gr, options(c, impl, Reduction::kMean, kV));
        for (int64_t i = 0; i < kB * kH; ++i) dx[i] += sdx.data_as<float>()[i];
        for (int64_t i = 0; i < n * kH; ++i)
          expect_near_rel(sdw.data_as<float>()[i], g.dw.data_as<float>()[sl.a * kH + i], kTol, tag + " dw");
        for (int64_t i = 0; c.bias && i < n; ++i)
          expect_near_rel(sdb.data_as<float>()[i], g.dbias.data_as<float>()[sl.a + i], kTol, tag + " dbias");
      }
      for (int64_t i = 0; i < kB * kH; ++i) expect_near_rel(dx[i], g.dx.data_as<float>()[i], kTol, tag + " dx");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HostImplementations, LcePartial, ::testing::Values("reference", "cpu", "cpu_v2"),
                         [](const auto& info) { return info.param; });

TEST(LcePartialErrors, EveryMisuseIsNamed) {
  const Full f;
  const Case plain;
  const Slice sl(f, 0, 4);
  Tensor lse = Tensor::empty(DType::kF32, {kB}), zy = Tensor::empty(DType::kF32, {kB}), sz = Tensor::empty(DType::kF32, {kB});
  const PartialOutputs out{lse.view(), zy.view(), sz.view()};
  auto fails = [&](Options o, const std::string& what, const Inputs& in) {
    try {
      forward_partial(in, out, o);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Options o = options(plain, "reference", Reduction::kMean, kV);
  fails([&] { Options p = o; p.vocab_total = 0; return p; }(), "forward_partial needs vocab_total > 0", sl.inputs(f, plain));
  fails([&] { Options p = o; p.vocab_total = 3; return p; }(), "must be 0 (off) or at least the slice's V=4", sl.inputs(f, plain));
  fails([&] { Options p = o; p.ignore_index = -5; return p; }(), "ignore_index (-5) must lie outside",
        sl.inputs(f, plain));
  fails([&] { Options p = o; p.return_z_loss = true; return p; }(), "no z_loss or accuracy outputs", sl.inputs(f, plain));
  fails([&] { Options p = o; p.return_argmax = true; return p; }(), "exactly when return_argmax", sl.inputs(f, plain));
  Slice bad_label = sl;
  bad_label.labels = i64_tensor({kB}, {3, 0, 11, kIgnore, 5, 4, 7, 9, 1});
  fails(o, "label 11 at token 2 is outside (-vocab_total, vocab_total) = (-11, 11)", bad_label.inputs(f, plain));
  Inputs short_cw = sl.inputs(f, plain);
  const Tensor cw4 = f32_tensor({4}, {1, 1, 1, 1});
  short_cw.class_weights = cw4.view();
  fails(o, "class_weights must be [V=11]", short_cw);
  // The unsplit entry points refuse the partial form; its backward needs the combined lse.
  Tensor loss = Tensor::empty(DType::kF32, {}), dx = Tensor::empty(DType::kF32, {kB, kH}), dw = Tensor::empty(DType::kF32, {4, kH});
  EXPECT_THROW(forward(sl.inputs(f, plain), {loss.view(), lse.view(), std::nullopt}, o), Error);
  try {
    backward(sl.inputs(f, plain), lce_test::scalar_f32(1.0f).view(), {dx.view(), dw.view(), std::nullopt}, o);
    ADD_FAILURE() << "backward without lse accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs the combined (global) lse"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::linear_cross_entropy
