// linear_cross_entropy options of issue #17 (PyTorch / Liger parity): per-class weights
// (PyTorch's `weight`, Liger's `ce_weight`), the z-loss part returned alone (Liger's
// `return_z_loss`) and token accuracy (Liger's `return_token_accuracy`), on every host
// implementation and dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/random.h"
#include "kernels/lce_test_util.h"
#include "kernels/linear_cross_entropy/impl.h"  // validate_metadata
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy {
namespace {

using lce_test::f32_tensor;
using lce_test::i64_tensor;

std::vector<std::string> host_implementations() {
  std::vector<std::string> out;
  for (const auto& i : implementations())
    if (i.available && i.device == DeviceType::kCPU) out.push_back(i.name);
  return out;
}

// B = 13 tokens (two ignored), H = 8, V = 11; class weights with a zero and a large one.
struct Problem13 {
  DType dtype;
  Tensor x, w, labels, cw, tw;
  explicit Problem13(DType dt) : dtype(dt) {
    x = random_uniform(dt, {13, 8}, 1.0f, 7);
    w = random_uniform(dt, {11, 8}, 1.0f, 8);
    labels = i64_tensor({13}, {3, 0, 10, -100, 5, 5, 1, 2, 9, -100, 7, 4, 10});
    cw = f32_tensor({11}, {0.5f, 1.0f, 2.0f, 0.0f, 1.5f, 3.0f, 1.0f, 0.25f, 1.0f, 0.75f, 4.0f});
    tw = random_uniform(DType::kF32, {13}, 1.0f, 9);
    for (int64_t i = 0; i < 13; ++i) tw.data_as<float>()[i] = 0.5f + std::fabs(tw.data_as<float>()[i]);
  }
  Inputs in(bool class_weights, bool token_weights) const {
    Inputs i{x, w, std::nullopt, labels, std::nullopt};
    if (class_weights) i.class_weights = cw.view();
    if (token_weights) i.token_weights = tw.view();
    return i;
  }
  int64_t label(int64_t t) const { return labels.data_as<int64_t>()[t]; }
};

Options with(const std::string& impl, Reduction r) {
  Options o;
  o.implementation = impl;
  o.reduction = r;
  return o;
}

// PyTorch's cross_entropy(weight=cw): mean = Σ cw[y]·tw·nll / Σ cw[y]·tw over kept tokens; the
// per-token nll comes from the same implementation without weights (reduction none).
TEST(LceClassWeights, MeanAndSumAreTheWeightedPytorchReductions) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Problem13 p(dt);
    for (const std::string& impl : host_implementations()) {
      const Result per = compute(p.in(false, false), with(impl, Reduction::kNone));
      for (bool tw : {false, true}) {
        double num = 0.0, den = 0.0;
        for (int64_t t = 0; t < 13; ++t) {
          if (p.label(t) == -100) continue;
          const double wt = p.cw.data_as<float>()[p.label(t)] * (tw ? p.tw.data_as<float>()[t] : 1.0f);
          num += wt * per.loss.data_as<float>()[t];
          den += wt;
        }
        const float mean = compute(p.in(true, tw), with(impl, Reduction::kMean)).loss.data_as<float>()[0];
        const float sum = compute(p.in(true, tw), with(impl, Reduction::kSum)).loss.data_as<float>()[0];
        EXPECT_NEAR(mean, num / den, 2e-5 * std::fabs(num / den)) << impl << " " << dtype_name(dt) << " tw=" << tw;
        EXPECT_NEAR(sum, num, 2e-5 * std::fabs(num)) << impl << " " << dtype_name(dt) << " tw=" << tw;
        const Result none = compute(p.in(true, tw), with(impl, Reduction::kNone));
        EXPECT_EQ(none.loss.data_as<float>()[0], 0.0f) << "class 3 has weight 0";
      }
    }
  }
}

