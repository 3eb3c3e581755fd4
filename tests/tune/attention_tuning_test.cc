// attention's declared block sizes (tuning.cc): buckets, sanitizing, the cache key's variant,
// each implementation's own default, and the real cpu backend with the checked-in table and with
// autotune on a miss (timing the public call itself).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "cpu_backend.h"
#include "kernels/attention/impl.h"
#include "kernels/attention/testing.h"
#include "tessera/error.h"
#include "tessera/version.h"
#include "tune/autotune.h"
#include "tune/cache.h"
#include "tune/declared.h"
#include "tune/device_kind.h"
#include "tune/tune_test_util.h"

namespace tessera::attention {
namespace {

using testing_tune::ScopedEnv;
using testing_tune::TempDir;

Problem shape(int64_t B, int64_t S, int64_t H, int64_t D) {
  Problem p;
  p.N = B, p.Sq = S, p.Sk = S, p.Hq = H, p.Hkv = H, p.D = D, p.Dv = D;
  return p;
}

// The dims a call is bucketed and keyed by (api.cc): the larger of Sq, Sk and of D, Dv.
std::string bucket(const Problem& p) {
  const tune::Bucket* b = tune::match_bucket(tuning().buckets, {p.N, std::max(p.Sq, p.Sk), p.Hq, std::max(p.D, p.Dv)});
  return b ? b->name : "(none)";
}

TEST(AttentionBuckets, HeadDimsLandInTheirBuckets) {
  EXPECT_EQ(bucket(shape(1, 4096, 32, 64)), "d64");
  EXPECT_EQ(bucket(shape(1, 4096, 32, 80)), "d128");
  EXPECT_EQ(bucket(shape(1, 7, 1, 128)), "d128");
  EXPECT_EQ(bucket(shape(2, 8192, 8, 256)), "d256");
  Problem p = shape(1, 128, 4, 64);
  p.Dv = 96;  // the wider of D and Dv decides
  EXPECT_EQ(bucket(p), "d128");
  for (const auto& b : tuning().buckets) {
    const auto s = tune::representative_shape(b);
    EXPECT_EQ(bucket(shape(s[0], s[1], s[2], s[3])), b.name);
  }
}

TEST(AttentionBuckets, SanitizeClampsToTheLengths) {
  Problem p = shape(1, 100, 1, 64);
  p.Sq = 7;
  EXPECT_EQ(sanitize_for_shape({256, 512}, p), (BlockSizes{16, 112}));
  EXPECT_EQ(sanitize_for_shape({256, 512}, shape(1, 4096, 1, 64)), (BlockSizes{256, 512}));
  EXPECT_EQ(sanitize_for_shape({8, 8}, shape(1, 1, 1, 64)), (BlockSizes{8, 8}));  // never grows
}

TEST(AttentionBuckets, CandidatesDefaultsAndWork) {
  const std::vector<tune::Params> c = tuning().candidates({1, 1024, 4, 128}, 2);
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c.front(), (tune::Params{{"q", 128}, {"kv", 256}}));  // BlockSizes{}, the default
  if (::tessera::testing::kHaveCpuBackend) EXPECT_EQ(c.size(), 15u);  // cpu's 5 × 3, the default (among them) first
  EXPECT_TRUE(tuning().tunable("cpu"));
  EXPECT_FALSE(tuning().tunable("reference"));
  EXPECT_EQ(tuning().default_of("reference"), (tune::Params{{"q", 128}, {"kv", 256}}));
  EXPECT_EQ(tuning().default_of("no_such"), (tune::Params{{"q", 128}, {"kv", 256}}));
  EXPECT_LT(tuning().work({1, 512, 8, 64}), tuning().min_work);
  EXPECT_GE(tuning().work({1, 4096, 8, 128}), tuning().min_work);
}

// Autotune on, an empty cache directory and memo, and attention's tuning with no table rows and
// no minimum work: every call a miss that tunes (or reads what an earlier call stored).
struct ColdCache {
  ColdCache() { tune::clear_autotune_memo(); }
  tune::Declared tuning() const {
    tune::Declared d = attention::tuning();
    d.min_work = 0;
    d.table = testing_tune::no_rows;
    return d;
  }
  TempDir dir;
  ScopedEnv cache{"TESSERA_CACHE_DIR", dir.path().c_str()}, on{"TESSERA_AUTOTUNE", "1"};
};

TEST(AttentionBuckets, KeyHoldsWhatChangesTheWork) {
  const Problem p = shape(1, 1000, 8, 128);
  tune::DeclaredCall c;
  c.implementation = "cpu";
  c.dims = {p.N, p.Sq, p.Hq, p.D};
  c.variant = autotune_variant(p);
  const std::string k = tune::declared_key(tuning(), c, "dev");
  EXPECT_NE(k.find("version=" TESSERA_VERSION), std::string::npos);
  auto differs = [&](auto edit) {
    Problem q = p;
    edit(q);
    tune::DeclaredCall d = c;
    d.variant = autotune_variant(q);
    return tune::declared_key(tuning(), d, "dev") != k;
  };
  EXPECT_TRUE(differs([](Problem& q) { q.causal = true; }));
  EXPECT_TRUE(differs([](Problem& q) { q.window_left = 128; }));
  EXPECT_TRUE(differs([](Problem& q) { q.softcap = 30; }));
  EXPECT_TRUE(differs([](Problem& q) { q.Hkv = 2; }));
  EXPECT_FALSE(differs([](Problem& q) { q.Sk = 999; }));  // lengths by power-of-two class
  EXPECT_TRUE(differs([](Problem& q) { q.Sk = 1025; }));
  EXPECT_TRUE(differs([](Problem& q) { q.Sq = 512; }));
  EXPECT_TRUE(differs([](Problem& q) { q.varlen = true; }));
  EXPECT_FALSE(differs([](Problem& q) { q.scale = 0.5; }));  // same work
}

// A decode (Sq = 1, the cache one key longer each step) and a serving batch of changing size:
// one sweep per power-of-two class of the cache length and of the sequence count, one cache file
// each (each step was a new key: a sweep and a file per step).
TEST(AttentionCpuTuning, DecodeStepsShareOneEntryPerDoubling) {
  const ColdCache cold;
  const tune::Declared d = cold.tuning();
  size_t sweeps = 0;
  std::vector<std::string> sources;
  for (int64_t N : {3, 4})
    for (int64_t Sk = 1023; Sk <= 1026; ++Sk) {
      Problem p = shape(N, 1, 32, 128);
      p.Sk = Sk;
      tune::DeclaredCall c;
      c.implementation = "cpu";
      c.dims = {p.N, std::max(p.Sq, p.Sk), p.Hq, p.D};
      c.variant = autotune_variant(p);
      bool swept = false;
      const tune::Choice ch = tune::choose_declared(d, c, [&](const tune::Params&) { swept = true; }, {});
      sweeps += swept;
      sources.push_back(ch.source);
    }
  // N 3 and 4 share the class 4; Sk 1023, 1024 the class 1024, 1025 and 1026 the class 2048.
  EXPECT_EQ(sweeps, 2u);
  EXPECT_EQ(sources.front(), "autotune");
  EXPECT_EQ(std::count(sources.begin(), sources.end(), "autotune"), 2);
  size_t files = 0;
  for ([[maybe_unused]] const auto& f : std::filesystem::directory_iterator(cold.dir.path())) ++files;
  EXPECT_EQ(files, 2u);
}

// The call's sizes are validated by the implementation that runs before anything is written,
// and win over the table.
TEST(AttentionCpuTuning, TheCallsSizesAreValidatedFirst) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  testing::CaseSpec s;
  s.opt.implementation = "cpu";
  const testing::CaseData d = testing::make_case(s);
  Tensor o = Tensor::empty(DType::kF32, {s.B, s.Sq, s.Hq, s.Dv}), lse = Tensor::empty(DType::kF32, {s.B, s.Hq, s.Sq});
  std::fill_n(o.data_as<float>(), o.numel(), 7.0f);
  Options opt = s.opt;
  for (BlockSizes bs : {BlockSizes{0, 16}, BlockSizes{16, -1}}) {
    opt.block_sizes = bs;
    EXPECT_THROW(forward(d.inputs(), {o.view(), lse.view()}, opt), Error) << bs.str();
    for (int64_t i = 0; i < o.numel(); ++i) ASSERT_EQ(o.data_as<float>()[i], 7.0f);
  }
  EXPECT_THROW(validate_block_sizes("cpu", {0, 16}), Error);
  EXPECT_THROW(validate_block_sizes("nope", {}), Error);
  const ScopedEnv off("TESSERA_AUTOTUNE", "0");
  tune::DeclaredCall c;
  c.implementation = "cpu";
  c.dims = {1, 4096, 4, 128};
  c.given = {{"q", 32}, {"kv", 48}};
  const tune::Choice ch = tune::choose_declared(tuning(), c, {}, {});
  EXPECT_EQ(ch.source, "options");
  EXPECT_EQ(ch.params, c.given);
}

