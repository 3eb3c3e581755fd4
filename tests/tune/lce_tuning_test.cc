// linear_cross_entropy's declared block sizes (tuning.cc): buckets, sanitizing, the cache key's
// variant, the candidates of the host backends and of cuda, the call's own sizes, the tuned table,
// and `tessera tune`'s timed run through the signature. The generic choice (negative entries,
// corrupt cache files, the memo, the env switches) is tested once in declared_test.cc and
// cache_test.cc; the real cpu backend's autotune-on-miss in lce_cpu_tuning_test.cc.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/log.h"
#include "cpu_backend.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "kernels/linear_cross_entropy/testing.h"
#include "kernels/registry.h"
#include "tessera/error.h"
#include "tessera/version.h"
#include "tune/declared.h"
#include "tune/tune_test_util.h"

namespace tessera::linear_cross_entropy {
namespace {

using testing_tune::LogCapture;

Problem shape(int64_t B, int64_t H, int64_t V, DType dt = DType::kF32) {
  Problem p;
  p.B = B, p.H = H, p.V = V;
  p.dtype = dt;
  p.num_threads = 1;
  return p;
}

std::string bucket(int64_t B, int64_t H, int64_t V) {
  const tune::Bucket* b = tune::match_bucket(tuning("cpu").buckets, {B, H, V});
  return b ? b->name : "(none)";
}

TEST(LceBuckets, ModelShapesLandInTheirBuckets) {
  EXPECT_EQ(bucket(8192, 4096, 32000), "llama2-ish");
  EXPECT_EQ(bucket(8192, 4096, 128256), "llama3-ish");
  EXPECT_EQ(bucket(8192, 2304, 256000), "gemma-ish");
  EXPECT_EQ(bucket(16, 32, 100), "small");
  EXPECT_EQ(bucket(1, 1, 50257), "llama2-ish");
  // Every bucket's representative shape falls in that bucket (first match wins); cuda's are the same.
  for (const auto& b : tuning("cpu").buckets) {
    const auto s = tune::representative_shape(b);
    EXPECT_EQ(bucket(s[0], s[1], s[2]), b.name);
  }
  EXPECT_EQ(tuning("cuda").buckets.size(), tuning("cpu").buckets.size());
}

TEST(LceBuckets, SanitizeClampsToTheShape) {
  EXPECT_EQ(sanitize_for_shape({256, 512, 2048}, shape(10, 20, 100)), (BlockSizes{16, 32, 112}));
  EXPECT_EQ(sanitize_for_shape({256, 512, 2048}, shape(4096, 4096, 32000)), (BlockSizes{256, 512, 2048}));
  EXPECT_EQ(sanitize_for_shape({8, 8, 8}, shape(1, 1, 1)), (BlockSizes{8, 8, 8}));  // never grows
}

TEST(LceBuckets, ParamsRoundTrip) {
  EXPECT_EQ(from_params(to_params({1, 2, 3})), (BlockSizes{1, 2, 3}));
  EXPECT_THROW(from_params({{"b", 1}}), Error);
  EXPECT_EQ((BlockSizes{1, 2, 3}).str(), "b=1,h=2,v=3");
}

// The key: the dims (api.cc passes B by its power-of-two class), the options that change the
// work (autotune_variant), dtype, pass, device kind, version.
TEST(LceBuckets, KeyHoldsWhatChangesTheWork) {
  const Problem p = shape(1000, 64, 32000);
  tune::DeclaredCall c;
  c.implementation = "cpu";
  c.dims = {1024, 64, 32000};
  c.variant = autotune_variant(p);
  const std::string k = tune::declared_key(tuning("cpu"), c, "dev");
  EXPECT_NE(k.find("version=" TESSERA_VERSION), std::string::npos);
  EXPECT_NE(k.find("B=1024|H=64|V=32000|layout=hv|bias=none|softcap=off"), std::string::npos) << k;
  const auto differs = [&](auto edit) {
    Problem q = p;
    tune::DeclaredCall d = c;
    edit(q, d);
    d.variant = autotune_variant(q);
    return tune::declared_key(tuning("cpu"), d, "dev") != k;
  };
  float bias = 0;
  EXPECT_TRUE(differs([](Problem& q, tune::DeclaredCall&) { q.softcap = 30; }));
  EXPECT_TRUE(differs([](Problem& q, tune::DeclaredCall&) { q.want_argmax = true; }));
  EXPECT_TRUE(differs([&](Problem& q, tune::DeclaredCall&) { q.bias = &bias; }));
  EXPECT_TRUE(differs([](Problem& q, tune::DeclaredCall&) { q.layout = WLayout::kVH; }));
  EXPECT_TRUE(differs([](Problem& q, tune::DeclaredCall&) { q.label_smoothing = 0.1; }));
  EXPECT_TRUE(differs([](Problem&, tune::DeclaredCall& d) { d.dtype = DType::kBF16; }));
  EXPECT_TRUE(differs([](Problem&, tune::DeclaredCall& d) { d.pass = Pass::kFused; }));
  EXPECT_TRUE(differs([](Problem&, tune::DeclaredCall& d) { d.dims[2] = 32001; }));
  EXPECT_FALSE(differs([](Problem& q, tune::DeclaredCall&) { q.z_loss_weight = 0.1; }));  // same work
  // A memory budget picks another route (vocabulary slices, cuda's chunk rows): its own entries,
  // by power-of-two class; no budget keeps the old key.
  EXPECT_TRUE(differs([](Problem& q, tune::DeclaredCall&) { q.memory_budget = size_t{64} << 20; }));
  EXPECT_EQ(k.find("budget="), std::string::npos) << k;
  Problem a = p, b = p, c2 = p;
  a.memory_budget = (size_t{64} << 20) - 100;
  b.memory_budget = size_t{64} << 20;
  c2.memory_budget = (size_t{64} << 20) + 1;
  EXPECT_EQ(autotune_variant(a), autotune_variant(b));
  EXPECT_NE(autotune_variant(b), autotune_variant(c2));
  EXPECT_NE(autotune_variant(b).find("|budget=67108864"), std::string::npos) << autotune_variant(b);
  // Gradients left out (a frozen w: two GEMMs of three) have entries of their own; a call with all
  // of them keeps the key it always had.
  float buf = 0.0f;
  GradOut all{&buf, DType::kF32, &buf, DType::kF32, nullptr, DType::kF32}, frozen_w = all;
  frozen_w.dw = nullptr;
  EXPECT_EQ(autotune_variant(p, &all), autotune_variant(p));  // p has no bias
  EXPECT_NE(autotune_variant(p, &frozen_w).find("|grads=dx,."), std::string::npos) << autotune_variant(p, &frozen_w);
  Problem with_bias = p;
  with_bias.bias = &buf;
  EXPECT_NE(autotune_variant(with_bias, &all).find("|grads=dx,dw,."), std::string::npos);  // dbias left out
}

TEST(LceBuckets, CandidatesDefaultsAndWork) {
  const tune::Declared& host = tuning("cpu");
  EXPECT_EQ(&tuning("cpu_v2"), &host);
  EXPECT_TRUE(host.tunable("cpu") && host.tunable("cpu_v2"));
  EXPECT_FALSE(host.tunable("reference"));
  EXPECT_TRUE(tuning("cuda").tunable("cuda"));
  const std::vector<tune::Params> c = host.candidates({256, 512, 32000}, 2);
  ASSERT_FALSE(c.empty());
  if (const Implementation* cpu = find_implementation("cpu")) {
    EXPECT_EQ(c.front(), to_params(cpu->default_block_sizes(shape(256, 512, 32000))));  // f32's default first
    // The bf16 / f16 variants of h are there for every dtype (the candidates see the dims only).
    const auto has_h = [&](int64_t h) {
      return std::any_of(c.begin(), c.end(), [h](const tune::Params& p) { return tune::param(p, "h") == h; });
    };
    EXPECT_TRUE(has_h(256) && has_h(1024));
    for (const tune::Params& p : c) EXPECT_NO_THROW(cpu->validate_block_sizes(from_params(p))) << tune::params_str(p);
  }
  // cuda: the whole batch (its default, which the memory budget caps), then chunks of 512, 1024, ...
  const std::vector<tune::Params> g = tuning("cuda").candidates({4096, 256, 32000}, 1);
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[0], (tune::Params{{"b", 4096}, {"h", 256}, {"v", 32000}}));
  EXPECT_EQ(g[1], (tune::Params{{"b", 512}, {"h", 256}, {"v", 32000}}));
  EXPECT_EQ(g[3], (tune::Params{{"b", 2048}, {"h", 256}, {"v", 32000}}));
  EXPECT_LT(host.work({64, 64, 1000}), host.min_work);
  EXPECT_GE(host.work({1024, 256, 256}), host.min_work);
}

// The call's sizes are validated by the implementation that runs before anything is written,
// and used as given (not clamped to a tiny shape).
TEST(LceTuning, OptionsWinAndAreValidatedNotChanged) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  testing::CaseSpec s;
  s.lead = {3};
  s.H = 8, s.V = 16;
  s.opt.implementation = "cpu";
  const testing::CaseData d = testing::make_case(s);
  Tensor loss = Tensor::empty(DType::kF32, {}), lse = Tensor::empty(DType::kF32, {3});
  std::fill_n(lse.data_as<float>(), 3, 7.0f);
  Options opt = s.opt;
  opt.block_sizes = BlockSizes{0, 16, 24};
  EXPECT_THROW(forward(d.inputs(), {loss.view(), lse.view(), std::nullopt}, opt), Error);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(lse.data_as<float>()[i], 7.0f);
  opt.block_sizes = BlockSizes{8, 16, 24};
  const log::Level old = log::level();
  log::set_level(log::Level::kDebug);
  std::string text;
  {
    LogCapture capture;
    forward(d.inputs(), {loss.view(), lse.view(), std::nullopt}, opt);
    text = capture.text();
  }
  log::set_level(old);
  EXPECT_NE(text.find("with block sizes b=8,h=16,v=24 (options)"), std::string::npos) << text;
  EXPECT_THROW(validate_block_sizes("cpu", {0, 16, 24}), Error);
  EXPECT_THROW(validate_block_sizes("nope", {}), Error);
}

