// dispatch::TensorRules: a kernel's tensors declared by named dims; binding a call checks rank,
// every dim against the first tensor that named it, dtypes and places, with one-line messages.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/tensor_rules.h"
#include "core/invalid_argument.h"
#include "tessera/error.h"

namespace tessera::dispatch {
namespace {

template <class F>
std::string message_of(F&& f) {
  return testing_errors::invalid_argument_message(std::forward<F>(f));
}

const TensorRules& rules() {
  static const TensorRules r{"foo",
                             {{"q", "B,S,D", "float"},
                              {"k", "B,S,D", "=q"},
                              {"gates", "B,4,S", "=q|f32"},
                              {"lens", "B", "i32", true},
                              {"mask", "B,S", "int"},
                              {"pair", "N,N", "any"}}};
  return r;
}

Tensor t(DType d, Shape s) { return Tensor::zeros(d, std::move(s)); }

TEST(TensorRules, BindsDimsFromTheFirstTensorAndChecksTheOthers) {
  const Tensor q = t(DType::kBF16, {2, 3, 8}), k = t(DType::kBF16, {2, 3, 8}), g = t(DType::kF32, {2, 4, 3});
  const Tensor lens = t(DType::kI32, {2});
  const Dims d = rules().bind({{"q", q.view()}, {"k", k.view()}, {"gates", g.view()}, {"lens", lens.view()}});
  EXPECT_EQ(d["B"], 2);
  EXPECT_EQ(d["S"], 3);
  EXPECT_EQ(d["D"], 8);
  EXPECT_EQ(d.shape("B,S,D"), (Shape{2, 3, 8}));
  EXPECT_EQ(d.shape("4,B"), (Shape{4, 2}));
  EXPECT_EQ(d.shape(""), Shape{});
  EXPECT_EQ(d.dtype("=q"), DType::kBF16);
  EXPECT_EQ(d.dtype("=q|f32"), DType::kBF16);
  EXPECT_EQ(d.dtype("i32"), DType::kI32);
  EXPECT_TRUE(d.device().type == DeviceType::kCPU);
}

TEST(TensorRules, EachFailureIsOneLineNamingTheTensorAndTheBoundSizes) {
  const Tensor q = t(DType::kBF16, {2, 3, 8});
  auto bind_k = [&](const Tensor& k) { return message_of([&] { rules().bind({{"q", q.view()}, {"k", k.view()}}); }); };
  EXPECT_EQ(bind_k(t(DType::kBF16, {2, 3, 8})), "");
  EXPECT_EQ(bind_k(t(DType::kBF16, {2, 4, 8})), "foo: k must be [B=2, S=3, D=8], got [2, 4, 8]");
  EXPECT_EQ(bind_k(t(DType::kBF16, {2, 3})), "foo: k must be [B=2, S=3, D=8], got [2, 3]");
  EXPECT_EQ(bind_k(t(DType::kF32, {2, 3, 8})), "foo: k must be bf16 like q, got f32");
  const Tensor qi = t(DType::kI32, {2, 3, 8});
  EXPECT_EQ(message_of([&] { rules().bind({{"q", qi.view()}}); }), "foo: q must be f32, bf16 or f16, got i32");
  auto bind_g = [&](const Tensor& g) { return message_of([&] { rules().bind({{"q", q.view()}, {"gates", g.view()}}); }); };
  EXPECT_EQ(bind_g(t(DType::kF32, {2, 4, 3})), "");  // f32 is allowed beside q's dtype
  EXPECT_EQ(bind_g(t(DType::kF16, {2, 4, 3})), "foo: gates must be f32 or bf16 (q's dtype), got f16");
  EXPECT_EQ(bind_g(t(DType::kBF16, {2, 5, 3})), "foo: gates must be [B=2, 4, S=3], got [2, 5, 3]");
  const Tensor m = t(DType::kF32, {2, 3});
  EXPECT_EQ(message_of([&] { rules().bind({{"q", q.view()}, {"mask", m.view()}}); }),
            "foo: mask must be int32 or int64, got f32");
}

TEST(TensorRules, ARepeatedNameMustAgreeWithinOneTensor) {
  const Tensor sq = t(DType::kF32, {3, 3}), rect = t(DType::kF32, {3, 4});
  EXPECT_EQ(message_of([&] { rules().bind({{"pair", sq.view()}}); }), "");
  EXPECT_EQ(message_of([&] { rules().bind({{"pair", rect.view()}}); }), "foo: pair must be [N, N], got [3, 4]");
}

TEST(TensorRules, PlacesAreCheckedInFullModeOnly) {
  const Tensor q = t(DType::kF32, {2, 3, 8});
  const Tensor strided = t(DType::kF32, {2, 8, 3}).as_strided({2, 3, 8}, {24, 1, 3});
  EXPECT_EQ(message_of([&] { rules().bind({{"q", q.view()}, {"k", strided.view()}}); }),
            "foo: k must be contiguous (row-major), got strides [24, 1, 3] for shape [2, 3, 8]");
  EXPECT_EQ(message_of([&] { rules().bind({{"q", q.view()}, {"k", strided.view()}}, BindMode::kShapesOnly); }), "");
  TensorView dev = q.view();
  dev.device = Device{DeviceType::kCUDA, 0};
  EXPECT_EQ(message_of([&] { rules().bind({{"q", q.view()}, {"k", dev}}); }),
            "foo: k is on " + dev.device.str() + " but q is on " + Device::cpu().str());
  TensorView lens = t(DType::kI32, {2}).view();
  lens.device = Device{DeviceType::kCUDA, 0};
  EXPECT_NE(message_of([&] { rules().bind({{"q", q.view()}, {"lens", lens}}); }).find("lens must be in host memory"),
            std::string::npos);
}

TEST(TensorRules, AbsentOptionalTensorsAreSkippedAndUnknownNamesAreBugs) {
  const Tensor q = t(DType::kF32, {2, 3, 8});
  const TensorView absent;
  const Dims d = rules().bind({{"q", q.view()}, {"mask", absent}, {"lens", TensorView{}}});
  EXPECT_FALSE(d.has("N"));
  EXPECT_THROW(d["N"], std::logic_error);
  EXPECT_THROW(rules().bind({{"nope", q.view()}}), std::logic_error);
}

TEST(TensorRules, OutputsAreCheckedAgainstTheBoundDims) {
  const Tensor q = t(DType::kBF16, {2, 3, 8});
  Dims d = rules().bind({{"q", q.view()}});
  const Tensor o = t(DType::kF32, {2, 3, 8}), bad = t(DType::kF16, {2, 3, 8});
  EXPECT_EQ(message_of([&] { d.check(o.view(), "o", "B,S,D", "=q|f32"); }), "");
  EXPECT_EQ(message_of([&] { d.check(bad.view(), "o", "B,S,D", "=q|f32"); }), "foo: o must be f32 or bf16 (q's dtype), got f16");
  d.set("V", 5);
  const Tensor lse = t(DType::kF32, {2, 4});
  EXPECT_EQ(message_of([&] { d.check(lse.view(), "lse", "B,V", "f32"); }), "foo: lse must be [B=2, V=5], got [2, 4]");
}

// A help text takes the rule's words, so the help says what the check checks.
TEST(TensorRules, RuleTextSaysShapeDtypeAndPlace) {
  EXPECT_EQ(rule_text({"q", "B,S,D", "float"}), "[B, S, D] (f32, bf16 or f16)");
  EXPECT_EQ(rule_text({"k", "B,S,D", "=q"}), "[B, S, D] (q's dtype)");
  EXPECT_EQ(rule_text({"dq", "B,S,D", "=q|f32"}), "[B, S, D] (q's dtype or f32)");
  EXPECT_EQ(rule_text({"mask", "B,S", "int", true}), "[B, S] (int32 or int64, host memory)");
  EXPECT_EQ(rule_text({"lens", "B", "i32", true}), "[B] (int32, host memory)");
  EXPECT_EQ(rule_text({"ids", "N", "i64"}), "[N] (int64)");
  EXPECT_EQ(rule_text({"s", "", "f32"}), "[] (f32)");
  const TensorRule m{"mask", "B,S", "int"};
  EXPECT_EQ(help_text("reset mask", m), "reset mask [B, S] (int32 or int64)");
  EXPECT_EQ(help_text("reset mask: nonzero resets", m), "reset mask [B, S] (int32 or int64): nonzero resets");
  EXPECT_EQ(help_text("reset mask; no gradient: ever", m), "reset mask [B, S] (int32 or int64); no gradient: ever");
}

TEST(TensorRules, BindTakesNamedViewsInAnyContainer) {
  Tensor q = t(DType::kF32, {2, 3, 4}), k = t(DType::kF32, {2, 3, 4});
  const std::vector<std::pair<std::string, TensorView>> views{{"k", k.view()}, {"q", q.view()}};
  const Dims d = rules().bind(views);  // bound in the rules' order: q first, whatever the list's
  EXPECT_EQ(d["S"], 3);
  Tensor k_bad = t(DType::kF32, {2, 5, 4});
  EXPECT_EQ((message_of([&] { rules().bind(std::vector<std::pair<std::string, TensorView>>{{"k", k_bad.view()},
                                                                                             {"q", q.view()}}); })),
            "foo: k must be [B=2, S=3, D=4], got [2, 5, 4]");
}

}  // namespace
}  // namespace tessera::dispatch