TEST(AttentionCpuTuning, TableHitAndMisses) {
  const testing_tune::OneRowTable table(tuning(), "f32", "d128", {{"q", 256}, {"kv", 512}});
  const tune::Declared& d = table.declared();
  tune::DeclaredCall c;
  c.implementation = "cpu";
  c.dims = {1, 100, 4, 128};
  EXPECT_EQ(tune::choose_declared(d, c, {}, {}).source, "tuned table");
  EXPECT_EQ(tune::choose_declared(d, c, {}, {}).params, (tune::Params{{"q", 256}, {"kv", 512}}));
  c.dtype = DType::kBF16;  // another dtype: a miss
  EXPECT_EQ(tune::choose_declared(d, c, {}, {}).source, "default");
  c.dtype = DType::kF32;
  c.dims = {1, 100, 4, 64};  // another bucket: a miss
  EXPECT_EQ(tune::choose_declared(d, c, {}, {}).source, "default");
}

// A table row or a cache entry that does not name each option (written by hand or by another
// build) is ignored: the call takes the default (the entry's missing "kv" was read as an empty
// optional, undefined behaviour).
TEST(AttentionCpuTuning, AStoredSetWithoutEveryOptionIsIgnored) {
  tune::DeclaredCall c;
  c.implementation = "cpu";
  c.dims = {1, 100, 4, 128};
  {
    const testing_tune::OneRowTable table(tuning(), "f32", "d128", {{"q", 256}});
    testing_tune::LogCapture log;
    EXPECT_EQ(tune::choose_declared(table.declared(), c, {}, {}).source, "default");
    EXPECT_NE(log.text().find("not valid"), std::string::npos) << log.text();
  }
  const ColdCache cold;
  const tune::Declared d = cold.tuning();
  tune::CacheEntry e;
  e.key = tune::declared_key(d, c, tune::default_device_kind(DeviceType::kCPU));
  e.version = TESSERA_VERSION;
  e.created = "2026-11-28T00:00:00Z";
  e.params = {{"q", 64}, {"kvv", 64}};
  tune::DiskCache(cold.dir.path()).write("attention.cpu", e);
  bool swept = false;
  EXPECT_EQ(tune::choose_declared(d, c, [&](const tune::Params&) { swept = true; }, {}).source, "default");
  EXPECT_FALSE(swept) << "the entry was read (and refused), not tuned again";
}

