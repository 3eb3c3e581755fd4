// attention block-size selection: buckets, sanitizing, the cache key, and the choice (options ->
// tuned table -> autotune on miss -> defaults) with a fake tunable implementation and planted
// timings; then the real cpu backend with the checked-in table and with autotune on miss.
#include <gtest/gtest.h>

#include <map>

#include "kernels/attention/tuning.h"
#include "kernels/attention/testing.h"
#include "kernels/attention/tuning.h"
#include "tessera/error.h"
#include "tessera/version.h"
#include "tune/autotune.h"
#include "tune/cache.h"
#include "tune/tune_test_util.h"

namespace tessera::attention {
namespace {

using testing_tune::LogCapture;
using testing_tune::ScopedEnv;
using testing_tune::TempDir;

// Tunable, does no work. Block sizes must be positive multiples of 16.
class FakeImpl : public Implementation {
 public:
  std::string name() const override { return "fake"; }
  std::string description() const override { return "test double"; }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem&) const override { return Availability::yes(); }
  BlockSizes default_block_sizes(const Problem&) const override { return {64, 64}; }
  void validate_block_sizes(const BlockSizes& bs) const override {
    check(bs.q > 0 && bs.q % 16 == 0 && bs.kv > 0 && bs.kv % 16 == 0, ErrorCode::kInvalidArgument,
          "fake: block sizes must be multiples of 16");
  }
  bool tunable() const override { return true; }
  std::vector<BlockSizes> candidate_block_sizes(const Problem&) const override {
    return {{32, 32}, {64, 64}, {128, 256}, {7, 16}};
  }
  std::string device_kind(const Problem&) const override { return "fake:device"; }
  void forward(const Problem&, const BlockSizes&, const ForwardOut&) const override {}
  void backward(const Problem&, const BlockSizes&, const BackwardIn&, const GradOut&) const override {}
};

Problem shape(int64_t B, int64_t S, int64_t H, int64_t D, DType dt = DType::kF32) {
  return shape_only_problem(B, S, H, D, dt, Device{DeviceType::kCPU, 0});
}

TEST(AttentionBuckets, HeadDimsLandInTheirBuckets) {
  EXPECT_EQ(bucket_for(shape(1, 4096, 32, 64))->name, "d64");
  EXPECT_EQ(bucket_for(shape(1, 4096, 32, 80))->name, "d128");
  EXPECT_EQ(bucket_for(shape(1, 7, 1, 128))->name, "d128");
  EXPECT_EQ(bucket_for(shape(2, 8192, 8, 256))->name, "d256");
  Problem p = shape(1, 128, 4, 64);
  p.Dv = 96;  // the wider of D and Dv decides
  EXPECT_EQ(bucket_for(p)->name, "d128");
  for (const auto& b : tuning_buckets()) {
    const auto s = tune::representative_shape(b);
    EXPECT_EQ(bucket_for(shape(s[0], s[1], s[2], s[3]))->name, b.name);
  }
}

TEST(AttentionBuckets, SanitizeClampsToTheLengths) {
  Problem p = shape(1, 100, 1, 64);
  p.Sq = 7;
  EXPECT_EQ(sanitize_for_shape({256, 512}, p), (BlockSizes{16, 112}));
  EXPECT_EQ(sanitize_for_shape({256, 512}, shape(1, 4096, 1, 64)), (BlockSizes{256, 512}));
  EXPECT_EQ(sanitize_for_shape({8, 8}, shape(1, 1, 1, 64)), (BlockSizes{8, 8}));  // never grows
}

TEST(AttentionBuckets, ParamsRoundTrip) {
  EXPECT_EQ(from_params(to_params({3, 5})), (BlockSizes{3, 5}));
  EXPECT_THROW(from_params({{"q", 1}}), Error);
}

TEST(AttentionBuckets, KeyHoldsWhatChangesTheWork) {
  FakeImpl impl;
  const Problem p = shape(1, 1000, 8, 128);
  const std::string k = autotune_key(impl, p, Pass::kForward, "dev");
  EXPECT_NE(k.find("version=" TESSERA_VERSION), std::string::npos);
  EXPECT_NE(k.find("Sq<=1024"), std::string::npos);
  EXPECT_EQ(autotune_key(impl, shape(1, 600, 8, 128), Pass::kForward, "dev"), k);  // same length class
  EXPECT_NE(autotune_key(impl, shape(1, 1025, 8, 128), Pass::kForward, "dev"), k);
  EXPECT_NE(autotune_key(impl, shape(1, 1000, 8, 64), Pass::kForward, "dev"), k);
  EXPECT_NE(autotune_key(impl, shape(1, 1000, 8, 128, DType::kBF16), Pass::kForward, "dev"), k);
  EXPECT_NE(autotune_key(impl, p, Pass::kBackward, "dev"), k);
  EXPECT_NE(autotune_key(impl, p, Pass::kForward, "dev2"), k);
  auto differs = [&](auto edit) {
    Problem q = p;
    edit(q);
    return autotune_key(impl, q, Pass::kForward, "dev") != k;
  };
  EXPECT_TRUE(differs([](Problem& q) { q.causal = true; }));
  EXPECT_TRUE(differs([](Problem& q) { q.window_left = 128; }));
  EXPECT_TRUE(differs([](Problem& q) { q.softcap = 30; }));
  EXPECT_TRUE(differs([](Problem& q) { q.Hkv = 2; }));
  EXPECT_TRUE(differs([](Problem& q) { q.num_threads = 7; }));
  EXPECT_FALSE(differs([](Problem& q) { q.scale = 0.5; }));  // same work
}

// Planted costs (seconds) by q: 128 is fastest, 32 fails, 7 is rejected by validation.
struct Planted {
  std::map<int64_t, int> calls;
  tune::RunFn fn(const Implementation& impl) {
    return [this, &impl](const tune::Params& params) -> double {
      const BlockSizes bs = from_params(params);
      impl.validate_block_sizes(bs);
      ++calls[bs.q];
      if (bs.q == 32) throw Error(ErrorCode::kOutOfMemory, "planted out of memory");
      return bs.q == 128 ? 0.001 : 0.002;
    };
  }
};

class AttentionTuning : public ::testing::Test {
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

TEST_F(AttentionTuning, OptionsWinAndAreValidatedNotChanged) {
  Options opt;
  opt.block_sizes = BlockSizes{512, 16};
  const auto c = choose_block_sizes(impl_, shape(1, 3, 1, 64), opt, Pass::kForward, hooks());
  EXPECT_EQ(c.source, "options");
  EXPECT_EQ(c.sizes, (BlockSizes{512, 16}));  // not clamped to the tiny shape
  opt.block_sizes = BlockSizes{7, 16};
  EXPECT_THROW(choose_block_sizes(impl_, shape(1, 3, 1, 64), opt, Pass::kForward, hooks()), Error);
}

TEST_F(AttentionTuning, TableHitIsFittedAndMissFallsThrough) {
  const std::vector<tune::TableEntry> table = {
      {"fake", "fake:device", "f32", "d128", {{"q", 256}, {"kv", 512}}, "", "", 0, ""}};
  Options opt;
  opt.autotune_on_miss = false;
  auto c = choose_block_sizes(impl_, shape(1, 100, 4, 128), opt, Pass::kFused, hooks(&table));
  EXPECT_EQ(c.source, "tuned table");
  EXPECT_EQ(c.sizes, (BlockSizes{112, 112}));
  EXPECT_EQ(choose_block_sizes(impl_, shape(1, 4096, 4, 128), opt, Pass::kFused, hooks(&table)).sizes,
            (BlockSizes{256, 512}));
  // Misses: another dtype, another bucket.
  EXPECT_EQ(choose_block_sizes(impl_, shape(1, 100, 4, 128, DType::kBF16), opt, Pass::kFused, hooks(&table)).source,
            "default");
  EXPECT_EQ(choose_block_sizes(impl_, shape(1, 100, 4, 64), opt, Pass::kFused, hooks(&table)).source, "default");
}

TEST_F(AttentionTuning, OnMissPicksTheFastestPlantedCandidateAndPersists) {
  const Problem p = shape(1, 1000, 4, 128);
  auto c = choose_block_sizes(impl_, p, Options{}, Pass::kFused, hooks());
  EXPECT_EQ(c.source, "autotune");
  EXPECT_EQ(c.sizes, (BlockSizes{128, 256}));
  EXPECT_EQ(planted_.calls[32], 1);  // failed once, recorded, skipped
  EXPECT_EQ(planted_.calls[7], 0);   // invalid: rejected before running
  const tune::DiskCache cache(dir_.path());
  const auto e = cache.read("attention.fake", autotune_key(impl_, p, Pass::kFused, "fake:device"));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(from_params(e->params), (BlockSizes{128, 256}));
  tune::clear_autotune_memo();
  planted_.calls.clear();
  c = choose_block_sizes(impl_, p, Options{}, Pass::kFused, hooks());
  EXPECT_EQ(c.source, "autotune cache");
  EXPECT_TRUE(planted_.calls.empty());
}

TEST_F(AttentionTuning, SmallProblemsAndDisabledAutotuneUseDefaults) {
  TuningHooks h = hooks();
  h.min_autotune_work = kMinAutotuneWork;
  EXPECT_FALSE(worth_autotuning(shape(1, 512, 8, 64)));
  EXPECT_TRUE(worth_autotuning(shape(1, 4096, 8, 128)));
  EXPECT_EQ(choose_block_sizes(impl_, shape(1, 512, 8, 64), Options{}, Pass::kForward, h).source, "default");
  ScopedEnv off("TESSERA_AUTOTUNE", "0");
  EXPECT_EQ(choose_block_sizes(impl_, shape(1, 1000, 4, 128), Options{}, Pass::kForward, hooks()).source,
            "default");
  EXPECT_TRUE(planted_.calls.empty());
}

// The real cpu backend: tuning never changes results beyond the grid's tolerances, whichever
// block sizes the on-miss sweep picks (the sweep times the real kernel on scratch outputs).
TEST(AttentionCpuTuning, AutotuneOnMissKeepsResultsRight) {
  const Implementation* cpu = find_implementation("cpu");
  if (!cpu) GTEST_SKIP() << "built without the cpu backend";
  tune::clear_autotune_memo();
  TempDir dir;
  ScopedEnv on("TESSERA_AUTOTUNE", "1");
  testing::CaseSpec s;
  s.B = 1, s.Sq = 70, s.Sk = 70, s.Hq = 2, s.Hkv = 1, s.D = 32, s.Dv = 32;
  s.opt.implementation = "cpu";
  s.opt.causal = true;
  OwnedProblem owned = make_random_problem(1, 70, 2, 32, DType::kF32, Device{DeviceType::kCPU, 0});
  owned.problem.causal = true;
  const Problem& p = owned.problem;
  const std::vector<tune::TableEntry> no_rows;
  TuningHooks h;
  h.table = &no_rows;
  h.cache_dir = dir.path();
  h.min_autotune_work = 0;
  Options opt;
  const BlockSizeChoice c = choose_block_sizes(*cpu, p, opt, Pass::kFused, h);
  EXPECT_EQ(c.source, "autotune");
  s.opt.block_sizes = c.sizes;
  for (Pass pass : {Pass::kForward, Pass::kFused}) {
    const testing::ParityReport r = testing::check_parity(s, "cpu", pass);
    ASSERT_TRUE(r.ran) << r.error;
    for (const auto& f : r.fields) EXPECT_TRUE(f.dev.ok()) << c.sizes.str() << " " << f.field << ": " << f.dev.str();
  }
}

TEST(AttentionCpuTuning, CheckedInTableCoversEveryBucketAndIsValid) {
  const Implementation* cpu = find_implementation("cpu");
  if (!cpu) GTEST_SKIP() << "built without the cpu backend";
  for (const tune::TableEntry& e : tuned_table()) {
    EXPECT_NO_THROW(find_implementation(e.implementation)->validate_block_sizes(from_params(e.params)))
        << e.implementation << " " << e.bucket;
    bool known = false;
    for (const auto& b : tuning_buckets()) known |= b.name == e.bucket;
    EXPECT_TRUE(known) << e.bucket;
  }
}

}  // namespace
}  // namespace tessera::attention
