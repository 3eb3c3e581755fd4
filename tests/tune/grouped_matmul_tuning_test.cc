// grouped_matmul's declared block sizes (tuning.cc): buckets, candidates, the cache key, and the
// choice with the real backends (the call's sizes validated before anything is written, the
// tuned table, autotune on a miss timing the real kernel, tgmm alone included).
#include <gtest/gtest.h>

#include <algorithm>

#include "core/random.h"
#include "cpu_backend.h"
#include "kernels/grouped_matmul/impl.h"
#include "kernels/grouped_matmul/testing.h"
#include "tessera/error.h"
#include "tessera/version.h"
#include "tune/autotune.h"
#include "tune/declared.h"
#include "tune/device_kind.h"
#include "tune/tune_test_util.h"

namespace tessera::grouped_matmul {
namespace {

using testing_tune::ScopedEnv;
using testing_tune::TempDir;

std::string bucket(int64_t M, int64_t K, int64_t N, int64_t G) {
  const tune::Bucket* b = tune::match_bucket(tuning().buckets, {M, K, N, G});
  return b ? b->name : "(none)";
}

TEST(GroupedMatmulBuckets, GroupCountsLandInTheirBuckets) {
  EXPECT_EQ(bucket(4096, 1024, 2048, 8), "g8");
  EXPECT_EQ(bucket(10, 3, 3, 1), "g8");
  EXPECT_EQ(bucket(4096, 1024, 2048, 64), "g64");
  EXPECT_EQ(bucket(65536, 2048, 1536, 128), "g64");
  for (const auto& b : tuning().buckets) {
    const auto s = tune::representative_shape(b);
    EXPECT_EQ(bucket(s[0], s[1], s[2], s[3]), b.name);
  }
}

TEST(GroupedMatmulBuckets, CandidatesKeyAndWork) {
  const std::vector<tune::Params> c = tuning().candidates({2048, 512, 1024, 8}, 2);
  ASSERT_EQ(c.size(), 16u);
  EXPECT_EQ(c.front(), (tune::Params{{"m", 512}, {"n", 512}}));  // the default first
  EXPECT_TRUE(tuning().tunable("cpu"));
  EXPECT_FALSE(tuning().tunable("reference"));
  tune::DeclaredCall call;
  call.implementation = "cpu";
  call.dims = {1000, 64, 32, 8};
  call.variant = "transpose_rhs=off";
  const std::string k = tune::declared_key(tuning(), call, "dev");
  EXPECT_NE(k.find("version=" TESSERA_VERSION), std::string::npos);
  for (auto change : std::vector<void (*)(tune::DeclaredCall&)>{
           [](tune::DeclaredCall& c) { c.dims[3] = 9; }, [](tune::DeclaredCall& c) { c.dtype = DType::kBF16; },
           [](tune::DeclaredCall& c) { c.pass = Pass::kBackward; },
           [](tune::DeclaredCall& c) { c.variant = "transpose_rhs=on"; }}) {
    tune::DeclaredCall other = call;
    change(other);
    EXPECT_NE(tune::declared_key(tuning(), other, "dev"), k);
  }
  tune::DeclaredCall more = call;
  more.dims[0] = 1024;  // M by its power-of-two class (ragged_dims): a serving batch's token count
  EXPECT_EQ(tune::declared_key(tuning(), more, "dev"), k);
  more.dims[0] = 1025;
  EXPECT_NE(tune::declared_key(tuning(), more, "dev"), k);
  EXPECT_GE(tuning().work({4096, 1024, 2048, 8}), tuning().min_work);
  EXPECT_LT(tuning().work({512, 128, 256, 8}), tuning().min_work);
}

TEST(GroupedMatmulTuning, TableHitAndOptionsWin) {
  const testing_tune::OneRowTable table(tuning(), "f32", "g8", {{"m", 256}, {"n", 1024}});
  const tune::Declared& d = table.declared();
  tune::DeclaredCall c;
  c.implementation = "cpu";
  c.dims = {4096, 512, 2048, 4};
  tune::Choice ch = tune::choose_declared(d, c, {}, {});
  EXPECT_EQ(ch.source, "tuned table");
  EXPECT_EQ(ch.params, (tune::Params{{"m", 256}, {"n", 1024}}));
  c.dims = {4096, 512, 2048, 64};  // the other bucket: a miss
  EXPECT_EQ(tune::choose_declared(d, c, {}, {}).source, "default");
  c.given = {{"m", 32}, {"n", 16}};
  ch = tune::choose_declared(d, c, {}, {});
  EXPECT_EQ(ch.source, "options");
  EXPECT_EQ(ch.params, c.given);
}

// Sizes the cpu backend refuses fail the call before any output is written, 0 included (which
// the declaration would read as "choose").
TEST(GroupedMatmulTuning, TheCallsSizesAreValidatedFirst) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  testing::CaseSpec s;
  const testing::CaseData d = testing::make_case(s);
  Options o = testing::options_of(s);
  o.implementation = "cpu";
  Tensor out = Tensor::empty(DType::kF32, {s.M, s.N});
  std::fill_n(out.data_as<float>(), out.numel(), 7.0f);
  for (BlockSizes bs : {BlockSizes{0, 4}, BlockSizes{4, -1}, BlockSizes{65537, 4}}) {
    o.block_sizes = bs;
    EXPECT_THROW(gmm(d.inputs(), out.view(), o), Error) << bs.str();
    for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.data_as<float>()[i], 7.0f);
  }
  o.block_sizes = BlockSizes{5, 3};
  EXPECT_EQ(gmm(d.inputs(), out.view(), o), "cpu");
  EXPECT_THROW(validate_block_sizes("cpu", {0, 4}), Error);
  EXPECT_NO_THROW(validate_block_sizes("reference", {0, 4}));
}

