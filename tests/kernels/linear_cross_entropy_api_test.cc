// linear_cross_entropy API: every bad input gives a clear error before anything runs, and no
// output is touched; shapes and w layouts are normalized; dispatch picks and falls back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "core/log.h"
#include "cpu_backend.h"
#include "kernels/lce_test_util.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy {
namespace {

using lce_test::f32_tensor;
using lce_test::i64_tensor;
using lce_test::scalar_f32;

constexpr float kSentinel = 12345.0f;

// A valid small problem with sentinel-filled outputs; tests break one thing at a time.
struct Fixture {
  int64_t B = 3, H = 4, V = 5;
  Tensor x = Tensor::empty(DType::kF32, {3, 4});
  Tensor w = Tensor::empty(DType::kF32, {4, 5});
  Tensor bias = Tensor::empty(DType::kF32, {5});
  Tensor labels = i64_tensor({3}, {0, 4, -100});
  Tensor weights = f32_tensor({3}, {1, 2, 3});
  Tensor loss = Tensor::empty(DType::kF32, {});
  Tensor lse = Tensor::empty(DType::kF32, {3});
  Tensor dx = Tensor::empty(DType::kF32, {3, 4});
  Tensor dw = Tensor::empty(DType::kF32, {4, 5});
  Tensor dbias = Tensor::empty(DType::kF32, {5});
  Tensor g = scalar_f32(1.0f);
  Options opt;