// Without label smoothing a class weight is a token weight cw[y_t]: the gradients equal those
// of that token weight exactly (the reference's token-weight gradients are proved against
// finite differences in linear_cross_entropy_test.cc).
TEST(LceClassWeights, GradientsEqualThoseOfTheEquivalentTokenWeights) {
  const Problem13 p(DType::kF32);
  Tensor eq = Tensor::empty(DType::kF32, {13});
  for (int64_t t = 0; t < 13; ++t)
    eq.data_as<float>()[t] = p.label(t) == -100 ? 0.0f : p.cw.data_as<float>()[p.label(t)] * p.tw.data_as<float>()[t];
  for (const std::string& impl : host_implementations()) {
    const Result a = compute_with_grad(p.in(true, true), with(impl, Reduction::kMean));
    Inputs ie = p.in(false, false);
    ie.token_weights = eq.view();
    const Result b = compute_with_grad(ie, with(impl, Reduction::kMean));
    EXPECT_EQ(a.loss.data_as<float>()[0], b.loss.data_as<float>()[0]) << impl;
    for (auto [x, y] : {std::pair{&a.dx, &b.dx}, {&a.dw, &b.dw}})
      EXPECT_EQ(std::memcmp(x->data(), y->data(), x->view().nbytes()), 0) << impl;
  }
}

TEST(LceClassWeights, BadClassWeightsAreErrorsThatTouchNothing) {
  const Problem13 p(DType::kF32);
  auto expect = [&](const Tensor& cw, const Options& opt, ErrorCode code, const std::string& needle) {
    Inputs in = p.in(false, false);
    in.class_weights = cw.view();
    Tensor loss = f32_tensor({}, {777.0f}), lse = Tensor::empty(DType::kF32, {13});
    try {
      forward(in, {loss, lse}, opt);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(loss.data_as<float>()[0], 777.0f);
  };
  const Options ref = with("reference", Reduction::kMean);
  expect(Tensor::zeros(DType::kF32, {12}), ref, ErrorCode::kInvalidArgument, "class_weights must be [V=11]");
  expect(Tensor::zeros(DType::kBF16, {11}), ref, ErrorCode::kInvalidArgument, "class_weights must be f32");
  Tensor neg = f32_tensor({11}, std::vector<float>(11, 1.0f));
  neg.data_as<float>()[4] = -0.5f;
  expect(neg, ref, ErrorCode::kInvalidArgument, "finite and >= 0");
  Tensor nan = f32_tensor({11}, std::vector<float>(11, 1.0f));
  nan.data_as<float>()[2] = NAN;
  expect(nan, ref, ErrorCode::kInvalidArgument, "finite and >= 0");
  Options smooth = ref;
  smooth.label_smoothing = 0.1;
  expect(neg, smooth, ErrorCode::kInvalidArgument, "finite and >= 0");
  // From metadata alone (torch fake tensors, JAX tracing): shape and dtype are checked too.
  Inputs in = p.in(false, false);
  const Tensor short_cw = Tensor::zeros(DType::kF32, {12});
  in.class_weights = short_cw.view();
  try {
    validate_metadata(in, ref);
    ADD_FAILURE() << "validate_metadata accepted class_weights [12] for V = 11";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("class_weights must be [V=11]"), std::string::npos) << e.what();
  }
}

// PyTorch's cross_entropy(weight=cw, label_smoothing=ε), written out from its definition in
// double from the (rounded) inputs: loss_t = tw_t·[(1−ε)·cw[y]·(−log p_y) + ε/V·Σ_c cw[c]·(−log p_c)],
// mean = Σ loss_t / Σ tw_t·cw[y_t] over kept tokens. (Tessera's token weights tw scale the whole
// term; PyTorch has none, i.e. tw = 1.)
std::vector<double> pytorch_smoothed_losses(const Problem13& p, bool tw, double eps) {
  std::vector<double> out(13, 0.0);
  const float* cw = p.cw.data_as<float>();
  for (int64_t t = 0; t < 13; ++t) {
    if (p.label(t) == -100) continue;
    std::vector<double> z(11);
    double m = -INFINITY;
    for (int64_t c = 0; c < 11; ++c) {
      for (int64_t h = 0; h < 8; ++h)
        z[c] += double(load_as_f32(p.x.data(), p.dtype, t * 8 + h)) * load_as_f32(p.w.data(), p.dtype, c * 8 + h);
      m = std::max(m, z[c]);
    }
    double s = 0.0;
    for (double v : z) s += std::exp(v - m);
    const double lse = m + std::log(s);
    double smooth = 0.0;
    for (int64_t c = 0; c < 11; ++c) smooth += cw[c] * (lse - z[c]);
    const double nll = cw[p.label(t)] * (lse - z[p.label(t)]);
    out[t] = (tw ? p.tw.data_as<float>()[t] : 1.0) * ((1.0 - eps) * nll + eps / 11.0 * smooth);
  }
  return out;
}

