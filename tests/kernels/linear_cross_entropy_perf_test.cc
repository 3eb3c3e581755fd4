// linear_cross_entropy: cost model numbers and a tiny bench run with the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "harness/blas.h"
#include "harness/options.h"
#include "tessera/linear_cross_entropy.h"
#include "kernels/registry.h"
#include "tessera/error.h"
#include "cpu_backend.h"

namespace tessera::linear_cross_entropy {
namespace {

harness::GridShape shape(const char* name, int64_t B, int64_t H, int64_t V) {
  return {name, {{"B", B}, {"H", H}, {"V", V}}, {}};
}

// The bench problem's cost model (`tessera bench --predict`), with bench flags ("bias", "true").
harness::Cost cost(int64_t B, int64_t H, int64_t V, Pass pass, const std::string& impl, DType dt = DType::kF32,
                   const std::vector<std::pair<std::string, std::string>>& flags = {}) {
  const kernels::KernelSpec& k = kernels::get(kKernelName);
  harness::OptionValues o = harness::defaults_of(k.bench.options);
  for (const auto& [name, value] : flags) o.set(name, value);
  return k.bench.make_cost_model(shape("c", B, H, V), dt, o)->cost(pass, impl);
}

TEST(LinearCrossEntropyCost, ForwardKnownShape) {
  const auto c = cost(4, 8, 16, Pass::kForward, "cpu");  // f32, i64 labels, mean, no bias / cap
  const double gemm = 2.0 * 4 * 8 * 16;  // 1024
  // GEMM + online logsumexp (3 per logit) + row loss (6 per token).
  EXPECT_DOUBLE_EQ(c.flops_useful, gemm + 3 * 64 + 6 * 4);
  EXPECT_DOUBLE_EQ(c.flops_issued, c.flops_useful);
  // x 4·8·4 + w 8·16·4 + labels 4·8 + loss 4 + lse 4·4.
  EXPECT_DOUBLE_EQ(c.bytes, 128 + 512 + 32 + 4 + 16);
  EXPECT_DOUBLE_EQ(c.transcendentals, 64 + 4);  // exp per logit, log per row
  EXPECT_DOUBLE_EQ(c.arithmetic_intensity(), c.flops_useful / c.bytes);
  // Label smoothing's Σz: one more flop per logit.
  EXPECT_DOUBLE_EQ(cost(4, 8, 16, Pass::kForward, "cpu", DType::kF32, {{"label-smoothing", "0.1"}}).flops_useful,
                   c.flops_useful + 64);
}

TEST(LinearCrossEntropyCost, BackwardRecomputesAndSoftCapCountsTanh) {
  const std::vector<std::pair<std::string, std::string>> flags{{"soft-cap", "30"}, {"bias", "true"}};
  const double gemm = 2.0 * 4 * 8 * 16, BV = 64;
  const auto b = cost(4, 8, 16, Pass::kBackward, "cpu", DType::kF32, flags);
  // Issued − useful = the recomputed logits (3 GEMMs issued, 2 useful): GEMM + bias add + soft cap (2 flops).
  EXPECT_DOUBLE_EQ(b.flops_issued - b.flops_useful, gemm + BV + 2 * BV);
  // Useful: 2 GEMMs + dz (4) + soft cap derivative (3) + dbias (1) per logit.
  EXPECT_DOUBLE_EQ(b.flops_useful, 2 * gemm + (4 + 3 + 1) * BV);
  EXPECT_DOUBLE_EQ(b.transcendentals, BV /*tanh*/ + BV /*exp*/);
  // Reads x, w, labels, bias, lse, grad_loss; writes dx, dw, dbias (f32).
  EXPECT_DOUBLE_EQ(b.bytes, 128 + 512 + 32 + 64 + 16 + 4 + 128 + 512 + 64);
  EXPECT_FALSE(b.assumptions.empty());

  const auto f = cost(4, 8, 16, Pass::kForward, "cpu", DType::kF32, flags);
  EXPECT_DOUBLE_EQ(f.transcendentals, BV /*tanh*/ + BV /*exp*/ + 4 /*log*/);
  // The GEMM floor counts the useful GEMMs: 1, 2, 3.
  const auto floor = kernels::get(kKernelName).bench.make_cost_model(shape("c", 4, 8, 16), DType::kF32,
                                                                     harness::defaults_of(kernels::get(kKernelName).bench.options))
                         ->gemm_floor();
  ASSERT_TRUE(floor.has_value());
  EXPECT_EQ(floor->count(Pass::kForward), 1);
  EXPECT_EQ(floor->count(Pass::kBackward), 2);
  EXPECT_EQ(floor->count(Pass::kFused), 3);
}

TEST(LinearCrossEntropyCost, FusedIssuedGemmsPerImplementation) {
  const double gemm = 2.0 * 32 * 64 * 128;
  const auto ref = cost(32, 64, 128, Pass::kFused, "reference", DType::kBF16);
  const auto cpu = cost(32, 64, 128, Pass::kFused, "cpu", DType::kBF16);
  EXPECT_DOUBLE_EQ(ref.flops_useful, cpu.flops_useful);
  EXPECT_DOUBLE_EQ(ref.flops_issued - ref.flops_useful, gemm);  // 4 issued, 3 useful
  EXPECT_DOUBLE_EQ(cpu.flops_issued, cpu.flops_useful);         // assumed 3 issued
  EXPECT_GE(cpu.flops_useful, 3 * gemm);
  EXPECT_FALSE(cpu.assumptions.empty());
  // bf16 storage halves x / w / dx / dw bytes.
  const auto f32 = cost(32, 64, 128, Pass::kFused, "cpu");
  EXPECT_DOUBLE_EQ(f32.bytes - cpu.bytes, 2.0 * (32 * 64 + 64 * 128) * 2);
  EXPECT_THROW(parse_pass("sideways"), Error);
  EXPECT_EQ(parse_pass("fused"), Pass::kFused);
}

// Through the generic driver, as `tessera bench linear_cross_entropy` runs it.
TEST(LinearCrossEntropyBench, TinyShapeWithReference) {
  const kernels::KernelSpec& k = kernels::get("linear_cross_entropy");
  harness::BenchConfig cfg = kernels::bench_config(k, "reference", {shape("tiny", 8, 16, 64), shape("too-big", 64, 64, 64)},
                                                   {DType::kF32}, {}, 1, nullptr);
  cfg.reference_max_work = 10000;  // skips "too-big" (B·H·V = 262144)
  cfg.timing.repeats = 3;
  cfg.timing.max_seconds = 0.5;
  cfg.compare = true;
  cfg.progress = false;
  harness::Roofline roof;
  harness::DeviceCeilings d;
  d.device = "cpu";
  d.gemm_gflops = {{"f32", 1e6}};  // far above anything here: every fraction is a real one
  d.bandwidth_gbs = 1e6;
  roof.devices.push_back(d);
  cfg.roofline = &roof;

  const auto res = harness::run_bench(cfg);
  int kernel_rows = 0;
  for (const auto& r : res.rows) {
    SCOPED_TRACE(r.dump());
    EXPECT_GT(r["median_ms"].get<double>(), 0.0);
    EXPECT_GT(r["first_call_ms"].get<double>(), 0.0);
    EXPECT_LE(r["min_ms"].get<double>(), r["median_ms"].get<double>());
    EXPECT_GE(r["max_ms"].get<double>(), r["median_ms"].get<double>());
    EXPECT_GT(r["gflop_useful"].get<double>(), 0.0);
    EXPECT_GT(r["gflops"].get<double>(), 0.0);
    EXPECT_GT(r["gbs"].get<double>(), 0.0);
    EXPECT_GT(r["roofline_fraction"].get<double>(), 0.0);
    if (r["kind"] == "kernel") {
      ++kernel_rows;
      EXPECT_EQ(r["implementation"], "reference");
      EXPECT_EQ(r["shape"], "tiny");
      EXPECT_EQ(r["B"], 8);
      if (r["mode"] != "backward") {
        // Mean CE of unit-variance logits over 64 classes: near log(64) ≈ 4.2.
        EXPECT_GT(r["loss"].get<double>(), 2.0);
        EXPECT_LT(r["loss"].get<double>(), 7.0);
      }
      if (harness::blas::available()) {
        EXPECT_GT(r["vs_gemm"].get<double>(), 0.0);
        EXPECT_GT(r["vs_baseline"].get<double>(), 0.0);
      }
    }
  }
  EXPECT_EQ(kernel_rows, 3);  // fwd, bwd, fused on "tiny" only
  bool skipped = false;
  for (const auto& m : res.messages) skipped |= m.find("too-big") != std::string::npos;
  EXPECT_TRUE(skipped);
  if (harness::blas::available()) {
    // Baselines: one GEMM row per shape and one materialized row per pass, in the same run.
    int gemm = 0, mat = 0;
    for (const auto& r : res.rows) {
      gemm += r["implementation"] == "blas-gemm";
      mat += r["implementation"] == "blas-materialized";
    }
    EXPECT_EQ(gemm, 2);
    EXPECT_EQ(mat, 6);
    // The materialized baseline computes the same loss as the reference.
    double ref_loss = 0, mat_loss = 0;
    for (const auto& r : res.rows)
      if (r["shape"] == "tiny" && r["mode"] == "forward")
        (r["kind"] == "kernel" ? ref_loss : mat_loss) = r["loss"].get<double>();
    EXPECT_NEAR(ref_loss, mat_loss, 1e-4 * std::abs(ref_loss));
  }
  const auto cols = harness::bench_columns(k.dims);
  EXPECT_NE(std::find(cols.begin(), cols.end(), "V"), cols.end());
  EXPECT_NE(std::find(cols.begin(), cols.end(), "roofline_fraction"), cols.end());
}

// Ceilings below what was measured are stale: flagged, never printed as a fraction above 100 %.
TEST(LinearCrossEntropyBench, FasterThanTheCeilingsIsFlaggedStale) {
  const kernels::KernelSpec& k = kernels::get("linear_cross_entropy");
  harness::BenchConfig cfg = kernels::bench_config(k, "reference", {shape("tiny", 8, 16, 64)}, {DType::kF32}, {}, 1, nullptr);
  cfg.passes = {Pass::kForward};
  cfg.timing.repeats = 1;
  cfg.gemm_baseline = false;
  cfg.progress = false;
  harness::Roofline roof;
  harness::DeviceCeilings d;
  d.device = "cpu";
  d.gemm_gflops = {{"f32", 1e-6}};
  d.bandwidth_gbs = 1e-6;
  roof.devices.push_back(d);
  cfg.roofline = &roof;
  const auto res = harness::run_bench(cfg);
  ASSERT_EQ(res.rows.size(), 1u);
  const auto& r = res.rows[0];
  EXPECT_TRUE(r["roofline_fraction"].is_null()) << r.dump();
  EXPECT_TRUE(r.value("roofline_stale", false));
  EXPECT_GT(r["roofline_measured_fraction"].get<double>(), 1.0);
  EXPECT_NE(r["roofline_note"].get<std::string>().find("tessera roofline"), std::string::npos);
}

TEST(LinearCrossEntropyBench, UnknownImplementationIsAnError) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();  // the list names cpu before the unknown one
  const kernels::KernelSpec& k = kernels::get("linear_cross_entropy");
  try {
    kernels::bench_config(k, "cpu, nope", {shape("tiny", 2, 2, 2)}, {DType::kF32}, {}, 1, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("no implementation named 'nope'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::linear_cross_entropy
