// Generic tuning pieces: buckets, params, the sweep (with planted costs, never real timing),
// tuned-table lookup / merge / emission.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tessera/error.h"
#include "tune/bucket.h"
#include "tune/params.h"
#include "tune/sweep.h"
#include "tune/table.h"

namespace tessera::tune {
namespace {

std::vector<Bucket> buckets() {
  return {
      {"tiny-v", "", {{"B", 1, kAny, 8}, {"V", 1, 100, 64}}},
      {"big-b", "", {{"B", 1000, kAny, 1024}, {"V", 1, kAny, 500}}},
      {"rest", "", {{"B", 1, kAny, 16}, {"V", 1, kAny, 1000}}},
  };
}

TEST(TuneBucket, FirstMatchWins) {
  const auto bs = buckets();
  EXPECT_EQ(match_bucket(bs, {5000, 50})->name, "tiny-v");  // also in big-b and rest
  EXPECT_EQ(match_bucket(bs, {5000, 500})->name, "big-b");
  EXPECT_EQ(match_bucket(bs, {10, 500})->name, "rest");
  EXPECT_EQ(match_bucket(bs, {1, 100})->name, "tiny-v");  // inclusive bounds
  EXPECT_EQ(match_bucket(bs, {1, 101})->name, "rest");
}

TEST(TuneBucket, NoMatchAndWrongRank) {
  std::vector<Bucket> bs = {{"only", "", {{"B", 10, 20, 16}}}};
  EXPECT_EQ(match_bucket(bs, {9}), nullptr);
  EXPECT_EQ(match_bucket(bs, {21}), nullptr);
  EXPECT_EQ(match_bucket(bs, {15, 3}), nullptr);  // rank differs
  EXPECT_EQ(representative_shape(bs[0]), std::vector<int64_t>{16});
  EXPECT_EQ(shape_str(buckets()[2], {16, 1000}), "B=16,V=1000");
  EXPECT_EQ(ranges_str(buckets()[0]), "B any, V 1..100");
}

TEST(TuneBucket, Pow2ClassRoundsUpToAPowerOfTwo) {
  EXPECT_EQ(pow2_class(0), 1);
  EXPECT_EQ(pow2_class(1), 1);
  EXPECT_EQ(pow2_class(600), 1024);
  EXPECT_EQ(pow2_class(1024), 1024);
  EXPECT_EQ(pow2_class(1025), 2048);
}

TEST(TuneParams, JsonRoundTripAndStr) {
  const Params p = {{"b", 256}, {"h", 512}, {"v", 2048}};
  EXPECT_EQ(params_str(p), "b=256,h=512,v=2048");
  EXPECT_EQ(params_from_json(params_to_json(p)), p);
  EXPECT_EQ(param(p, "h").value(), 512);
  EXPECT_FALSE(param(p, "x").has_value());
  EXPECT_THROW(params_from_json(nlohmann::json{{"b", "x"}}), std::runtime_error);
  EXPECT_THROW(params_from_json(nlohmann::json::array()), std::runtime_error);
}

// Planted costs: seconds per call keyed by b; b == 0 throws; counts calls.
struct Planted {
  std::map<int64_t, double> cost;
  std::map<int64_t, int> calls;
  RunFn fn() {
    return [this](const Params& p) {
      const int64_t b = *param(p, "b");
      ++calls[b];
      if (b == 0) throw std::runtime_error("planted failure");
      return cost.at(b);
    };
  }
};

std::vector<Params> cands(std::initializer_list<int64_t> bs) {
  std::vector<Params> out;
  for (int64_t b : bs) out.push_back({{"b", b}});
  return out;
}

TEST(TuneSweep, PicksFastestRecordsFailures) {
  Planted pl{{{1, 0.003}, {2, 0.001}, {3, 0.002}}, {}};
  SweepPolicy pol;
  pol.warmup = 1;
  pol.repeats = 3;
  const SweepResult r = sweep(cands({1, 0, 2, 3}), pl.fn(), pol);
  ASSERT_EQ(r.measurements.size(), 4u);
  EXPECT_EQ(r.best, 2);
  EXPECT_DOUBLE_EQ(r.measurements[2].median_ms, 1.0);
  EXPECT_DOUBLE_EQ(r.measurements[2].first_call_ms, 1.0);
  EXPECT_EQ(r.measurements[2].runs, 3);
  EXPECT_EQ(r.measurements[1].status, Measurement::Status::kFailed);
  EXPECT_EQ(r.measurements[1].failure, "planted failure");
  EXPECT_EQ(pl.calls[2], 1 + 1 + 3);  // first call, warm-up, repeats
  EXPECT_EQ(pl.calls[0], 1);          // a failure is not retried
  EXPECT_FALSE(r.budget_exhausted);
}

TEST(TuneSweep, TieGoesToEarlierCandidate) {
  Planted pl{{{1, 0.002}, {2, 0.002}}, {}};
  const SweepResult r = sweep(cands({1, 2}), pl.fn(), SweepPolicy{});
  EXPECT_EQ(r.best, 0);
}

TEST(TuneSweep, BudgetSkipsTheRest) {
  Planted pl{{{1, 0.5}, {2, 0.1}, {3, 0.01}}, {}};
  SweepPolicy pol;
  pol.warmup = 0;
  pol.repeats = 3;
  pol.min_repeats = 1;
  pol.budget_s = 0.55;  // first calls: 1 (0.5 s), 2 (0.6 s in all); 3 is skipped
  std::vector<SweepTick> ticks;
  const SweepResult r = sweep(cands({1, 2, 3}), pl.fn(), pol, {}, [&](const SweepTick& t) { ticks.push_back(t); });
  EXPECT_TRUE(r.budget_exhausted);
  EXPECT_EQ(r.measurements[0].status, Measurement::Status::kOk);
  EXPECT_EQ(r.measurements[0].runs, 1);  // min_repeats, past the budget
  EXPECT_EQ(r.measurements[1].runs, 1);
  EXPECT_EQ(r.measurements[2].status, Measurement::Status::kSkipped);
  EXPECT_EQ(pl.calls[3], 0);
  EXPECT_EQ(r.best, 1);
  ASSERT_FALSE(ticks.empty());
  EXPECT_EQ(ticks.back().done, ticks.back().total);  // cancelled runs are counted as done
  EXPECT_EQ(ticks.back().best, 1);
  EXPECT_DOUBLE_EQ(ticks.back().best_ms, 100.0);
}

// The machine gets twice as slow half-way through the sweep (another job starts). Timed one
// after the other, the first candidate would win on the quiet half; interleaved, the truly
// faster one wins.
TEST(TuneSweep, InterleavingSurvivesALoadChange) {
  int call = 0;
  RunFn run = [&](const Params& p) {
    const double factor = ++call > 6 ? 2.0 : 1.0;
    return factor * (*param(p, "b") == 1 ? 1.0 : 0.9);
  };
  SweepPolicy pol;
  pol.warmup = 0;
  pol.repeats = 5;
  const SweepResult r = sweep(cands({1, 2}), run, pol);
  EXPECT_EQ(r.best, 1);
  EXPECT_DOUBLE_EQ(r.measurements[0].median_ms, 2000.0);
  EXPECT_DOUBLE_EQ(r.measurements[1].median_ms, 1800.0);
}

TEST(TuneSweep, ProgressCountsEveryRunAndFailures) {
  Planted pl{{{1, 0.003}, {2, 0.001}}, {}};
  SweepPolicy pol;
  pol.warmup = 1;
  pol.repeats = 2;
  std::vector<std::string> phases;
  size_t last_done = 0, total = 0;
  const SweepResult r = sweep(
      cands({1, 0, 2}), pl.fn(), pol, [&](size_t, const char* phase) { phases.push_back(phase); },
      [&](const SweepTick& t) {
        EXPECT_GT(t.done, last_done);
        last_done = t.done;
        total = t.total;
      });
  EXPECT_EQ(total, 3u * 4u);
  EXPECT_EQ(last_done, total);
  EXPECT_EQ(phases.size(), 3u + 2u + 4u);  // 3 first calls, then the 2 live candidates
  EXPECT_EQ(phases.front(), std::string("first call"));
  EXPECT_EQ(phases.back(), std::string("timed"));
  EXPECT_EQ(r.best, 2);
}

TEST(TuneSweep, NoCandidateWorks) {
  Planted pl{{}, {}};
  const SweepResult r = sweep(cands({0, 0}), pl.fn(), SweepPolicy{});
  EXPECT_EQ(r.best, -1);
  for (const auto& m : r.measurements) EXPECT_FALSE(m.ok());
}

TEST(TuneSweep, Median) {
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 2, 3}), 2.5);
  EXPECT_DOUBLE_EQ(median({}), 0);
}