  Fixture() {
    for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
    for (int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = 0.05f * static_cast<float>(i % 11) - 0.2f;
    for (int64_t i = 0; i < bias.numel(); ++i) bias.data_as<float>()[i] = 0.01f * static_cast<float>(i);
    for (Tensor* t : {&loss, &lse, &dx, &dw, &dbias})
      for (int64_t i = 0; i < t->numel(); ++i) t->data_as<float>()[i] = kSentinel;
    opt.implementation = "reference";
  }
  Inputs inputs() const { return Inputs{x, w, bias.view(), labels, weights.view()}; }
  ForwardOutputs fout() const { return {loss, lse, std::nullopt}; }
  Gradients grads() const { return {dx, dw, dbias.view()}; }
  bool untouched() const {
    for (const Tensor* t : {&loss, &lse, &dx, &dw, &dbias})
      for (int64_t i = 0; i < t->numel(); ++i)
        if (t->data_as<float>()[i] != kSentinel) return false;
    return true;
  }
};

// Runs forward, backward and fused with a mutation applied; each must throw `code` with a
// message containing `needle`, and leave every output untouched.
void expect_rejected(const std::function<void(Fixture&, Inputs&)>& mutate, ErrorCode code,
                     const std::string& needle) {
  for (int pass = 0; pass < 3; ++pass) {
    Fixture f;
    Inputs in = f.inputs();
    mutate(f, in);
    try {
      if (pass == 0) forward(in, f.fout(), f.opt);
      if (pass == 1) backward(in, f.g, f.grads(), f.opt);
      if (pass == 2) forward_backward(in, f.g, f.fout(), f.grads(), f.opt);
      ADD_FAILURE() << "pass " << pass << ": expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "pass " << pass << ": message '" << e.what() << "' lacks '" << needle << "'";
    }
    EXPECT_TRUE(f.untouched()) << "pass " << pass << " wrote an output before failing";
  }
}

TEST(LceApi, ValidProblemRunsAllThreePasses) {
  Fixture f;
  EXPECT_EQ(forward(f.inputs(), f.fout(), f.opt), "reference");
  EXPECT_NE(f.loss.data_as<float>()[0], kSentinel);
  EXPECT_TRUE(std::isfinite(f.loss.data_as<float>()[0]));
  EXPECT_EQ(backward(f.inputs(), f.g, f.grads(), f.opt), "reference");
  EXPECT_EQ(forward_backward(f.inputs(), f.g, f.fout(), f.grads(), f.opt), "reference");
}

TEST(LceApi, ShapeMismatches) {
  expect_rejected([](Fixture& f, Inputs& in) { f.labels = i64_tensor({2}, {0, 1}); in.labels = f.labels; },
                  ErrorCode::kInvalidArgument, "labels shape [2] does not match");
  expect_rejected([](Fixture& f, Inputs& in) { f.w = Tensor::empty(DType::kF32, {3, 5}); in.w = f.w; },
                  ErrorCode::kInvalidArgument, "no dimension equal to H=4");
  expect_rejected([](Fixture& f, Inputs& in) { f.bias = Tensor::zeros(DType::kF32, {4}); in.bias = f.bias.view(); },
                  ErrorCode::kInvalidArgument, "bias must be [V=5]");
  expect_rejected([](Fixture& f, Inputs& in) { f.weights = Tensor::zeros(DType::kF32, {3, 1}); in.token_weights = f.weights.view(); },
                  ErrorCode::kInvalidArgument, "token_weights shape");
  expect_rejected([](Fixture& f, Inputs& in) { f.opt.w_layout = WLayout::kVH; (void)in; },
                  ErrorCode::kInvalidArgument, "w_layout=vh expects w of shape [V, H=4]");
  expect_rejected([](Fixture& f, Inputs& in) { in.x = TensorView(f.x.data(), DType::kF32, {4, 3}, {1, 4}); },
                  ErrorCode::kInvalidArgument, "x must be contiguous");
  expect_rejected([](Fixture& f, Inputs& in) { in.x = TensorView(f.x.data(), DType::kF32, Shape{}); },
                  ErrorCode::kInvalidArgument, "at least one dimension");
  // An empty vocabulary in either layout is named as such, whatever its strides (NumPy gives an
  // empty array strides [0, 0]: it was refused as "w must be contiguous ..., got strides [0, 0]").
  for (const Shape& empty : {Shape{0, 4}, Shape{4, 0}})
    for (const Shape& strides : {contiguous_strides(empty), Shape{0, 0}})
      expect_rejected([&](Fixture& f, Inputs& in) { in.w = TensorView(f.w.data(), DType::kF32, empty, strides); },
                      ErrorCode::kInvalidArgument, "vocabulary size V must be >= 1");
}

TEST(LceApi, OutputShapeAndDtypeMismatches) {
  Fixture f;
  Tensor bad_loss = Tensor::empty(DType::kF32, {3});  // mean wants a 0-d loss
  EXPECT_THROW(forward(f.inputs(), {bad_loss, f.lse, std::nullopt}, f.opt), Error);
  Tensor bad_lse = Tensor::empty(DType::kBF16, {3});
  EXPECT_THROW(forward(f.inputs(), {f.loss, bad_lse, std::nullopt}, f.opt), Error);
  Tensor bad_dx = Tensor::empty(DType::kBF16, {3, 4});  // f32 x: dx must be f32
  EXPECT_THROW(backward(f.inputs(), f.g, {bad_dx, f.dw, f.dbias.view()}, f.opt), Error);
  Tensor bad_dw = f.dw.as_strided({4, 5}, {1, 4});      // not w's layout
  EXPECT_THROW(backward(f.inputs(), f.g, {f.dx, bad_dw, f.dbias.view()}, f.opt), Error);
  // (dbias left out with a bias given is a skipped gradient since v0.16: LceSkippedGradients.)
  EXPECT_THROW(backward(f.inputs(), f.g, {f.dx, bad_dw, std::nullopt}, f.opt), Error);
  Tensor g_none = Tensor::empty(DType::kF32, {2});
  EXPECT_THROW(backward(f.inputs(), g_none, f.grads(), f.opt), Error);
  Options o = f.opt;
  o.return_argmax = true;  // without an argmax output
  EXPECT_THROW(forward(f.inputs(), f.fout(), o), Error);
  EXPECT_TRUE(f.untouched());
}

TEST(LceApi, LabelOutsideRange) {
  expect_rejected([](Fixture& f, Inputs& in) { f.labels.data_as<int64_t>()[1] = 5; in.labels = f.labels; },
                  ErrorCode::kInvalidArgument, "label 5 at token 1 is outside [0, V=5)");
  expect_rejected([](Fixture& f, Inputs& in) { f.labels.data_as<int64_t>()[0] = -1; in.labels = f.labels; },
                  ErrorCode::kInvalidArgument, "label -1 at token 0");
  // -100 is fine only while it is the ignore_index.
  expect_rejected([](Fixture& f, Inputs&) { f.opt.ignore_index = -1; }, ErrorCode::kInvalidArgument,
                  "label -100 at token 2");
}

TEST(LceApi, NonFiniteInputs) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // check_finite is off by default (ExecOptions): turned on here, as the CLI's run does.
  expect_rejected([&](Fixture& f, Inputs&) { f.opt.check_finite = true; f.x.data_as<float>()[5] = nan; }, ErrorCode::kInvalidArgument,
                  "x contains NaN or Inf");
  expect_rejected([&](Fixture& f, Inputs&) { f.opt.check_finite = true; f.w.data_as<float>()[7] = INFINITY; }, ErrorCode::kInvalidArgument,
                  "w contains NaN or Inf");
  expect_rejected([&](Fixture& f, Inputs&) { f.opt.check_finite = true; f.bias.data_as<float>()[0] = -INFINITY; }, ErrorCode::kInvalidArgument,
                  "bias contains NaN or Inf");
  expect_rejected([&](Fixture& f, Inputs&) { f.opt.check_finite = true; f.weights.data_as<float>()[2] = nan; }, ErrorCode::kInvalidArgument,
                  "token_weights contain NaN or Inf");
  // The upstream gradient (backward passes only).
  Fixture f;
  f.g.data_as<float>()[0] = nan;
  EXPECT_THROW(backward(f.inputs(), f.g, f.grads(), f.opt), Error);
  EXPECT_TRUE(f.untouched());
}

TEST(LceApi, UnsupportedDtypes) {
  expect_rejected([](Fixture& f, Inputs& in) { f.x = Tensor::zeros(DType::kI32, {3, 4}); in.x = f.x; },
                  ErrorCode::kInvalidArgument, "x must be f32, bf16 or f16, got i32");
  expect_rejected([](Fixture& f, Inputs& in) { f.w = Tensor::zeros(DType::kBF16, {4, 5}); in.w = f.w; },
                  ErrorCode::kInvalidArgument, "w dtype bf16 differs from x dtype f32");
  expect_rejected([](Fixture& f, Inputs& in) { f.labels = Tensor::zeros(DType::kF32, {3}); in.labels = f.labels; },
                  ErrorCode::kInvalidArgument, "labels must be i32 or i64, got f32");
  expect_rejected([](Fixture& f, Inputs& in) { f.weights = Tensor::zeros(DType::kBF16, {3}); in.token_weights = f.weights.view(); },
                  ErrorCode::kInvalidArgument, "token_weights must be f32");
}

TEST(LceApi, BadOptions) {
  expect_rejected([](Fixture& f, Inputs&) { f.opt.label_smoothing = 1.5; }, ErrorCode::kInvalidArgument, "label_smoothing");
  expect_rejected([](Fixture& f, Inputs&) { f.opt.z_loss_weight = -1; }, ErrorCode::kInvalidArgument, "z_loss_weight");
  expect_rejected([](Fixture& f, Inputs&) { f.opt.softcap = NAN; }, ErrorCode::kInvalidArgument, "softcap");
  // Past FLT_MAX: inf in the cuda rows (and in the f32 logits a cap divides).
  expect_rejected([](Fixture& f, Inputs&) { f.opt.softcap = 1e39; }, ErrorCode::kInvalidArgument,
                  "softcap must be 0 (off) or in [");
  // Below FLT_MIN: the forward dropped the cap (loss uncapped) and dx was inf / NaN.
  expect_rejected([](Fixture& f, Inputs&) { f.opt.softcap = 1e-50; }, ErrorCode::kInvalidArgument,
                  "softcap must be 0 (off) or in [");
  expect_rejected([](Fixture& f, Inputs&) { f.opt.z_loss_weight = 1e39; }, ErrorCode::kInvalidArgument,
                  "z_loss_weight must be finite in f32 and >= 0");
}

TEST(LceApi, UnknownImplementationFailsBeforeRunning) {
  expect_rejected([](Fixture& f, Inputs&) { f.opt.implementation = "reference,nope"; }, ErrorCode::kNotFound,
                  "unknown implementation 'nope'");
  expect_rejected([](Fixture& f, Inputs&) { f.opt.implementation = "cuda-typo"; }, ErrorCode::kNotFound,
                  "unknown implementation 'cuda-typo'");
}

TEST(LceApi, InputsOnADeviceWithNoImplementationFailClearly) {
  Fixture f;
  Inputs in = f.inputs();
  // A view that claims to live on a GPU: every input on cuda, so validation passes and dispatch
  // must find no implementation for it (or, with the CUDA backend built, not crash on a
  // machine without a GPU).
  auto on_cuda = [](const TensorView& v) {
    TensorView d = v;
    d.device = Device::cuda();
    return d;
  };
  in.x = on_cuda(in.x);
  in.w = on_cuda(in.w);
  in.bias = on_cuda(*in.bias);
  in.labels = on_cuda(in.labels);
  in.token_weights = on_cuda(*in.token_weights);
  ForwardOutputs out{on_cuda(f.loss), on_cuda(f.lse), std::nullopt};
  Options o;
  o.implementation = "reference";
  try {
    forward(in, out, o);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("reference runs on host memory"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(f.untouched());
  // Mixed devices are an argument error.
  expect_rejected([&](Fixture& g, Inputs& i) { (void)g; i.w = on_cuda(i.w); }, ErrorCode::kInvalidArgument,
                  "w is on cuda:0 but x is on cpu");
}

TEST(LceApi, UnbatchedExampleAndLeadingAxes) {
  Fixture f;
  Options o = f.opt;
  o.reduction = Reduction::kNone;
  // [H] with a 0-d label.
  TensorView x1(f.x.data(), DType::kF32, {4});
  Tensor y1 = i64_tensor({}, {2});
  Result r = compute({x1, f.w, std::nullopt, y1, std::nullopt}, o);
  EXPECT_EQ(r.loss.shape(), Shape{});
  // [3, 1, 4] with labels [3, 1] gives a [3, 1] loss equal to the flat case.
  TensorView x3(f.x.data(), DType::kF32, {3, 1, 4});
  TensorView y3(f.labels.data(), DType::kI64, {3, 1});
  Result r3 = compute({x3, f.w, std::nullopt, y3, std::nullopt}, o);
  Result rf = compute({f.x, f.w, std::nullopt, f.labels, std::nullopt}, o);
  ASSERT_EQ(r3.loss.shape(), (Shape{3, 1}));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r3.loss.data_as<float>()[i], rf.loss.data_as<float>()[i]);
  EXPECT_EQ(r.loss.data_as<float>()[0], compute({TensorView(f.x.data(), DType::kF32, {1, 4}), f.w, std::nullopt,
                                                 i64_tensor({1}, {2}), std::nullopt}, o).loss.data_as<float>()[0]);
}

TEST(LceApi, WeightLayoutsAgree) {
  // The same math through [H, V], [V, H] and transposed views of each.
  Fixture f;
  Options o = f.opt;
  o.reduction = Reduction::kNone;
  Tensor wvh = Tensor::empty(DType::kF32, {5, 4});
  for (int h = 0; h < 4; ++h)
    for (int v = 0; v < 5; ++v) wvh.data_as<float>()[v * 4 + h] = f.w.data_as<float>()[h * 5 + v];
  const Result a = compute({f.x, f.w, f.bias.view(), f.labels, std::nullopt}, o);
  const Result b = compute({f.x, wvh, f.bias.view(), f.labels, std::nullopt}, o);
  const Result c = compute({f.x, wvh.as_strided({4, 5}, {1, 4}), f.bias.view(), f.labels, std::nullopt}, o);
  const Result d = compute({f.x, f.w.as_strided({5, 4}, {1, 5}), f.bias.view(), f.labels, std::nullopt}, o);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.loss.data_as<float>()[i], b.loss.data_as<float>()[i]);
    EXPECT_EQ(a.loss.data_as<float>()[i], c.loss.data_as<float>()[i]);
    EXPECT_EQ(a.loss.data_as<float>()[i], d.loss.data_as<float>()[i]);
  }
  // Gradients come back in w's own layout.
  const Result gc = compute_with_grad({f.x, wvh.as_strided({4, 5}, {1, 4}), f.bias.view(), f.labels, std::nullopt}, o);
  const Result ga = compute_with_grad({f.x, f.w, f.bias.view(), f.labels, std::nullopt}, o);
  EXPECT_EQ(gc.dw.view().strides, (Shape{1, 4}));
  for (int h = 0; h < 4; ++h)
    for (int v = 0; v < 5; ++v)
      EXPECT_EQ(gc.dw.data_as<float>()[v * 4 + h], ga.dw.data_as<float>()[h * 5 + v]);
}