TEST(LceTuning, TableHitAndMisses) {
  const testing_tune::OneRowTable table(tuning("cpu"), "f32", "llama2-ish", {{"b", 128}, {"h", 256}, {"v", 1024}});
  const tune::Declared& d = table.declared();
  tune::DeclaredCall c;
  c.implementation = "cpu";
  c.dims = {128, 64, 32000};
  EXPECT_EQ(tune::choose_declared(d, c, {}, {}).source, "tuned table");
  EXPECT_EQ(tune::choose_declared(d, c, {}, {}).params, (tune::Params{{"b", 128}, {"h", 256}, {"v", 1024}}));
  c.dtype = DType::kBF16;  // another dtype: a miss
  EXPECT_EQ(tune::choose_declared(d, c, {}, {}).source, "default");
  c.dtype = DType::kF32;
  c.dims = {128, 64, 128000};  // another bucket: a miss
  EXPECT_EQ(tune::choose_declared(d, c, {}, {}).source, "default");
  c.dims = {128, 64, 32000};
  c.implementation = "reference";  // not tunable: its default
  EXPECT_EQ(tune::choose_declared(d, c, {}, {}).source, "default");
}

// `tessera tune`: the timed run is one call through the signature on the bench problem, with the
// candidate as the call's block_sizes; it hands back what the pass wrote for the check.
TEST(LceTuning, TuneJobTimesTheCallThroughItsSignature) {
  const kernels::KernelSpec& k = kernels::get(kKernelName);
  const std::string impl = find_implementation("cpu") ? "cpu" : "reference";
  for (Pass pass : {Pass::kForward, Pass::kBackward, Pass::kFused}) {
    const kernels::TuneJob job = k.tune.job(impl, {4, 8, 16}, DType::kF32, pass, true);
    ASSERT_FALSE(job.candidates.empty());
    const tune::Runner run = job.make_run();
    EXPECT_GT(run.run(job.candidates.front()), 0.0) << pass_name(pass);
    std::string names;
    for (const tune::Output& o : run.outputs()) names += o.name + ",";
    EXPECT_NE(names.find(pass == Pass::kForward ? "lse" : "dw"), std::string::npos) << pass_name(pass) << ": " << names;
  }
  EXPECT_TRUE(k.tune.tunable("cuda"));
  EXPECT_FALSE(k.tune.tunable("reference"));
}

}  // namespace
}  // namespace tessera::linear_cross_entropy