TEST(LceClassWeights, WithLabelSmoothingTheyArePytorchsDefinition) {
  const double eps = 0.2;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Problem13 p(dt);
    for (const std::string& impl : host_implementations()) {
      for (bool tw : {false, true}) {
        const std::vector<double> want = pytorch_smoothed_losses(p, tw, eps);
        double num = 0.0, den = 0.0;
        for (int64_t t = 0; t < 13; ++t) {
          num += want[t];
          if (p.label(t) != -100) den += p.cw.data_as<float>()[p.label(t)] * (tw ? p.tw.data_as<float>()[t] : 1.0f);
        }
        Options o = with(impl, Reduction::kNone);
        o.label_smoothing = eps;
        const Result none = compute(p.in(true, tw), o);
        for (int64_t t = 0; t < 13; ++t)
          EXPECT_NEAR(none.loss.data_as<float>()[t], want[t], 2e-5 * (1.0 + std::fabs(want[t])))
              << impl << " " << dtype_name(dt) << " tw=" << tw << " token " << t;
        EXPECT_GT(none.loss.data_as<float>()[0], 0.0f) << "class 3 has weight 0, its smoothing term does not";
        o.reduction = Reduction::kMean;
        EXPECT_NEAR(compute(p.in(true, tw), o).loss.data_as<float>()[0], num / den, 2e-5 * std::fabs(num / den)) << impl;
        o.reduction = Reduction::kSum;
        EXPECT_NEAR(compute(p.in(true, tw), o).loss.data_as<float>()[0], num, 2e-5 * std::fabs(num)) << impl;
      }
    }
  }
}

// With smoothing, class weights are not token weights: every host implementation's gradients
// match the reference's (which finite differences prove, linear_cross_entropy_test.cc), with
// the soft cap and z-loss on, including a token whose label has class weight 0.
TEST(LceClassWeights, WithLabelSmoothingEveryImplementationsGradientsMatchTheReference) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Problem13 p(dt);
    Options o = with("reference", Reduction::kMean);
    o.label_smoothing = 0.3;
    o.z_loss_weight = 0.05;
    o.softcap = 4.0;
    const Result want = compute_with_grad(p.in(true, true), o);
    for (const std::string& impl : host_implementations()) {
      o.implementation = impl;
      o.skip_ignored = impl != "cpu";  // both paths of the API
      const Result got = compute_with_grad(p.in(true, true), o);
      const double tol = dt == DType::kF32 ? 1e-5 : 1e-2;  // bf16 gradients are stored in bf16
      EXPECT_NEAR(got.loss.data_as<float>()[0], want.loss.data_as<float>()[0], 1e-5) << impl;
      // And the backward alone, given the forward's lse (no statistics pass).
      Tensor dx = Tensor::empty(dt, p.x.shape()), dw = Tensor::empty(dt, p.w.shape());
      Tensor g = f32_tensor({}, {1.0f});
      backward(p.in(true, true), g.view(), got.lse.view(), {dx.view(), dw.view(), std::nullopt}, o);
      for (auto [g, r] : {std::pair{&got.dx, &want.dx}, {&got.dw, &want.dw}, {&dx, &want.dx}, {&dw, &want.dw}})
        for (int64_t i = 0; i < g->numel(); ++i)
          ASSERT_NEAR(load_as_f32(g->data(), g->dtype(), i), load_as_f32(r->data(), r->dtype(), i),
                      tol * (1.0 + std::fabs(load_as_f32(r->data(), r->dtype(), i))))
              << impl << " " << dtype_name(dt) << " element " << i;
    }
  }
}