// The real cpu backend: autotune on a miss times the public call itself (each candidate as the
// call's block sizes), and whichever sizes win keep the results within the grid's tolerances.
TEST(AttentionCpuTuning, AutotuneOnMissKeepsResultsRight) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  tune::clear_autotune_memo();
  TempDir dir;
  ScopedEnv cache("TESSERA_CACHE_DIR", dir.path().c_str());
  ScopedEnv on("TESSERA_AUTOTUNE", "1");
  ScopedEnv table_on("TESSERA_TUNED_TABLE", nullptr);
  testing::CaseSpec s;
  s.B = 1, s.Sq = 70, s.Sk = 70, s.Hq = 2, s.Hkv = 1, s.D = 32, s.Dv = 32;
  s.opt.implementation = "cpu";
  s.opt.causal = true;
  const testing::CaseData data = testing::make_case(s);
  Tensor o = Tensor::empty(DType::kF32, {1, 70, 2, 32}), lse = Tensor::empty(DType::kF32, {1, 2, 70});
  tune::Declared d = tuning();
  d.min_work = 0;
  d.table = testing_tune::no_rows;  // every call a miss
  tune::DeclaredCall c;
  c.implementation = "cpu";
  c.dims = {1, 70, 2, 32};
  size_t runs = 0;
  const auto once = [&](const tune::Params& p) {
    Options opt = s.opt;
    opt.autotune_on_miss = false;
    opt.block_sizes = BlockSizes{*tune::param(p, "q"), *tune::param(p, "kv")};
    ++runs;
    forward(data.inputs(), {o.view(), lse.view()}, opt);
  };
  const tune::Choice ch =
      tune::choose_declared(d, c, once, tune::borrowed_outputs({tune::buffer_of("o", o.view()), tune::buffer_of("lse", lse.view())}));
  EXPECT_EQ(ch.source, "autotune");
  EXPECT_GE(runs, d.candidates(c.dims, 1).size());
  s.opt.block_sizes = BlockSizes{*tune::param(ch.params, "q"), *tune::param(ch.params, "kv")};
  for (Pass pass : {Pass::kForward, Pass::kFused}) {
    const testing::ParityReport r = testing::check_parity(s, "cpu", pass);
    ASSERT_TRUE(r.ran) << r.error;
    for (const auto& f : r.fields) EXPECT_TRUE(f.dev.ok()) << s.opt.block_sizes->str() << " " << f.field << ": " << f.dev.str();
  }
}

TEST(AttentionCpuTuning, CheckedInTableCoversEveryBucketAndIsValid) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  for (const tune::TableEntry& e : tuned_table()) {
    const BlockSizes bs{tune::param(e.params, "q").value_or(0), tune::param(e.params, "kv").value_or(0)};
    EXPECT_NO_THROW(validate_block_sizes(e.implementation, bs)) << e.implementation << " " << e.bucket;
    bool known = false;
    for (const auto& b : tuning().buckets) known |= b.name == e.bucket;
    EXPECT_TRUE(known) << e.bucket;
  }
}

}  // namespace
}  // namespace tessera::attention