TableEntry row(std::string impl, std::string dev, std::string dt, std::string bucket, int64_t b) {
  return {impl, dev, dt, bucket, {{"b", b}}, "B=1", "forward", 1.5, "2026-01-01"};
}

TEST(TuneTable, LookupIsExactOnAllFourFields) {
  const std::vector<TableEntry> t = {row("cpu", "cpu:X:2c:avx2", "f32", "small", 64),
                                     row("cpu", "cpu:X:2c:avx2", "bf16", "small", 128)};
  EXPECT_EQ(lookup(t, "cpu", "cpu:X:2c:avx2", "bf16", "small")->params[0].second, 128);
  EXPECT_EQ(lookup(t, "cpu", "cpu:X:4c:avx2", "f32", "small"), nullptr);
  EXPECT_EQ(lookup(t, "cuda", "cpu:X:2c:avx2", "f32", "small"), nullptr);
  EXPECT_EQ(lookup(t, "cpu", "cpu:X:2c:avx2", "f32", "large"), nullptr);
}

TEST(TuneTable, MergeReplacesSameKeyKeepsOthers) {
  const auto merged = merge_tables({row("cpu", "A", "f32", "small", 1), row("cpu", "B", "f32", "small", 2)},
                                   {row("cpu", "A", "f32", "small", 3), row("cpu", "A", "bf16", "small", 4)});
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(lookup(merged, "cpu", "A", "f32", "small")->params[0].second, 3);
  EXPECT_EQ(lookup(merged, "cpu", "B", "f32", "small")->params[0].second, 2);
  EXPECT_EQ(lookup(merged, "cpu", "A", "bf16", "small")->params[0].second, 4);
}

