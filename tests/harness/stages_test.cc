// A pipeline kernel's stages in `tessera bench` (harness::BenchConfig::stages): each host row
// carries each stage's wall time (its trace scope's span) beside the total.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/trace.h"
#include "harness/bench.h"

namespace tessera::harness {
namespace {

// Two stages of 4 ms and 1 ms, marked like a kernel marks them.
class TwoStageProblem : public BenchProblem {
 public:
  Row describe() const override { return {{"N", 1}, {"dtype", "f32"}}; }
  double work() const override { return 1; }
  Cost cost(Pass, const std::string&) const override {
    Cost c;
    c.add({"work", 1e6, 1e6, 0, false});
    return c;
  }
  BenchCall bind(const std::string&, Device, Pass, const ExecOptions&) override {
    BenchCall c;
    c.run = [] {
      {
        TESSERA_TRACE_SCOPE("fake.partial");
        std::this_thread::sleep_for(std::chrono::milliseconds(4));
      }
      TESSERA_TRACE_SCOPE("fake.combine");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    };
    return c;
  }
};

BenchConfig config() {
  BenchConfig cfg;
  cfg.kernel = "fake";
  cfg.implementations = {"cpu"};
  cfg.devices = {DeviceType::kCPU};
  cfg.cases.push_back({"s", "s", [] { return std::make_unique<TwoStageProblem>(); }});
  cfg.passes = {Pass::kForward};
  cfg.timing.repeats = 2;
  cfg.gemm_baseline = false;
  cfg.progress = false;
  cfg.stage_runs = 3;
  return cfg;
}

TEST(BenchStages, RowsCarryEachStagesTimeBesideTheTotal) {
  BenchConfig cfg = config();
  cfg.stages = {"fake.partial", "fake.combine"};
  const auto res = run_bench(cfg);
  ASSERT_EQ(res.rows.size(), 1u);
  const Row& r = res.rows[0];
  SCOPED_TRACE(r.dump());
  ASSERT_TRUE(r.contains("stage_partial_ms") && r.contains("stage_combine_ms"));
  const double a = r["stage_partial_ms"].get<double>(), b = r["stage_combine_ms"].get<double>();
  EXPECT_GE(a, 4.0);
  EXPECT_GE(b, 1.0);
  EXPECT_LT(b, a);
  // The stages are one run's spans (not summed over the stage runs: 3 × 5 ms): they fit in a
  // total. The stage runs are not the timed ones, and a loaded machine (CI's two test processes)
  // overshot a 4 ms sleep by 2.8 ms in one of them while the timed median stayed 5.1 ms: so the
  // bound is twice the median, which still fails a sum over the runs.
  EXPECT_LE(a + b, 2.0 * r["median_ms"].get<double>() + 1.0);
  EXPECT_EQ(r.value("stages", "").find("partial "), 0u);
  EXPECT_FALSE(trace::enabled());
}

// Stages declared concurrent (their spans overlap) are joined by "||" in the row's line.
TEST(BenchStages, ConcurrentStagesAreMarkedInTheLine) {
  BenchConfig cfg = config();
  cfg.stages = {Stage("fake.partial"), Stage("fake.combine", true)};
  const auto res = run_bench(cfg);
  ASSERT_EQ(res.rows.size(), 1u);
  const std::string line = res.rows[0].value("stages", "");
  EXPECT_NE(line.find("partial "), std::string::npos) << line;
  EXPECT_NE(line.find(" || combine "), std::string::npos) << line;
}

TEST(BenchStages, NoStagesNoFieldsAndARunningTraceIsLeftAlone) {
  BenchConfig cfg = config();
  auto res = run_bench(cfg);
  ASSERT_EQ(res.rows.size(), 1u);
  EXPECT_FALSE(res.rows[0].contains("stages"));
  cfg.stages = {"fake.partial"};
  trace::start();
  res = run_bench(cfg);
  EXPECT_TRUE(trace::enabled());
  trace::stop();
  EXPECT_FALSE(res.rows[0].contains("stages"));
  EXPECT_GT(trace::span("fake.partial").events, 0u);  // the user's recording kept its events
}

}  // namespace
}  // namespace tessera::harness