// z_loss: the z-loss part alone, weight · λ · lse², reduced like the loss; it is what the loss
// gains from λ.
TEST(LceMetrics, ZLossIsTheZLossPartOfTheLoss) {
  const double lambda = 1e-2;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Problem13 p(dt);
    for (const std::string& impl : host_implementations()) {
      for (Reduction r : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
        Options o = with(impl, r);
        o.z_loss_weight = lambda;
        o.return_z_loss = true;
        const Result a = compute(p.in(false, true), o);
        o.z_loss_weight = 0.0;
        const Result b = compute(p.in(false, true), o);
        ASSERT_EQ(a.z_loss.shape(), a.loss.shape());
        for (int64_t i = 0; i < a.loss.numel(); ++i) {
          const double gain = double(a.loss.data_as<float>()[i]) - b.loss.data_as<float>()[i];
          EXPECT_NEAR(a.z_loss.data_as<float>()[i], gain, 1e-4 * std::fabs(a.loss.data_as<float>()[i]) + 1e-6)
              << impl << " " << dtype_name(dt) << " i=" << i;
        }
        if (r == Reduction::kNone) {
          for (int64_t t = 0; t < 13; ++t) {
            const double lse = a.lse.data_as<float>()[t];
            const double want = p.label(t) == -100 ? 0.0 : p.tw.data_as<float>()[t] * lambda * lse * lse;
            EXPECT_NEAR(a.z_loss.data_as<float>()[t], want, 1e-6 * (1 + want)) << impl << " t=" << t;
          }
        }
      }
    }
  }
}

TEST(LceMetrics, TokenAccuracyIsTheShareOfKeptTokensWhoseArgmaxIsTheLabel) {
  const Problem13 p(DType::kF32);
  for (const std::string& impl : host_implementations()) {
    Options o = with(impl, Reduction::kMean);
    o.return_argmax = true;
    const Result am = compute(p.in(false, false), o);
    // Make 4 kept tokens correct by relabelling them to their argmax.
    Tensor labels = i64_tensor({13}, std::vector<int64_t>(p.labels.data_as<int64_t>(), p.labels.data_as<int64_t>() + 13));
    for (int64_t t : {0, 2, 5, 11}) labels.data_as<int64_t>()[t] = am.argmax.data_as<int64_t>()[t];
    int64_t correct = 0, kept = 0;
    for (int64_t t = 0; t < 13; ++t) {
      const int64_t y = labels.data_as<int64_t>()[t];
      if (y == -100) continue;
      ++kept;
      correct += am.argmax.data_as<int64_t>()[t] == y;
    }
    ASSERT_GE(correct, 4);
    Inputs in = p.in(false, false);
    in.labels = labels;
    Options acc = with(impl, Reduction::kMean);
    acc.return_token_accuracy = true;  // without return_argmax: the argmax goes to scratch
    for (bool grad : {false, true}) {
      const Result r = grad ? compute_with_grad(in, acc) : compute(in, acc);
      EXPECT_FLOAT_EQ(r.accuracy.data_as<float>()[0], float(correct) / float(kept)) << impl << " grad=" << grad;
      EXPECT_FALSE(r.argmax.defined());
    }
    // Every token ignored: accuracy 0 (not NaN).
    Tensor ignored = i64_tensor({13}, std::vector<int64_t>(13, -100));
    in.labels = ignored;
    EXPECT_EQ(compute(in, acc).accuracy.data_as<float>()[0], 0.0f) << impl;
  }
}

TEST(LceMetrics, MetricOutputsAreCheckedLikeEveryOutput) {
  const Problem13 p(DType::kF32);
  Tensor loss = Tensor::empty(DType::kF32, {}), lse = Tensor::empty(DType::kF32, {13});
  Tensor bad_acc = Tensor::empty(DType::kF32, {13});
  ForwardOutputs out{loss, lse};
  out.accuracy = bad_acc.view();
  EXPECT_THROW(forward(p.in(false, false), out, with("reference", Reduction::kMean)), Error);
  Tensor bad_z = Tensor::empty(DType::kF32, {13});  // mean wants a 0-d z_loss
  ForwardOutputs out2{loss, lse};
  out2.z_loss = bad_z.view();
  EXPECT_THROW(forward(p.in(false, false), out2, with("reference", Reduction::kMean)), Error);
}