TEST(LceApi, ReductionNoneAppliesEachUpstreamGradient) {
  // Peer bug: reduction="none" backward applied only the first upstream gradient (and gave
  // ignored rows a gradient). Token 2 is ignored: its dx is 0 whatever its upstream gradient.
  std::vector<const char*> impls = {"reference"};
  if (::tessera::testing::kHaveCpuBackend) impls.insert(impls.end(), {"cpu", "cpu_v2"});
  for (const char* impl : impls) {
    Fixture f;
    Options o = f.opt;
    o.implementation = impl;
    o.reduction = Reduction::kNone;
    const auto dx_of = [&](std::initializer_list<float> g) {
      Tensor dx = Tensor::empty(DType::kF32, {3, 4});
      backward(f.inputs(), f32_tensor({3}, g), {dx, f.dw, f.dbias.view()}, o);
      return dx;
    };
    const Tensor dx1 = dx_of({1, 0, 0}), dx2 = dx_of({0, 1, 0}), dx3 = dx_of({0, 0, 1}), all = dx_of({1, 1, 1});
    for (int h = 0; h < 4; ++h) {
      EXPECT_NE(dx1.data_as<float>()[h], 0.0f) << impl;      // token 0 has gradient under g1
      EXPECT_EQ(dx1.data_as<float>()[4 + h], 0.0f) << impl;  // token 1 has none under g1
      EXPECT_EQ(dx2.data_as<float>()[h], 0.0f) << impl;
      EXPECT_NE(dx2.data_as<float>()[4 + h], 0.0f) << impl;
      for (int t = 0; t < 3; ++t) EXPECT_EQ(dx3.data_as<float>()[t * 4 + h], 0.0f) << impl << " token " << t;
      EXPECT_EQ(all.data_as<float>()[8 + h], 0.0f) << impl;  // the ignored row
      // Each row's gradient is its own upstream gradient's (weights 1 and 2 are in dx already).
      EXPECT_FLOAT_EQ(all.data_as<float>()[h], dx1.data_as<float>()[h]) << impl;
      EXPECT_FLOAT_EQ(all.data_as<float>()[4 + h], dx2.data_as<float>()[4 + h]) << impl;
    }
  }
}

TEST(LceApi, EnvironmentOverrideAndUnknownNames) {
  Fixture f;
  Options o;  // no implementation named: default order / env override
  setenv("TESSERA_IMPLEMENTATION", "reference", 1);
  EXPECT_EQ(forward(f.inputs(), f.fout(), o), "reference");
  setenv("TESSERA_IMPLEMENTATION", "bogus", 1);
  EXPECT_THROW(forward(f.inputs(), f.fout(), o), Error);
  unsetenv("TESSERA_IMPLEMENTATION");
  EXPECT_FALSE(forward(f.inputs(), f.fout(), o).empty());
}

TEST(LceApi, ImplementationsAreListed) {
  bool has_reference = false;
  for (const auto& i : implementations()) {
    if (i.name == "reference") has_reference = i.available;
    EXPECT_FALSE(i.description.empty());
    if (!i.available) EXPECT_FALSE(i.unavailable_reason.empty());
  }
  EXPECT_TRUE(has_reference);
}

}  // namespace
}  // namespace tessera::linear_cross_entropy
