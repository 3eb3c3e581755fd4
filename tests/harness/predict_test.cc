// harness/predict.h: the roofline prediction of a bench configuration, nothing run.
#include "harness/predict.h"

#include <gtest/gtest.h>

#include <memory>

#include "tessera/error.h"

namespace tessera::harness {
namespace {

// A problem whose cost is given: 1e9 issued FLOPs (8e8 useful), 4e8 bytes.
class FakeProblem final : public BenchProblem {
 public:
  Row describe() const override { return Row{{"N", 7}, {"dtype", "bf16"}}; }
  double work() const override { return 1; }
  Cost cost(Pass pass, const std::string& impl) const override {
    Cost c;
    c.add({"useful", 8e8, 4e8, 0, false});
    c.add({"recomputed", 2e8, 0, 0, true});
    c.assumptions.push_back("fake " + impl + " " + pass_name(pass));
    return c;
  }
  BenchCall bind(const std::string&, Device, Pass, const ExecOptions&) override {
    throw Error(ErrorCode::kInternal, "a prediction never binds");
  }
};

Roofline ceilings(double f32_gflops, double gbs) {
  Roofline r;
  DeviceCeilings d;
  d.device = "cpu";
  if (f32_gflops > 0) d.gemm_gflops["f32"] = f32_gflops;
  d.bandwidth_gbs = gbs;
  r.devices.push_back(d);
  return r;
}

TEST(Predict, ComputeAndMemoryTimesAndTheLargerBound) {
  Row r;
  FakeProblem p;
  const Cost c = p.cost(Pass::kForward, "x");
  Roofline roof = ceilings(100, 10);  // 1e9 FLOPs / 100 GFLOP/s = 10 ms; 4e8 B / 10 GB/s = 40 ms
  fill_prediction(r, c, "cpu", "bf16", &roof);
  EXPECT_DOUBLE_EQ(r.at("compute_ms").get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(r.at("memory_ms").get<double>(), 40.0);
  EXPECT_DOUBLE_EQ(r.at("predicted_ms").get<double>(), 40.0);
  EXPECT_EQ(r.at("bound"), "memory");
  EXPECT_DOUBLE_EQ(r.at("ai").get<double>(), 2.0);  // useful FLOPs per byte
  EXPECT_NE(r.at("roofline_note").get<std::string>().find("f32's is used"), std::string::npos);  // bf16 has none
  roof = ceilings(10, 100);  // 100 ms vs 4 ms
  fill_prediction(r, c, "cpu", "f32", &roof);
  EXPECT_DOUBLE_EQ(r.at("predicted_ms").get<double>(), 100.0);
  EXPECT_EQ(r.at("bound"), "compute");
}

TEST(Predict, NoCeilingsGiveNullTimesAndSayWhy) {
  FakeProblem p;
  const Cost c = p.cost(Pass::kForward, "x");
  Row r;
  fill_prediction(r, c, "cpu", "f32", nullptr);
  EXPECT_TRUE(r.at("predicted_ms").is_null());
  EXPECT_NE(r.at("roofline_note").get<std::string>().find("tessera roofline"), std::string::npos);
  const Roofline roof = ceilings(100, 10);
  fill_prediction(r, c, "cuda:0", "f32", &roof);  // no such device stored
  EXPECT_TRUE(r.at("predicted_ms").is_null());
  EXPECT_NE(r.at("roofline_note").get<std::string>().find("no cuda:0"), std::string::npos);
  const Roofline no_bw = ceilings(100, 0);
  fill_prediction(r, c, "cpu", "f32", &no_bw);
  EXPECT_TRUE(r.at("predicted_ms").is_null());
  EXPECT_DOUBLE_EQ(r.at("compute_ms").get<double>(), 10.0);
  EXPECT_NE(r.at("roofline_note").get<std::string>().find("no bandwidth ceiling"), std::string::npos);
}

TEST(Predict, UsesTheCostModelProblemAndReportsCasesThatCannotBeBuilt) {
  BenchConfig cfg;
  cfg.implementations = {"a", "b"};
  cfg.devices = {DeviceType::kCPU, DeviceType::kCPU};
  cfg.passes = {Pass::kForward, Pass::kFused};
  BenchCase ok{"s", "s bf16", [] () -> std::unique_ptr<BenchProblem> {
                 throw Error(ErrorCode::kOutOfMemory, "make() allocates: a prediction must not call it");
               }};
  ok.make_cost_model = [] { return std::make_unique<FakeProblem>(); };
  BenchCase bad{"t", "t bf16", [] () -> std::unique_ptr<BenchProblem> {
                  throw Error(ErrorCode::kInvalidArgument, "bad shape");
                }};
  cfg.cases = {ok, bad};
  const Roofline roof = ceilings(100, 10);
  std::vector<std::string> messages;
  const std::vector<Row> rows = predict(cfg, &roof, &messages);
  ASSERT_EQ(rows.size(), 4u);  // 2 implementations × 2 passes; the fake has no GEMM floor
  EXPECT_EQ(rows[0].at("kind"), "prediction");
  EXPECT_EQ(rows[0].at("implementation"), "a");
  EXPECT_EQ(rows[1].at("mode"), "fused");
  EXPECT_EQ(rows[3].at("implementation"), "b");
  EXPECT_EQ(rows[3].at("N"), 7);
  EXPECT_EQ(rows[3].at("note"), "fake b fused");
  EXPECT_DOUBLE_EQ(rows[3].at("predicted_ms").get<double>(), 40.0);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_NE(messages[0].find("skipping t bf16: bad shape"), std::string::npos) << messages[0];
}

}  // namespace
}  // namespace tessera::harness