TEST(TuneTable, EmitsReadableSource) {
  TableSource src{"k", "kernels/k/tuning.h", "tessera::k", "tuned_table", "tessera tune k --emit-table",
                  "No rows yet."};
  const std::string empty = emit_table_cc(src, {}, "2026-01-01");
  EXPECT_NE(empty.find("No rows yet."), std::string::npos);
  EXPECT_NE(empty.find("const std::vector<tune::TableEntry>& tuned_table()"), std::string::npos);
  TableEntry e = row("cpu", "cpu:Evil \"model\":2c:avx2", "f32", "small", 64);
  const std::string one = emit_table_cc(src, {e}, "2026-01-01");
  EXPECT_NE(one.find("{\"b\", 64}"), std::string::npos);
  EXPECT_NE(one.find("1.500 ms median, measured 2026-01-01"), std::string::npos);
  EXPECT_NE(one.find("\"cpu:Evil \\\"model\\\":2c:avx2\""), std::string::npos);  // escaped
  EXPECT_EQ(one.find("No rows yet."), std::string::npos);
}

}  // namespace
}  // namespace tessera::tune

namespace tessera {
namespace {

// tune::parse_params: the text params_str writes, and every malformed item refused by name.
TEST(ParseParams, ReadsWhatParamsStrWrites) {
  const tune::Params p = {{"b", 256}, {"h", 512}, {"v", -3}};
  EXPECT_EQ(tune::parse_params(tune::params_str(p), "x"), p);
  EXPECT_EQ(tune::parse_params(" m = 8 , n=16 ", "x"), (tune::Params{{"m", 8}, {"n", 16}}));
}

TEST(ParseParams, RefusesMalformedItemsNamingThem) {
  for (const char* bad : {"", "m", "m=", "=3", "m=3,", "m=3x", "m=3,,n=4", "m=1e3", "m=99999999999999999999"}) {
    try {
      (void)tune::parse_params(bad, "k: block_sizes");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("k: block_sizes: "), std::string::npos) << e.what();
    }
  }
  try {
    (void)tune::parse_params("m=1,m=2", "k");
    ADD_FAILURE() << "accepted a repeated name";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m is given twice"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