TEST(GroupedMatmulTuning, CheckedInTableCoversEveryBucketAndIsValid) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  for (const tune::TableEntry& e : tuned_table()) {
    const BlockSizes bs{tune::param(e.params, "m").value_or(0), tune::param(e.params, "n").value_or(0)};
    EXPECT_NO_THROW(validate_block_sizes(e.implementation, bs)) << e.implementation << " " << e.bucket;
    const auto& b = tuning().buckets;
    EXPECT_TRUE(std::any_of(b.begin(), b.end(), [&](const tune::Bucket& x) { return x.name == e.bucket; })) << e.bucket;
  }
}

// The on-miss sweep times the real kernel (gmm, and tgmm alone), picks one of the candidates,
// and checks every candidate's output against the default's.
TEST(GroupedMatmulTuning, AutotuneOnMissTimesTheRealKernel) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  const Implementation& cpu = registry().require("cpu");
  tune::clear_autotune_memo();
  TempDir dir;
  ScopedEnv cache("TESSERA_CACHE_DIR", dir.path().c_str());
  ScopedEnv on("TESSERA_AUTOTUNE", "1");
  ScopedEnv table_on("TESSERA_TUNED_TABLE", nullptr);
  tune::Declared d = tuning();
  d.min_work = 0;
  d.table = testing_tune::no_rows;  // every call a miss
  const DType dt = DType::kBF16;
  Problem p;
  p.M = 96, p.K = 24, p.N = 40, p.G = 3, p.begin = {0, 30, 30, 90};
  p.dtype = dt, p.device = Device::cpu(), p.num_threads = 2;
  const Tensor lhs = random_uniform(dt, {p.M, p.K}, 1.0f, 1), rhs = random_uniform(dt, {p.G, p.K, p.N}, 1.0f, 2);
  const Tensor dout = random_uniform(dt, {p.M, p.N}, 1.0f, 3);
  Tensor out = Tensor::empty(dt, {p.M, p.N}), drhs = Tensor::empty(dt, {p.G, p.K, p.N});
  const std::vector<tune::Params> cands = d.candidates({p.M, p.K, p.N, p.G}, 2);
  for (bool tgmm_alone : {false, true}) {
    tune::DeclaredCall c;
    c.implementation = "cpu";
    c.dtype = dt;
    c.dims = {p.M, p.K, p.N, p.G};
    c.threads = p.num_threads;
    c.pass = tgmm_alone ? Pass::kBackward : Pass::kForward;
    c.variant = tgmm_alone ? "tgmm" : "";
    size_t runs = 0;
    const auto once = [&](const tune::Params& s) {
      const BlockSizes bs{*tune::param(s, "m"), *tune::param(s, "n")};
      ++runs;
      if (tgmm_alone) cpu.tgmm(p, bs, {lhs.data(), dout.data(), drhs.data(), dt});
      else cpu.gmm(p, bs, {lhs.data(), rhs.data(), out.data(), dt});
    };
    const tune::Choice ch = tune::choose_declared(
        d, c, once, tune::borrowed_outputs({tune::buffer_of(tgmm_alone ? "drhs" : "out", (tgmm_alone ? drhs : out).view())}));
    EXPECT_EQ(ch.source, "autotune");
    EXPECT_NE(std::find(cands.begin(), cands.end(), ch.params), cands.end()) << tune::params_str(ch.params);
    EXPECT_GE(runs, cands.size());
  }
}

}  // namespace
}  // namespace tessera::grouped_matmul
