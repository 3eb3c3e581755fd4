// grouped_matmul block-size selection: buckets, fitting, the cache key, the generic choice with
// the real backends (tuned table, autotune on miss on the real kernel, tgmm alone included).
#include <gtest/gtest.h>

#include "kernels/grouped_matmul/tuning.h"
#include "kernels/grouped_matmul/testing.h"
#include "kernels/grouped_matmul/tuning.h"
#include "tessera/error.h"
#include "tessera/version.h"
#include "tune/autotune.h"
#include "tune/tune_test_util.h"

namespace tessera::grouped_matmul {
namespace {

using testing_tune::ScopedEnv;
using testing_tune::TempDir;

Problem shape(int64_t M, int64_t K, int64_t N, int64_t G, DType dt = DType::kF32) {
  return shape_only_problem(M, K, N, G, dt, Device{DeviceType::kCPU, 0});
}

TEST(GroupedMatmulBuckets, GroupCountsLandInTheirBuckets) {
  EXPECT_EQ(bucket_for(shape(4096, 1024, 2048, 8))->name, "g8");
  EXPECT_EQ(bucket_for(shape(10, 3, 3, 1))->name, "g8");
  EXPECT_EQ(bucket_for(shape(4096, 1024, 2048, 64))->name, "g64");
  EXPECT_EQ(bucket_for(shape(65536, 2048, 1536, 128))->name, "g64");
  for (const auto& b : tuning_buckets()) {
    const auto s = tune::representative_shape(b);
    EXPECT_EQ(bucket_for(shape(s[0], s[1], s[2], s[3]))->name, b.name);
  }
}

TEST(GroupedMatmulBuckets, FitParamsAndKey) {
  EXPECT_EQ(fit_to_shape({512, 512}, shape(40, 16, 24, 4)), (BlockSizes{16, 24}));    // largest group 10, K 16
  EXPECT_EQ(fit_to_shape({512, 512}, shape(4096, 64, 2048, 2)), (BlockSizes{512, 512}));
  EXPECT_EQ(from_params(to_params({3, 5})), (BlockSizes{3, 5}));
  EXPECT_THROW(from_params({{"m", 1}}), Error);
  const Implementation* ref = find_implementation("reference");
  const Problem p = shape(1000, 64, 32, 8);
  const std::string k = autotune_key(*ref, p, Pass::kForward, "dev");
  EXPECT_NE(k.find("version=" TESSERA_VERSION), std::string::npos);
  EXPECT_EQ(autotune_key(*ref, shape(600, 64, 32, 8), Pass::kForward, "dev"), k);  // same M class and skew class
  EXPECT_NE(autotune_key(*ref, shape(1000, 64, 32, 9), Pass::kForward, "dev"), k);
  EXPECT_NE(autotune_key(*ref, shape(1000, 64, 32, 8, DType::kBF16), Pass::kForward, "dev"), k);
  EXPECT_NE(autotune_key(*ref, p, Pass::kBackward, "dev"), k);
  Problem t = p;
  t.transpose_rhs = true;
  EXPECT_NE(autotune_key(*ref, t, Pass::kForward, "dev"), k);
  Problem skew = p;
  skew.begin = {0, 900, 910, 920, 930, 940, 950, 960, 1000};  // one group of 900 rows
  EXPECT_NE(autotune_key(*ref, skew, Pass::kForward, "dev"), k);
  EXPECT_TRUE(worth_autotuning(shape(4096, 1024, 2048, 8)));
  EXPECT_FALSE(worth_autotuning(shape(512, 128, 256, 8)));
}

TEST(GroupedMatmulTuning, TableHitIsFittedAndOptionsWin) {
  const Implementation* cpu = find_implementation("cpu");
  if (!cpu) GTEST_SKIP() << "built without the cpu backend";
  ScopedEnv table_on("TESSERA_TUNED_TABLE", nullptr);
  const std::vector<tune::TableEntry> table = {
      {"cpu", "fake:device", "f32", "g8", {{"m", 256}, {"n", 1024}}, "", "", 0, ""}};
  TuningHooks h;
  h.table = &table;
  h.device_kind = "fake:device";
  Options opt;
  opt.autotune_on_miss = false;
  auto c = choose_block_sizes(*cpu, shape(4096, 512, 2048, 4), opt, Pass::kFused, h);
  EXPECT_EQ(c.source, "tuned table");
  EXPECT_EQ(c.sizes, (BlockSizes{256, 1024}));
  EXPECT_EQ(choose_block_sizes(*cpu, shape(64, 16, 100, 4), opt, Pass::kFused, h).sizes, (BlockSizes{16, 100}));
  EXPECT_EQ(choose_block_sizes(*cpu, shape(4096, 512, 2048, 64), opt, Pass::kFused, h).source, "default");
  opt.block_sizes = BlockSizes{0, 4};
  EXPECT_THROW(choose_block_sizes(*cpu, shape(64, 16, 100, 4), opt, Pass::kFused, h), Error);
}

// The on-miss sweep times the real kernel for every op, tgmm alone included (its problem has no
// rhs), picks one of the candidates, and persists it.
TEST(GroupedMatmulTuning, AutotuneOnMissTimesTheRealKernel) {
  const Implementation* cpu = find_implementation("cpu");
  if (!cpu) GTEST_SKIP() << "built without the cpu backend";
  tune::clear_autotune_memo();
  TempDir dir;
  ScopedEnv on("TESSERA_AUTOTUNE", "1");
  ScopedEnv table_on("TESSERA_TUNED_TABLE", nullptr);
  TuningHooks h;
  const std::vector<tune::TableEntry> empty;
  h.table = &empty;
  h.cache_dir = dir.path();
  h.min_autotune_work = 0;
  OwnedProblem o = make_random_problem(96, 24, 40, 3, DType::kBF16, Device{DeviceType::kCPU, 0});
  const std::vector<BlockSizes> candidates = tune::candidates_for<Tuning>(*cpu, o.problem);
  for (bool tgmm_alone : {false, true}) {
    Problem p = o.problem;
    if (tgmm_alone) p.rhs = nullptr;
    for (Pass pass : {Pass::kForward, Pass::kBackward, Pass::kFused}) {
      if (tgmm_alone && pass != Pass::kBackward) continue;
      const BlockSizeChoice c = choose_block_sizes(*cpu, p, Options{}, pass, h);
      EXPECT_EQ(c.source, "autotune") << pass_name(pass);
      bool known = false;
      for (const BlockSizes& b : candidates) known = known || fit_to_shape(b, p) == c.sizes;
      EXPECT_TRUE(known) << c.sizes.str();
    }
  }
}

}  // namespace
}  // namespace tessera::grouped_matmul
