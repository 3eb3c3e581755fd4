// linear_cross_entropy block-size selection: options -> tuned table -> autotune on miss ->
// defaults, with a fake tunable implementation and planted timings (never real timing).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "dispatch/dispatch.h"
#include "kernels/linear_cross_entropy/tuning.h"
#include "kernels/linear_cross_entropy/tuning.h"
#include "tessera/error.h"
#include "tune/autotune.h"
#include "tune/cache.h"
#include "tune/tune_test_util.h"

namespace tessera::linear_cross_entropy {
namespace {

using testing_tune::LogCapture;
using testing_tune::ScopedEnv;
using testing_tune::TempDir;

// Tunable, does no work. Block sizes must be positive multiples of 8 (and powers of two when
// pow2_only).
class FakeImpl : public Implementation {
 public:
  bool pow2_only = false;
  std::string name() const override { return "fake"; }
  std::string description() const override { return "test double"; }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem&) const override { return Availability::yes(); }
  BlockSizes default_block_sizes(const Problem&) const override { return {64, 64, 64}; }
  void validate_block_sizes(const BlockSizes& bs) const override {
    for (int64_t x : {bs.b, bs.h, bs.v}) {
      check(x > 0 && x % 8 == 0, ErrorCode::kInvalidArgument, "fake: block sizes must be multiples of 8");
      check(!pow2_only || (x & (x - 1)) == 0, ErrorCode::kInvalidArgument, "fake: powers of two only");
    }
  }
  bool tunable() const override { return true; }
  std::vector<BlockSizes> candidate_block_sizes(const Problem&) const override {
    return {{32, 32, 32}, {64, 64, 64}, {128, 64, 256}, {8, 8, 8}, {7, 8, 8}};
  }
  std::string device_kind(const Problem&) const override { return "fake:device"; }
  void forward(const Problem&, const BlockSizes&, const ForwardOut&) const override {}
  void backward(const Problem&, const BlockSizes&, const GradIn&, const GradOut&) const override {}
};

Problem shape(int64_t B, int64_t H, int64_t V, DType dt = DType::kF32) {
  Problem p;
  p.B = B;
  p.H = H;
  p.V = V;
  p.dtype = dt;
  p.num_threads = 1;
  return p;
}

// Planted costs (seconds) by b: 128 is fastest, 8 throws, 7 is rejected by validation.
struct Planted {
  std::map<int64_t, int> calls;
  tune::RunFn fn(const Implementation& impl) {
    return [this, &impl](const tune::Params& params) -> double {
      const BlockSizes bs = from_params(params);
      impl.validate_block_sizes(bs);  // as make_timed_run does
      ++calls[bs.b];
      switch (bs.b) {
        case 32: return 0.003;
        case 64: return 0.002;
        case 128: return 0.001;
        default: throw Error(ErrorCode::kOutOfMemory, "planted out of memory");
      }
    };
  }
};

class LceTuning : public ::testing::Test {
 protected:
  void SetUp() override { tune::clear_autotune_memo(); }
  TuningHooks hooks(const std::vector<tune::TableEntry>* table = &empty_) {
    TuningHooks h;
    h.table = table;
    h.cache_dir = dir_.path();
    h.min_autotune_work = 0;
    h.run = planted_.fn(impl_);
    return h;
  }
  FakeImpl impl_;
  TempDir dir_;
  Planted planted_;
  ScopedEnv autotune_on_{"TESSERA_AUTOTUNE", "1"};  // ctest turns it off for the suite
  ScopedEnv table_on_{"TESSERA_TUNED_TABLE", nullptr};
  static inline const std::vector<tune::TableEntry> empty_{};
};

TEST(LceBuckets, ModelShapesLandInTheirBuckets) {
  EXPECT_EQ(bucket_for(shape(8192, 4096, 32000))->name, "llama2-ish");
  EXPECT_EQ(bucket_for(shape(8192, 4096, 128256))->name, "llama3-ish");
  EXPECT_EQ(bucket_for(shape(8192, 2304, 256000))->name, "gemma-ish");
  EXPECT_EQ(bucket_for(shape(16, 32, 100))->name, "small");
  EXPECT_EQ(bucket_for(shape(1, 1, 50257))->name, "llama2-ish");
  // Every bucket's representative shape falls in that bucket (first match wins).
  for (const auto& b : tuning_buckets()) {
    const auto s = tune::representative_shape(b);
    EXPECT_EQ(bucket_for(shape(s[0], s[1], s[2]))->name, b.name);
  }
}

TEST(LceBuckets, SanitizeClampsToTheShape) {
  EXPECT_EQ(sanitize_for_shape({256, 512, 2048}, shape(10, 20, 100)), (BlockSizes{16, 32, 112}));
  EXPECT_EQ(sanitize_for_shape({256, 512, 2048}, shape(4096, 4096, 32000)), (BlockSizes{256, 512, 2048}));
  EXPECT_EQ(sanitize_for_shape({8, 8, 8}, shape(1, 1, 1)), (BlockSizes{8, 8, 8}));  // never grows
}

TEST(LceBuckets, ParamsRoundTrip) {
  EXPECT_EQ(from_params(to_params({1, 2, 3})), (BlockSizes{1, 2, 3}));
  EXPECT_THROW(from_params({{"b", 1}}), Error);
}

TEST(LceBuckets, KeyHoldsWhatChangesTheWork) {
  FakeImpl impl;
  Problem p = shape(1000, 64, 32000);
  const std::string k = autotune_key(impl, p, Pass::kForward, "dev");
  EXPECT_NE(k.find("version=" TESSERA_VERSION), std::string::npos);
  EXPECT_NE(k.find("B<=1024"), std::string::npos);  // B by power-of-two class
  EXPECT_EQ(autotune_key(impl, shape(600, 64, 32000), Pass::kForward, "dev"), k);
  EXPECT_NE(autotune_key(impl, shape(1000, 64, 32001), Pass::kForward, "dev"), k);
  EXPECT_NE(autotune_key(impl, p, Pass::kFused, "dev"), k);
  EXPECT_NE(autotune_key(impl, p, Pass::kForward, "dev2"), k);
  Problem q = p;
  q.soft_cap = 30;
  EXPECT_NE(autotune_key(impl, q, Pass::kForward, "dev"), k);
  q = p;
  q.want_argmax = true;
  EXPECT_NE(autotune_key(impl, q, Pass::kForward, "dev"), k);
  q = p;
  float bias = 0;
  q.bias = &bias;
  EXPECT_NE(autotune_key(impl, q, Pass::kForward, "dev"), k);
  q = p;
  q.dtype = DType::kBF16;
  EXPECT_NE(autotune_key(impl, q, Pass::kForward, "dev"), k);
  q = p;
  q.layout = WLayout::kVH;
  EXPECT_NE(autotune_key(impl, q, Pass::kForward, "dev"), k);
}

TEST_F(LceTuning, OptionsWinAndAreValidatedNotChanged) {
  Options opt;
  opt.block_sizes = BlockSizes{8, 16, 24};
  const auto c = choose_block_sizes(impl_, shape(1, 1, 1), opt, Pass::kForward, hooks());
  EXPECT_EQ(c.source, "options");
  EXPECT_EQ(c.sizes, (BlockSizes{8, 16, 24}));  // not clamped to the tiny shape
  opt.block_sizes = BlockSizes{7, 16, 24};
  EXPECT_THROW(choose_block_sizes(impl_, shape(1, 1, 1), opt, Pass::kForward, hooks()), Error);
}

TEST_F(LceTuning, TableHitIsSanitizedAndMissFallsThrough) {
  const std::vector<tune::TableEntry> table = {
      {"fake", "fake:device", "f32", "llama2-ish", {{"b", 128}, {"h", 256}, {"v", 1024}}, "", "", 0, ""}};
  Options opt;
  opt.autotune_on_miss = false;
  auto c = choose_block_sizes(impl_, shape(100, 64, 32000), opt, Pass::kForward, hooks(&table));
  EXPECT_EQ(c.source, "tuned table");
  EXPECT_EQ(c.sizes, (BlockSizes{112, 64, 1024}));
  // Miss: another dtype, another bucket, another device kind.
  EXPECT_EQ(choose_block_sizes(impl_, shape(100, 64, 32000, DType::kBF16), opt, Pass::kForward, hooks(&table)).source,
            "default");
  EXPECT_EQ(choose_block_sizes(impl_, shape(100, 64, 128000), opt, Pass::kForward, hooks(&table)).source, "default");
  TuningHooks other = hooks(&table);
  other.device_kind = "another:device";
  c = choose_block_sizes(impl_, shape(100, 64, 32000), opt, Pass::kForward, other);
  EXPECT_EQ(c.source, "default");
  EXPECT_EQ(c.sizes, (BlockSizes{64, 64, 64}));
  // TESSERA_TUNED_TABLE=0 ignores the table.
  ScopedEnv off("TESSERA_TUNED_TABLE", "0");
  EXPECT_EQ(choose_block_sizes(impl_, shape(100, 64, 32000), opt, Pass::kForward, hooks(&table)).source, "default");
}

TEST_F(LceTuning, TableRowThatBreaksTheBackendIsFittedOrIgnored) {
  impl_.pow2_only = true;
  const std::vector<tune::TableEntry> table = {
      {"fake", "fake:device", "f32", "llama2-ish", {{"b", 128}, {"h", 64}, {"v", 1024}}, "", "", 0, ""},
      {"fake", "fake:device", "bf16", "llama2-ish", {{"b", 12}, {"h", 64}, {"v", 1024}}, "", "", 0, ""}};
  Options opt;
  opt.autotune_on_miss = false;
  // Clamping b to 112 breaks "powers of two": the unclamped row is used.
  auto c = choose_block_sizes(impl_, shape(100, 64, 32000), opt, Pass::kForward, hooks(&table));
  EXPECT_EQ(c.source, "tuned table");
  EXPECT_EQ(c.sizes, (BlockSizes{128, 64, 1024}));
  // A row the backend rejects outright is ignored with a warning.
  LogCapture log;
  c = choose_block_sizes(impl_, shape(100, 64, 32000, DType::kBF16), opt, Pass::kForward, hooks(&table));
  EXPECT_EQ(c.source, "default");
  EXPECT_NE(log.text().find("not valid for the backend"), std::string::npos) << log.text();
}

TEST_F(LceTuning, OnMissPicksTheFastestPlantedCandidateAndPersists) {
  const Problem p = shape(1000, 500, 4000);
  auto c = choose_block_sizes(impl_, p, Options{}, Pass::kFused, hooks());
  EXPECT_EQ(c.source, "autotune");
  EXPECT_EQ(c.sizes, (BlockSizes{128, 64, 256}));
  EXPECT_EQ(planted_.calls[8], 1);  // failed once, recorded, skipped
  EXPECT_EQ(planted_.calls[7], 0);  // invalid: rejected before running
  const tune::DiskCache cache(dir_.path());
  const auto e = cache.read("linear_cross_entropy.fake", autotune_key(impl_, p, Pass::kFused, "fake:device"));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(from_params(e->params), (BlockSizes{128, 64, 256}));
  ASSERT_EQ(e->candidates.size(), 5u);  // default first, duplicates dropped
  EXPECT_EQ(e->candidates[0]["candidate"], "b=64,h=64,v=64");
  EXPECT_EQ(e->candidates[3]["status"], "failed");
  EXPECT_EQ(e->candidates[3]["failure"], "planted out of memory");
  EXPECT_EQ(e->candidates[4]["status"], "failed");
  EXPECT_NE(e->candidates[4]["failure"].get<std::string>().find("multiples of 8"), std::string::npos);

  // A new process (memo cleared) reads the cache and does not time anything.
  tune::clear_autotune_memo();
  planted_.calls.clear();
  c = choose_block_sizes(impl_, p, Options{}, Pass::kFused, hooks());
  EXPECT_EQ(c.source, "autotune cache");
  EXPECT_EQ(c.sizes, (BlockSizes{128, 64, 256}));
  EXPECT_TRUE(planted_.calls.empty());
  // Another op is another key.
  EXPECT_EQ(choose_block_sizes(impl_, p, Options{}, Pass::kForward, hooks()).source, "autotune");
}

TEST_F(LceTuning, CachedResultIsSanitizedForTheActualB) {
  // B=600 and B=1000 share a key (B class 1024); the cached b=128 still fits both; for B=520 a
  // planted winner larger than B is clamped.
  (void)choose_block_sizes(impl_, shape(1000, 500, 4000), Options{}, Pass::kForward, hooks());
  const auto c = choose_block_sizes(impl_, shape(600, 500, 4000), Options{}, Pass::kForward, hooks());
  EXPECT_EQ(c.source, "autotune cache");
  EXPECT_EQ(c.sizes, (BlockSizes{128, 64, 256}));
}

TEST_F(LceTuning, NegativeEntryThrowsUnsupportedSoDispatchFallsBack) {
  TuningHooks h = hooks();
  h.run = [](const tune::Params&) -> double { throw Error(ErrorCode::kOutOfMemory, "planted"); };
  const Problem p = shape(1000, 500, 4000);
  try {
    choose_block_sizes(impl_, p, Options{}, Pass::kForward, h);
    FAIL() << "expected Error(kUnsupported)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("no block sizes that run this problem"), std::string::npos) << e.what();
  }
  // Stored as a negative entry: another process gets the same answer without timing.
  tune::clear_autotune_memo();
  bool timed = false;
  h.run = [&](const tune::Params&) -> double {
    timed = true;
    return 1;
  };
  EXPECT_THROW(choose_block_sizes(impl_, p, Options{}, Pass::kForward, h), Error);
  EXPECT_FALSE(timed);

  // Dispatch treats it as a fallback to the next implementation of a list.
  dispatch::Plan plan = dispatch::make_plan("fake,other", {});
  dispatch::Callbacks cb;
  cb.exists = [](const std::string&) { return true; };
  cb.supports = [](const std::string&) { return dispatch::Availability::yes(); };
  cb.run = [&](const std::string& n) {
    if (n == "fake") (void)choose_block_sizes(impl_, p, Options{}, Pass::kForward, h);
  };
  LogCapture log;
  EXPECT_EQ(dispatch::run("linear_cross_entropy", plan, cb), "other");
}

TEST_F(LceTuning, DisabledByOptionAndByEnv) {
  const Problem p = shape(1000, 500, 4000);
  Options off;
  off.autotune_on_miss = false;
  EXPECT_EQ(choose_block_sizes(impl_, p, off, Pass::kForward, hooks()).source, "default");
  {
    ScopedEnv env("TESSERA_AUTOTUNE", "0");
    EXPECT_EQ(choose_block_sizes(impl_, p, Options{}, Pass::kForward, hooks()).source, "default");
  }
  EXPECT_TRUE(planted_.calls.empty());
  EXPECT_EQ(std::filesystem::directory_iterator(dir_.path()), std::filesystem::directory_iterator());
  EXPECT_EQ(choose_block_sizes(impl_, p, Options{}, Pass::kForward, hooks()).source, "autotune");
}

TEST_F(LceTuning, TinyProblemsAreNotAutotuned) {
  TuningHooks h = hooks();
  h.min_autotune_work = kMinAutotuneWork;
  EXPECT_FALSE(worth_autotuning(shape(64, 64, 1000)));
  EXPECT_TRUE(worth_autotuning(shape(1024, 256, 256)));
  EXPECT_EQ(choose_block_sizes(impl_, shape(64, 64, 1000), Options{}, Pass::kForward, h).source, "default");
  EXPECT_TRUE(planted_.calls.empty());
}

TEST_F(LceTuning, UntunableImplementationsUseDefaults) {
  class Plain : public FakeImpl {
    bool tunable() const override { return false; }
  } plain;
  EXPECT_EQ(choose_block_sizes(plain, shape(1000, 500, 4000), Options{}, Pass::kForward, hooks()).source, "default");
  EXPECT_TRUE(planted_.calls.empty());
}

TEST_F(LceTuning, CorruptCacheEntryIsRetunedWithAWarning) {
  const Problem p = shape(1000, 500, 4000);
  (void)choose_block_sizes(impl_, p, Options{}, Pass::kForward, hooks());
  const tune::DiskCache cache(dir_.path());
  const std::string path =
      cache.path_for("linear_cross_entropy.fake", autotune_key(impl_, p, Pass::kForward, "fake:device"));
  { std::ofstream(path, std::ios::trunc) << "{ truncated"; }
  tune::clear_autotune_memo();
  LogCapture log;
  const auto c = choose_block_sizes(impl_, p, Options{}, Pass::kForward, hooks());
  EXPECT_EQ(c.source, "autotune");
  EXPECT_EQ(c.sizes, (BlockSizes{128, 64, 256}));
  EXPECT_NE(log.text().find("ignoring corrupt entry"), std::string::npos) << log.text();
}

// The real RunFn with the reference implementation: scratch outputs, the caller's inputs
// untouched, a positive time.
TEST(LceTimedRun, TimesIntoScratchNotTheCallersBuffers) {
  const Implementation* ref = find_implementation("reference");
  ASSERT_NE(ref, nullptr);
  OwnedProblem o = make_random_problem(4, 8, 16, DType::kF32, Device::cpu());
  const std::vector<float> x_before(o.x.data_as<float>(), o.x.data_as<float>() + 32);
  for (Pass op : {Pass::kForward, Pass::kBackward, Pass::kFused}) {
    const tune::Runner run = make_timed_run(*ref, o.problem, op);
    EXPECT_GT(run.run(to_params(ref->default_block_sizes(o.problem))), 0.0) << pass_name(op);
    // The outputs handed back for the check are what the op computes, in the scratch.
    std::string names;
    for (const tune::Output& out : run.outputs()) {
      names += (names.empty() ? "" : ",") + out.name;
      EXPECT_NE(out.tensor.data(), o.x.data());
    }
    EXPECT_EQ(names, op == Pass::kForward ? "loss,lse" : op == Pass::kBackward ? "dx,dw" : "loss,lse,dx,dw");
  }
  EXPECT_EQ(std::vector<float>(o.x.data_as<float>(), o.x.data_as<float>() + 32), x_before);
}

}  // namespace
}  // namespace tessera::linear_cross_entropy