// Skipping ignored tokens (the default) changes the time, not the numbers: loss, dw and dbias
// equal those of the full computation (to f32 summation-order noise), dx of ignored rows is 0,
// kept rows' per-token outputs are the same; lse / argmax of ignored rows are 0 (real without it).
TEST(LceSkipIgnored, SameLossAndGradientsAsComputingEveryRow) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Problem13 p(dt);
    Tensor bias = random_uniform(dt, {11}, 0.5f, 21);
    for (const std::string& impl : host_implementations()) {
      for (Reduction r : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
        Options on = with(impl, r), off = with(impl, r);
        off.skip_ignored = false;
        Inputs in = p.in(true, true);
        in.bias = bias.view();
        const Result a = compute_with_grad(in, on), b = compute_with_grad(in, off);
        const std::string what = impl + " " + dtype_name(dt) + " reduction " + std::to_string(int(r));
        const double tol = dt == DType::kF32 ? 1e-5 : 1e-2;
        for (int64_t i = 0; i < a.loss.numel(); ++i)
          EXPECT_NEAR(a.loss.data_as<float>()[i], b.loss.data_as<float>()[i], tol * (1 + std::fabs(b.loss.data_as<float>()[i]))) << what;
        for (auto [x, y] : {std::pair{&a.dw, &b.dw}, {&a.dbias, &b.dbias}, {&a.dx, &b.dx}})
          for (int64_t i = 0; i < x->numel(); ++i)
            EXPECT_NEAR(load_as_f32(x->data(), x->dtype(), i), load_as_f32(y->data(), y->dtype(), i), tol) << what << " i=" << i;
        for (int64_t t = 0; t < 13; ++t) {
          if (p.label(t) == -100) {
            EXPECT_EQ(a.lse.data_as<float>()[t], 0.0f) << what;
            EXPECT_TRUE(std::isfinite(b.lse.data_as<float>()[t]) && b.lse.data_as<float>()[t] != 0.0f) << what;
            for (int64_t h = 0; h < 8; ++h) EXPECT_EQ(load_as_f32(a.dx.data(), a.dx.dtype(), t * 8 + h), 0.0f) << what;
          } else {
            EXPECT_NEAR(a.lse.data_as<float>()[t], b.lse.data_as<float>()[t], 1e-5 * (1 + std::fabs(b.lse.data_as<float>()[t])));
          }
        }
      }
    }
  }
}

// An argmax output is a prediction for every token: asking for it computes every row.
TEST(LceSkipIgnored, AnArgmaxOutputKeepsEveryRow) {
  const Problem13 p(DType::kF32);
  for (const std::string& impl : host_implementations()) {
    Options o = with(impl, Reduction::kMean), all = o;
    o.return_argmax = all.return_argmax = true;
    all.skip_ignored = false;
    const Result a = compute(p.in(false, false), o), b = compute(p.in(false, false), all);
    for (int64_t t = 0; t < 13; ++t) {
      EXPECT_EQ(a.argmax.data_as<int64_t>()[t], b.argmax.data_as<int64_t>()[t]) << impl << " t=" << t;
      EXPECT_EQ(a.lse.data_as<float>()[t], b.lse.data_as<float>()[t]) << impl << " t=" << t;
    }
  }
}

TEST(LceSkipIgnored, BackwardWithTheSavedLseAndEveryTokenIgnored) {
  const Problem13 p(DType::kF32);
  for (const std::string& impl : host_implementations()) {
    const Options o = with(impl, Reduction::kNone);
    const Result f = compute(p.in(false, true), o);
    Tensor ones = f32_tensor({13}, std::vector<float>(13, 1.0f));
    Tensor dx = Tensor::empty(DType::kF32, {13, 8}), dw = Tensor::empty(DType::kF32, {11, 8});
    backward(p.in(false, true), ones, f.lse, {dx, dw, std::nullopt}, o);
    const Result full = compute_with_grad(p.in(false, true), o);
    for (int64_t i = 0; i < dw.numel(); ++i) EXPECT_NEAR(dw.data_as<float>()[i], full.dw.data_as<float>()[i], 1e-5) << impl;
    // Every token ignored: loss 0, every gradient 0, lse 0.
    Tensor ignored = i64_tensor({13}, std::vector<int64_t>(13, -100));
    Inputs in = p.in(false, false);
    in.labels = ignored;
    const Result z = compute_with_grad(in, with(impl, Reduction::kMean));
    EXPECT_EQ(z.loss.data_as<float>()[0], 0.0f);
    for (const Tensor* t : {&z.dx, &z.dw, &z.lse})
      for (int64_t i = 0; i < t->numel(); ++i) EXPECT_EQ(t->data_as<float>()[i], 0.0f) << impl;
  }
}

}  // namespace
}  // namespace tessera::linear_cross_entropy
