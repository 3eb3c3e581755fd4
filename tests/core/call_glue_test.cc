// The call and bench glue of kernels/registry.h that every kernel's spec.cc uses: a call's outputs
// by name (their count checked), optional inputs, the exec options, one bench factory.
#include <gtest/gtest.h>

#include "kernels/registry.h"
#include "tessera/error.h"

namespace tessera::kernels {
namespace {

TEST(CallGlue, OutputsByNameAndTheirCount) {
  CallArgs a;
  a.pass = Pass::kBackward;
  Tensor x = Tensor::zeros(DType::kF32, {2}), y = Tensor::zeros(DType::kF32, {3});
  const std::vector<OutputDesc> want = {{"dx", DType::kF32, {2}, {1}}, {"dy", DType::kF32, {3}, {1}}};
  const CallOutputs o(want, {x.view(), y.view()}, a, "foo");
  EXPECT_EQ(o["dy"].data, y.data());
  EXPECT_EQ(o["dz"].data, nullptr);  // not written by this pass: an empty view
  EXPECT_EQ(o.all().size(), 2u);
  try {
    (void)CallOutputs(want, {x.view()}, a, "foo");
    FAIL() << "a missing output was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_STREQ(e.what(), "foo: backward writes 2 outputs, got 1");
  }
}

TEST(CallGlue, OptionalInputsAndExecOptions) {
  struct Options : ExecOptions {
    int64_t block = 0;
  };
  CallArgs a;
  Tensor h0 = Tensor::zeros(DType::kF32, {4});
  a.tensors = {{"h0", h0.view()}};
  a.exec.implementation = "cpu";
  a.exec.num_threads = 3;
  EXPECT_EQ(a.tensor_or_empty("h0").data, h0.data());
  EXPECT_EQ(a.tensor_or_empty("c0").data, nullptr);
  EXPECT_TRUE(a.tensor_or_empty("c0").shape.empty());
  const Options opt = exec_options<Options>(a);
  EXPECT_EQ(opt.implementation, "cpu");
  EXPECT_EQ(opt.num_threads, 3);
  EXPECT_EQ(opt.block, 0);
}

bool g_with_data = false;
uint64_t g_seed = 99;
std::unique_ptr<harness::BenchProblem> fake(const harness::GridShape&, DType, const harness::OptionValues&,
                                            uint64_t seed, bool with_data) {
  g_with_data = with_data, g_seed = seed;
  return nullptr;
}

TEST(CallGlue, OneBenchFactoryGivesTheProblemAndItsCostModel) {
  const BenchSpec b = bench_spec_of({{"routing", harness::OptionSpec::Kind::kString, "help", "balanced", {}}}, fake);
  ASSERT_EQ(b.options.size(), 1u);
  EXPECT_EQ(b.options[0].name, "routing");
  b.make_problem(harness::GridShape{}, DType::kF32, {}, 7);
  EXPECT_TRUE(g_with_data);
  EXPECT_EQ(g_seed, 7u);
  b.make_cost_model(harness::GridShape{}, DType::kF32, {});
  EXPECT_FALSE(g_with_data);  // --predict: no inputs generated
}

}  // namespace
}  // namespace tessera::kernels
