// kernels/declared_signature.h: an option declared by the Options field it sets takes its kind and
// default from the field and parses back into it.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "kernels/declared_signature.h"
#include "tune/declared.h"
#include "tessera/error.h"

namespace tessera::kernels {
namespace {

enum class Mode { kFast, kExact };
const char* mode_name(Mode m) noexcept { return m == Mode::kFast ? "fast" : "exact"; }
Mode parse_mode(const std::string& s) {
  if (s == "fast") return Mode::kFast;
  if (s == "exact") return Mode::kExact;
  throw Error(ErrorCode::kInvalidArgument, "unknown mode '" + s + "' (expected fast or exact)");
}

struct Sizes {
  int64_t m = 0;
};
Sizes sizes_from(const tune::Params& p) { return {tune::param(p, "m").value_or(0)}; }
tune::Params sizes_to(const Sizes& s) { return {{"m", s.m}}; }

struct Opts : ExecOptions {
  bool on = true;
  int64_t window = -1;
  double eps = 1e-6;
  std::optional<double> scale;
  std::optional<int64_t> offset;
  Mode mode = Mode::kExact;
  std::optional<Sizes> sizes;
};

const DeclaredOptions<Opts>& declared() {
  static const DeclaredOptions<Opts> d{
      "toy",
      {field(&Opts::on, "on", "a flag on by default"), field(&Opts::window, "window", "an int", {"win"}),
       field(&Opts::eps, "eps", "a float"), field(&Opts::scale, "scale", "0: unset", "0"),
       field(&Opts::offset, "offset", "-1: unset", "-1"),
       choice(&Opts::mode, "mode", "fast or exact", {"fast", "exact"}, parse_mode, mode_name),
       block_sizes_field(&Opts::sizes, "m=64", sizes_from, sizes_to),
       plain<Opts>({"return_extra", harness::OptionSpec::Kind::kFlag, "an output choice", "false", {}})}};
  return d;
}

CallArgs args_with(std::map<std::string, std::string> given) {
  CallArgs a;
  a.options = harness::defaults_of(declared().specs());
  for (auto& [k, v] : given) a.options.set(k, v);
  return a;
}

TEST(DeclaredOptions, KindAndDefaultComeFromTheField) {
  using K = harness::OptionSpec::Kind;
  const std::vector<harness::OptionSpec> s = declared().specs();
  ASSERT_EQ(s.size(), 8u);
  EXPECT_EQ(s[0].kind, K::kFlag);
  EXPECT_EQ(s[0].default_value, "true");
  EXPECT_EQ(s[1].kind, K::kInt);
  EXPECT_EQ(s[1].default_value, "-1");
  EXPECT_EQ(s[1].aliases, std::vector<std::string>{"win"});
  EXPECT_EQ(s[2].kind, K::kFloat);
  EXPECT_EQ(s[2].default_value, "1e-06");  // the shortest text that parses back
  EXPECT_EQ(s[3].default_value, "0");
  EXPECT_EQ(s[3].kind, K::kFloat);
  EXPECT_EQ(s[4].default_value, "-1");
  EXPECT_EQ(s[4].kind, K::kInt);
  EXPECT_EQ(s[5].kind, K::kString);
  EXPECT_EQ(s[5].default_value, "exact");
  EXPECT_EQ(s[5].choices, (std::vector<std::string>{"fast", "exact"}));
  EXPECT_EQ(s[6].name, "block_sizes");
  EXPECT_EQ(s[7].name, "return_extra");
}

TEST(DeclaredOptions, DefaultsParseIntoADefaultConstructedOptions) {
  const Opts o = declared().parse(args_with({}));
  const Opts want;
  EXPECT_EQ(o.on, want.on);
  EXPECT_EQ(o.window, want.window);
  EXPECT_EQ(o.eps, want.eps);
  EXPECT_FALSE(o.scale.has_value());
  EXPECT_FALSE(o.offset.has_value());
  EXPECT_EQ(o.mode, want.mode);
  EXPECT_FALSE(o.sizes.has_value());
}

TEST(DeclaredOptions, GivenValuesReachTheirFields) {
  CallArgs a = args_with({{"on", "false"}, {"window", "7"}, {"eps", "0.25"}, {"scale", "0.5"}, {"offset", "3"},
                          {"mode", "fast"}, {"block_sizes", "m=128"}});
  a.exec.num_threads = 3;
  const Opts o = declared().parse(a);
  EXPECT_FALSE(o.on);
  EXPECT_EQ(o.window, 7);
  EXPECT_EQ(o.eps, 0.25);
  EXPECT_EQ(o.scale, 0.5);
  EXPECT_EQ(o.offset, 3);
  EXPECT_EQ(o.mode, Mode::kFast);
  ASSERT_TRUE(o.sizes.has_value());
  EXPECT_EQ(o.sizes->m, 128);
  EXPECT_EQ(o.num_threads, 3);  // the ExecOptions come along
}

TEST(DeclaredOptions, TheUnsetValueUnsetsWhateverItsSpelling) {
  EXPECT_FALSE(declared().parse(args_with({{"scale", "0.0"}})).scale.has_value());
  EXPECT_FALSE(declared().parse(args_with({{"offset", "-1"}})).offset.has_value());
  EXPECT_EQ(declared().parse(args_with({{"offset", "-2"}})).offset, -2);  // a range check is the kernel's
}

struct FloatOpts : ExecOptions {
  float eps = 1e-6f;
};
enum class Bad { kA };
const char* bad_name(Bad) noexcept { return "?"; }
Bad parse_bad(const std::string&) { return Bad::kA; }
struct BadOpts : ExecOptions {
  Bad b = Bad::kA;
};

TEST(DeclaredOptions, AFloatFieldKeepsItsOwnShortestText) {
  const OptionField<FloatOpts> f = field(&FloatOpts::eps, "eps", "a float");
  EXPECT_EQ(f.spec.default_value, "1e-06");
}

TEST(DeclaredOptions, AChoiceWhoseDefaultIsNoChoiceIsADeclarationBug) {
  EXPECT_THROW(choice(&BadOpts::b, "b", "", {"a"}, parse_bad, bad_name), std::logic_error);
}

TEST(DeclaredOptions, BadValuesAreOneLineErrors) {
  EXPECT_THROW(declared().parse(args_with({{"window", "seven"}})), Error);
  EXPECT_THROW(declared().parse(args_with({{"mode", "slow"}})), Error);
  try {
    declared().parse(args_with({{"block_sizes", "n=3"}}));
    FAIL() << "a block size field that does not exist was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("toy: block_sizes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::kernels

namespace tessera::kernels {
namespace {

struct Ins {
  TensorView x;                     // required
  TensorView state;                 // optional: an empty view when absent
  std::optional<TensorView> bias;   // optional
};

const DeclaredInputs<Ins>& declared_inputs() {
  static const DeclaredInputs<Ins> d{"toy",
                                     {input(&Ins::x, {"x", "required", true, true}),
                                      input(&Ins::state, {"state", "optional view", false, false, {}, true}),
                                      input(&Ins::bias, {"bias", "optional", true, true})}};
  return d;
}

TEST(DeclaredInputs, SpecsKeepTheDeclarationAndAnOptionalFieldIsNeverRequired) {
  const std::vector<CallInput> s = declared_inputs().specs();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_TRUE(s[0].required && s[0].differentiable);
  EXPECT_FALSE(s[1].required);
  EXPECT_TRUE(s[1].host_only);
  EXPECT_FALSE(s[2].required);  // declared required, but the field is optional
  EXPECT_TRUE(s[2].differentiable);
}

TEST(DeclaredInputs, EachGivenTensorReachesItsField) {
  Tensor x = Tensor::empty(DType::kF32, {2, 3}), b = Tensor::empty(DType::kF32, {3});
  CallArgs a;
  a.tensors = {{"x", x.view()}, {"bias", b.view()}};
  const Ins in = declared_inputs().parse(a);
  EXPECT_EQ(in.x.data, x.data());
  EXPECT_EQ(in.x.shape, x.shape());
  EXPECT_EQ(in.state.data, nullptr);
  EXPECT_TRUE(in.state.shape.empty());
  ASSERT_TRUE(in.bias.has_value());
  EXPECT_EQ(in.bias->data, b.data());
  a.tensors = {{"x", x.view()}};
  EXPECT_FALSE(declared_inputs().parse(a).bias.has_value());
}

TEST(DeclaredInputs, AMissingRequiredInputIsOneLineError) {
  CallArgs a;
  try {
    declared_inputs().parse(a);
    FAIL() << "parsed without x";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "toy: x is required");
  }
}

// ---- one declaration per tensor: dispatch::DeclaredTensors and what derives from it ----
struct Cell {
  TensorView x, mask, s0, n0;
};

const dispatch::DeclaredTensors<Cell>& cell_tensors() {
  static const dispatch::DeclaredTensors<Cell> t{
      "cell",
      {{&Cell::x, {"x", "B,S,D", "float"}, "inputs; scaled", true, true},
       {&Cell::mask, {"mask", "B,S", "int", true}, "reset mask", false},
       {&Cell::s0, {"s0", "B,D", "f32"}, "initial state", false, true, {"state"}},
       {&Cell::n0, {"n0", "B,D", "f32"}, "initial normalizer", false}},
      {{"h", "B,S,D", "=x|f32"}, {"s_last", "B,D", "f32"}, {"dx", "B,S,D", "=x"}, {"ds0", "B,D", "f32"}}};
  return t;
}

TEST(DeclaredTensors, InputsComeFirstThenTheOutputsRules) {
  const auto& r = cell_tensors().rules().rules();
  ASSERT_EQ(r.size(), 8u);
  EXPECT_EQ(r[0].name, "x");
  EXPECT_TRUE(r[1].host);
  EXPECT_EQ(r[4].name, "h");
  EXPECT_EQ(cell_tensors().args().kernel(), "cell");
}

TEST(DeclaredTensors, TheCallSignatureDerivesFromTheDeclaration) {
  const std::vector<CallInput> s = inputs_of(cell_tensors()).specs();
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].name, "x");
  EXPECT_EQ(s[0].help, "inputs [B, S, D] (f32, bf16 or f16); scaled");
  EXPECT_TRUE(s[0].required && s[0].differentiable && !s[0].host_only);
  EXPECT_EQ(s[1].help, "reset mask [B, S] (int32 or int64, host memory)");
  EXPECT_TRUE(!s[1].required && !s[1].differentiable && s[1].host_only);
  EXPECT_EQ(s[2].aliases, std::vector<std::string>{"state"});
  EXPECT_EQ(&inputs_of(cell_tensors()), &inputs_of(cell_tensors()));  // made once
}

TEST(DeclaredTensors, BindChecksEveryGivenInputAndFiniteSkipsIntegers) {
  Tensor x = Tensor::zeros(DType::kBF16, {2, 3, 4}), m = Tensor::zeros(DType::kI32, {2, 3});
  Tensor s0 = Tensor::zeros(DType::kF32, {2, 4}), bad = Tensor::zeros(DType::kF32, {2, 5});
  Cell in{x.view(), m.view(), s0.view(), {}};
  dispatch::Dims d = cell_tensors().bind(in, dispatch::BindMode::kFull);
  EXPECT_EQ(d["S"], 3);
  EXPECT_EQ(d.dtype("=x"), DType::kBF16);
  EXPECT_NO_THROW(cell_tensors().check_finite(in));
  in.s0.data_as<float>()[5] = std::numeric_limits<float>::infinity();
  try {
    cell_tensors().check_finite(in);
    FAIL() << "an Inf in s0 passed";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cell: s0 contains NaN or Inf");
  }
  in.s0 = bad.view();
  try {
    cell_tensors().bind(in, dispatch::BindMode::kFull);
    FAIL() << "s0 [2, 5] bound against D = 4";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cell: s0 must be [B=2, D=4], got [2, 5]");
  }
}

TEST(DeclaredOutputs, EachPassWritesItsOwnAndWhatTheCallAskedFor) {
  Tensor x = Tensor::zeros(DType::kF16, {2, 3, 4}), s0 = Tensor::zeros(DType::kF32, {2, 4});
  CallArgs a;
  a.options = harness::defaults_of({{"keep", harness::OptionSpec::Kind::kFlag, "", "false", {}}});
  a.tensors = {{"x", x.view()}};
  const std::vector<DeclaredOutputs> outs{{{"h"}},
                                          {{"s_last"}, true, if_flag("keep")},
                                          {{"dx"}, false},
                                          {{"ds0"}, false, if_given("s0")}};
  const auto names = [&] {
    std::vector<std::string> n;
    for (const OutputDesc& o : declared_outputs(inputs_of(cell_tensors()).shapes(a), cell_tensors().rules(), outs, a))
      n.push_back(o.name + ":" + dtype_name(o.dtype) + ":" + shape_str(o.shape));
    return n;
  };
  EXPECT_EQ(names(), (std::vector<std::string>{"h:f16:[2, 3, 4]"}));
  a.options.set("keep", "true");
  a.pass = Pass::kFused;
  EXPECT_EQ(names(), (std::vector<std::string>{"h:f16:[2, 3, 4]", "s_last:f32:[2, 4]", "dx:f16:[2, 3, 4]"}));
  a.pass = Pass::kBackward;
  a.tensors.push_back({"s0", s0.view()});
  EXPECT_EQ(names(), (std::vector<std::string>{"dx:f16:[2, 3, 4]", "ds0:f32:[2, 4]"}));
}

TEST(DeclaredTuning, EachValueOfOneOptionAndACopyOfTheProblemWithIt) {
  const auto c = tune::each("chunk_size", {64, 32});
  const std::vector<tune::Params> v = c({1, 2}, 4);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(tune::param(v[0], "chunk_size"), 64);
  EXPECT_EQ(tune::param(v[1], "chunk_size"), 32);
  struct P {
    int64_t chunk = 0, other = 5;
  };
  const P p;
  const auto at = tune::with_param(p, &P::chunk, "chunk_size");
  EXPECT_EQ(at(v[1]).chunk, 32);
  EXPECT_EQ(at(v[1]).other, 5);
  EXPECT_EQ(at({}).chunk, 0);
}

}  // namespace
}  // namespace tessera::kernels
