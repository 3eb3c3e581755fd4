// Tuning with the real cpu backend through the public API: autotune-on-miss times into scratch
// and caches; the caller's results are those of the chosen block sizes; the checked-in table is
// used when it has a row for this machine. Nothing here asserts a timing or which candidate
// wins (that would be flaky); planted-cost tests are in lce_tuning_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/log.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "kernels/linear_cross_entropy/testing.h"
#include "tune/declared.h"
#include "tune/autotune.h"
#include "tune/device_kind.h"
#include "tune/table.h"
#include "tune/tune_test_util.h"

namespace tessera::linear_cross_entropy {
namespace {

using testing_tune::LogCapture;
using testing_tune::ScopedEnv;
using testing_tune::TempDir;

class DebugLog {
 public:
  DebugLog() : old_(log::level()) { log::set_level(log::Level::kDebug); }
  ~DebugLog() { log::set_level(old_); }
  LogCapture capture;

 private:
  log::Level old_;
};

void expect_close(const Tensor& a, const Tensor& b, double rel, const char* what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = load_as_f32(a.data(), a.dtype(), i), y = load_as_f32(b.data(), b.dtype(), i);
    ASSERT_NEAR(x, y, rel * (1.0 + std::fabs(y))) << what << "[" << i << "]";
  }
}

TEST(LceCpuTuning, AutotuneOnMissCachesAndKeepsResultsRight) {
  if (!find_implementation("cpu")) GTEST_SKIP() << "built without the cpu backend";
  TempDir dir;
  ScopedEnv on("TESSERA_AUTOTUNE", "1"), cache("TESSERA_CACHE_DIR", dir.path().c_str()),
      budget("TESSERA_AUTOTUNE_BUDGET_MS", "2000"),
      no_table("TESSERA_TUNED_TABLE", "0");  // this machine's table has a row for the bucket
  tune::clear_autotune_memo();
  testing::CaseSpec spec;
  spec.lead = {64};
  spec.H = 128;
  spec.V = 8192;  // B*H*V = 2^26: just big enough to autotune; a call takes milliseconds
  spec.opt.implementation = "cpu";
  spec.opt.skip_ignored = false;  // every row: the work stays just above the autotune threshold
  const testing::CaseData data = make_case(spec);

  Result tuned;
  {
    DebugLog log;
    tuned = compute_with_grad(data.inputs(), spec.opt);
    EXPECT_NE(log.capture.text().find("(autotune)"), std::string::npos) << log.capture.text();
  }
  size_t files = 0;
  std::string path;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) ++files, path = e.path().string();
  ASSERT_EQ(files, 1u);
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["result"], "ok");
  EXPECT_NE(j["key"].get<std::string>().find("op=fused"), std::string::npos);
  EXPECT_NE(j["key"].get<std::string>().find("B=64|H=128|V=8192"), std::string::npos) << j["key"];
  EXPECT_EQ(j["candidates"].size(), tuning("cpu").candidates({64, 128, 8192}, 1).size());

  {  // Same process again: the memo answers.
    DebugLog log;
    (void)compute_with_grad(data.inputs(), spec.opt);
    EXPECT_NE(log.capture.text().find("(autotune cache)"), std::string::npos) << log.capture.text();
  }
  // Defaults (autotune off) give the same numbers up to summation order.
  Options off = spec.opt;
  off.autotune_on_miss = false;
  const Result plain = compute_with_grad(data.inputs(), off);
  expect_close(tuned.loss, plain.loss, 1e-5, "loss");
  expect_close(tuned.lse, plain.lse, 1e-5, "lse");
  expect_close(tuned.dx, plain.dx, 1e-4, "dx");
  expect_close(tuned.dw, plain.dw, 1e-4, "dw");
}

TEST(LceCpuTuning, CheckedInTableIsUsedOnItsMachine) {
  const Implementation* cpu = find_implementation("cpu");
  if (!cpu) GTEST_SKIP() << "built without the cpu backend";
  testing::CaseSpec spec;
  spec.lead = {8};
  spec.H = 16;
  spec.V = 20000;  // llama2-ish; far too small to autotune
  spec.opt.implementation = "cpu";
  const testing::CaseData data = make_case(spec);
  Problem p;
  p.B = 8, p.H = 16, p.V = 20000;
  const std::string kind = cpu->device_kind(p);
  const bool has_row = tune::lookup(tuned_table(), "cpu", kind, "f32", "llama2-ish") != nullptr;
  // Below avx512 a row written under the pre-microarch key serves too (a Zen 3 here, 2026-11-26).
  const std::optional<std::string> legacy = tune::legacy_cpu_device_kind(kind);
  const bool has_legacy_row =
      !has_row && legacy && tune::lookup(tuned_table(), "cpu", *legacy, "f32", "llama2-ish") != nullptr;
  DebugLog log;
  (void)compute(data.inputs(), spec.opt);
  const char* want = has_row ? "(tuned table)" : has_legacy_row ? "(tuned table (legacy key))" : "(default)";
  EXPECT_NE(log.capture.text().find(want), std::string::npos) << "device kind " << kind << "\n" << log.capture.text();
}

// A miss that takes the default reports the sizes that ran: the implementation's own default for
// the problem (bf16 on the AVX512-BF16 route: v = 512, not the declaration's f32 2048).
TEST(LceCpuTuning, ADefaultChoiceReportsTheImplementationsOwnDefault) {
  const Implementation* cpu = find_implementation("cpu");
  if (!cpu) GTEST_SKIP() << "built without the cpu backend";
  const ScopedEnv no_table("TESSERA_TUNED_TABLE", "0");
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    testing::CaseSpec spec;
    spec.lead = {8};
    spec.H = 16;
    spec.V = 3000;  // far too small to autotune
    spec.dtype = dt;
    spec.opt.implementation = "cpu";
    const testing::CaseData data = make_case(spec);
    Problem p;
    p.B = 8, p.H = 16, p.V = 3000, p.dtype = dt;
    tune::ChoiceRecorder rec;
    (void)compute(data.inputs(), spec.opt);
    ASSERT_EQ(rec.records().size(), 1u) << dtype_name(dt);
    EXPECT_EQ(rec.records()[0].source, "default");
    EXPECT_EQ(rec.records()[0].params, to_params(cpu->default_block_sizes(p))) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace tessera::linear_cross_entropy
