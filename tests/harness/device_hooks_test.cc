// Harness device hooks: registered by the CUDA module when it is loaded, which asking for them
// does (without any kernel call first: `tessera roofline` touches no kernel; tessera_cuda_tests
// loads the module even without a driver, tests/cuda/force_module.cc), and harmless on a
// machine without a GPU —
// device_count() is 0, measure_ceilings says "no CUDA device" instead of throwing, time_gemm
// gives nothing, synchronize reports an error instead of crashing. The GPU-only checks skip
// without a device.
#include <gtest/gtest.h>

#include <string>

#include "harness/device_hooks.h"
#include "kernels/registry.h"
#include "harness/roofline.h"
#include "tessera/error.h"

namespace th = tessera::harness;
using tessera::DeviceType;
using tessera::DType;

namespace {
// Nothing here calls a kernel first: asking for the hooks loads the module, which registers them.
const th::DeviceHooks* cuda_hooks() { return th::device_hooks(DeviceType::kCUDA); }
}  // namespace

TEST(DeviceHooksCuda, RegisteredByTheCudaModule) {
  const auto* h = cuda_hooks();
  ASSERT_NE(h, nullptr) << "the cuda backend did not register its harness hooks";
  EXPECT_TRUE(static_cast<bool>(h->synchronize));
  EXPECT_TRUE(static_cast<bool>(h->measure_ceilings));
  EXPECT_TRUE(static_cast<bool>(h->time_gemm));
  EXPECT_TRUE(static_cast<bool>(h->device_count));
}

TEST(DeviceHooksCuda, WithoutADeviceEverythingReportsInsteadOfCrashing) {
  const auto* h = cuda_hooks();
  ASSERT_NE(h, nullptr);
  if (h->device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(h->device_count(), 0);

  const auto c = h->measure_ceilings(0, /*quick=*/true);
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->gemm_gflops.empty());
  EXPECT_EQ(c->bandwidth_gbs, 0.0);
  ASSERT_FALSE(c->notes.empty());
  EXPECT_NE(c->notes[0].find("no CUDA device"), std::string::npos) << c->notes[0];
  for (const char* dt : {"bf16", "f16", "f32"}) {
    ASSERT_TRUE(c->gemm_method.count(dt)) << dt;
    EXPECT_NE(c->gemm_method.at(dt).find("not measured: no CUDA device"), std::string::npos) << c->gemm_method.at(dt);
  }
  EXPECT_NE(c->bandwidth_method.find("not measured"), std::string::npos);

  EXPECT_FALSE(h->time_gemm(0, 64, 64, 64, DType::kBF16, false).has_value());
  EXPECT_THROW(h->synchronize(0), tessera::Error);

  // The roofline then lists no GPU (and measures nothing else with cpu = false).
  th::RooflineOptions ro;
  ro.quick = true;
  ro.cpu = false;
  ro.progress = false;
  const auto r = th::measure_roofline(ro);
  EXPECT_EQ(r.find("cuda:0"), nullptr);
}

// `tessera bench --impl cuda` without a device: nothing is timed, not even the host BLAS
// baselines (at GPU-sized shapes they would take minutes), and the reason is given.
TEST(DeviceHooksCuda, BenchOfAnUnavailableGpuTimesNothing) {
  const auto* h = cuda_hooks();
  ASSERT_NE(h, nullptr);
  if (h->device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  const auto& k = tessera::kernels::get("linear_cross_entropy");
  std::vector<std::string> unavailable;
  tessera::harness::GridShape big{"big", {{"B", 8192}, {"H", 4096}, {"V", 128256}}, {}};
  auto cfg = tessera::kernels::bench_config(k, "cuda", {big}, {DType::kBF16}, {}, 1, &unavailable);
  EXPECT_EQ(unavailable.size(), 1u);
  cfg.compare = true;
  cfg.progress = false;
  const auto res = tessera::harness::run_bench(cfg);
  EXPECT_TRUE(res.rows.empty());
  bool said = false;
  for (const auto& m : res.messages) said |= m.find("no implementation to time") != std::string::npos;
  EXPECT_TRUE(said);
}

// GPU only: small, quick functional checks (not a benchmark: no timing is asserted beyond > 0).
TEST(DeviceHooksCuda, OnADeviceTheHooksMeasure) {
  const auto* h = cuda_hooks();
  ASSERT_NE(h, nullptr);
  if (h->device_count() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_NO_THROW(h->synchronize(0));
  for (bool bt : {false, true}) {
    const auto s = h->time_gemm(0, 96, 80, 64, DType::kBF16, bt);
    ASSERT_TRUE(s.has_value());
    EXPECT_GT(*s, 0.0);
  }
  EXPECT_FALSE(h->time_gemm(0, 0, 8, 8, DType::kF32, false).has_value());  // a clear "no", not a crash
  const auto c = h->measure_ceilings(0, /*quick=*/true);
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->name.empty());
  for (const char* dt : {"bf16", "f16", "f32"}) {
    ASSERT_TRUE(c->gemm_gflops.count(dt)) << dt << ": " << c->gemm_method.at(dt);
    EXPECT_GT(c->gemm_gflops.at(dt), 0.0);
  }
  EXPECT_GT(c->bandwidth_gbs, 0.0) << c->bandwidth_method;
  const auto bad = h->measure_ceilings(h->device_count(), /*quick=*/true);  // no such device
  ASSERT_TRUE(bad.has_value());
  EXPECT_TRUE(bad->gemm_gflops.empty());
}

