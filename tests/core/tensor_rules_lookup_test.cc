// dispatch/tensor_rules.h / registry.h: an output or upstream gradient checked against its own declared rule;
// kernels/tensor_rules.h / registry.h: an output's shape and dtype from its rule.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "dispatch/tensor_rules.h"
#include "kernels/registry.h"
#include "tessera/error.h"

namespace tessera::dispatch {
namespace {

const TensorRules& rules() {
  static const TensorRules r{"foo", {{"q", "B,S", "float"}, {"h", "B,S,D", "=q|f32"}, {"last", "B,D", "f32"}}};
  return r;
}

std::string check_h(Dims& d, const TensorView& h) {
  try {
    check_rule(d, rules(), "h", h);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TensorRulesLookup, RuleOfFindsTheDeclarationAndRefusesAnUnknownName) {
  EXPECT_EQ(rule_of(rules(), "h").dims, "B,S,D");
  EXPECT_EQ(rule_of(rules(), "last").dtype, "f32");
  EXPECT_THROW(rule_of(rules(), "nope"), std::logic_error);
}

TEST(TensorRulesLookup, CheckRuleBindsNewDimsAndChecksTheBoundOnes) {
  const Tensor q = Tensor::zeros(DType::kBF16, {2, 3});
  Dims d = rules().bind({{"q", q.view()}});
  EXPECT_EQ(check_h(d, Tensor::zeros(DType::kF32, {2, 3, 5}).view()), "");  // binds D = 5; f32 allowed
  EXPECT_EQ(d["D"], 5);
  EXPECT_EQ(check_h(d, Tensor::zeros(DType::kBF16, {2, 3, 4}).view()), "foo: h must be [B=2, S=3, D=5], got [2, 3, 4]");
  EXPECT_EQ(check_h(d, Tensor::zeros(DType::kF16, {2, 3, 5}).view()), "foo: h must be f32 or bf16 (q's dtype), got f16");
  EXPECT_EQ(check_h(d, TensorView{}), "foo: h must be [B=2, S=3, D=5], got []");  // a required output absent
}

TEST(TensorRulesLookup, DeclaredOutputTakesTheRulesDimsAndDtype) {
  const Tensor q = Tensor::zeros(DType::kBF16, {2, 3});
  Dims d = rules().bind({{"q", q.view()}});
  d.set("D", 4);
  const kernels::OutputDesc h = kernels::declared_output(d, rules(), "h");
  const kernels::OutputDesc last = kernels::declared_output(d, rules(), "last");
  EXPECT_EQ(h.name, "h");
  EXPECT_EQ(h.dtype, DType::kBF16);  // "=q|f32" allocates q's dtype
  EXPECT_EQ(h.shape, (Shape{2, 3, 4}));
  EXPECT_EQ(h.strides, (Shape{12, 4, 1}));
  EXPECT_EQ(last.dtype, DType::kF32);
  EXPECT_EQ(last.shape, (Shape{2, 4}));
}

}  // namespace
}  // namespace tessera::dispatch
