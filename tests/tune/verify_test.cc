// Tuning checks what it times (tune/verify.h): a candidate whose outputs differ from the
// default's beyond the tolerance, or hold NaN/Inf the default does not, is recorded as "wrong"
// with its deviation and never wins: not in a sweep, not in the raw records' winner, not in
// autotune-on-miss. Fake jobs with planted outputs and costs; then every kernel's real tune
// job, whose sweep must still find a valid winner with no candidate flagged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>

#include "kernels/registry.h"
#include "tessera/dtype.h"
#include "tune/autotune.h"
#include "tune/records.h"
#include "tune/sweep.h"
#include "tune/tune_test_util.h"
#include "tune/verify.h"

namespace tessera::tune {
namespace {

using testing_tune::LogCapture;
using testing_tune::TempDir;

constexpr int64_t kN = 64;
double want(int64_t i) { return std::sin(0.3 * static_cast<double>(i)) * 2.0; }  // max |want| ~ 2

// A fake kernel: one f32 output of kN values. Candidate b decides what a call writes and costs:
//   1 right (the default, 3 ms)        2 right + 1e-6 relative noise (2 ms)
//   3 one element off by 0.1 (1 ms)    4 one NaN (0.5 ms)    5 writes nothing (0.1 ms)
//   6 one +Inf (0.2 ms)                0 throws
struct Fake {
  Tensor out = Tensor::empty(DType::kF32, {kN});
  Runner runner() {
    Tensor t = out;
    RunFn run = [t](const Params& p) -> double {
      const int64_t b = p.at(0).second;
      if (b == 0) throw std::runtime_error("planted failure");
      float* o = t.data_as<float>();
      if (b != 5)
        for (int64_t i = 0; i < kN; ++i) o[i] = static_cast<float>(want(i) * (b == 2 ? 1 + 1e-6 * (i % 3) : 1.0));
      if (b == 3) o[17] += 0.1f;
      if (b == 4) o[5] = std::numeric_limits<float>::quiet_NaN();
      if (b == 6) o[9] = std::numeric_limits<float>::infinity();
      switch (b) {
        case 1: return 0.003;
        case 2: return 0.002;
        case 3: return 0.001;
        case 4: return 0.0005;
        case 6: return 0.0002;
        default: return 0.0001;
      }
    };
    return {run, [t] { return std::vector<Output>{{"out", t}}; }};
  }
};

std::vector<Params> cands(std::initializer_list<int64_t> bs) {
  std::vector<Params> out;
  for (int64_t b : bs) out.push_back({{"b", b}});
  return out;
}

SweepPolicy quick() {
  SweepPolicy p;
  p.warmup = 1;
  p.repeats = 3;
  return p;
}

TEST(TuneVerify, WrongAndNonFiniteCandidatesAreRecordedAndNeverWin) {
  Fake f;
  const SweepResult r = sweep(cands({1, 2, 3, 4, 5, 6}), f.runner(), quick());
  ASSERT_EQ(r.reference, 0);
  // The fastest right one wins: 2 (2 ms) over the default (3 ms); 3..6 are faster but wrong.
  ASSERT_EQ(r.best, 1);
  const auto& m = r.measurements;
  EXPECT_EQ(m[0].status, Measurement::Status::kOk);
  EXPECT_EQ(m[0].max_abs_dev, 0.0);
  EXPECT_EQ(m[1].status, Measurement::Status::kOk);
  double largest = 0;
  for (int64_t i = 0; i < kN; ++i) largest = std::max(largest, std::fabs(static_cast<double>(static_cast<float>(want(i)))));
  EXPECT_NEAR(m[1].tolerance, 1e-4 * largest, 1e-9) << "1e-4 of the reference's largest |value| (f32)";
  EXPECT_GT(m[1].max_abs_dev, 0.0);  // the noise was seen, and is within tolerance
  EXPECT_LE(m[1].max_abs_dev, m[1].tolerance);
  for (size_t i : {2u, 3u, 4u, 5u}) {
    EXPECT_EQ(m[i].status, Measurement::Status::kWrong) << i;
    EXPECT_EQ(std::string(status_name(m[i].status)), "wrong");
    EXPECT_EQ(m[i].dev_output, "out") << i;
    EXPECT_NE(m[i].failure.find("outputs differ from the default's (b=1)"), std::string::npos) << m[i].failure;
    EXPECT_GT(m[i].first_call_ms, 0.0) << "it ran: its first call is kept";
    EXPECT_EQ(m[i].runs, 0) << "a wrong candidate is not timed further";
  }
  EXPECT_NEAR(m[2].max_abs_dev, 0.1, 1e-6);
  EXPECT_NE(m[2].failure.find("at [17]"), std::string::npos) << m[2].failure;
  EXPECT_TRUE(std::isinf(m[3].max_abs_dev)) << "NaN where the default has a number";
  EXPECT_NE(m[3].failure.find("at [5]"), std::string::npos) << m[3].failure;
  // Writes nothing: the outputs were zeroed before its call, so the default's values left in
  // them by the previous candidate cannot pass for its own.
  EXPECT_GT(m[4].max_abs_dev, 1.0);
  EXPECT_TRUE(std::isinf(m[5].max_abs_dev)) << "Inf where the default has a number";
}

TEST(TuneVerify, AFailedDefaultLeavesTheFirstThatRanAsReference) {
  Fake f;
  const SweepResult r = sweep(cands({0, 3, 1, 2}), f.runner(), quick());
  ASSERT_EQ(r.reference, 1);  // b=3 ran first: it is the reference, right or not
  EXPECT_EQ(r.measurements[0].status, Measurement::Status::kFailed);
  EXPECT_FALSE(r.measurements[0].checked());
  // b=1 and b=2 differ from b=3 by 0.1 at [17]: wrong relative to that reference.
  EXPECT_EQ(r.measurements[2].status, Measurement::Status::kWrong);
  EXPECT_NE(r.measurements[2].failure.find("differ from the reference's (b=3)"), std::string::npos);
  EXPECT_EQ(r.best, 1);
}

TEST(TuneVerify, WithoutOutputsNothingIsChecked) {
  Fake f;
  const SweepResult r = sweep(cands({1, 3, 4}), f.runner().run, quick());
  EXPECT_EQ(r.reference, -1);
  EXPECT_EQ(r.best, 2);  // unchecked, the NaN-writer wins on time: what the check prevents
  for (const auto& m : r.measurements) EXPECT_FALSE(m.checked());
}

// The check's own failure (here: its outputs cannot be read after two calls, as when the copy of
// a huge output cannot be allocated) fails no candidate: the sweep goes on unchecked, saying why.
TEST(TuneVerify, AFailingCheckFailsNoCandidate) {
  Fake f;
  Runner r = f.runner();
  auto calls = std::make_shared<int>(0);
  const OutputsFn real = r.outputs;
  r.outputs = [real, calls] {
    if (++*calls > 2) throw std::runtime_error("planted: no memory for the copy");
    return real();
  };
  const SweepResult s = sweep(cands({1, 2, 4}), r, quick());
  EXPECT_NE(s.unchecked.find("the output check stopped: planted: no memory for the copy"), std::string::npos)
      << s.unchecked;
  for (const auto& m : s.measurements) EXPECT_NE(m.status, Measurement::Status::kFailed) << m.failure;
  EXPECT_EQ(s.best, 2) << "unchecked after the failure: b=4 is not caught, but nothing is failed";
}

// Non-finite values the reference has too are the data's (a fully masked row's -inf lse), not
// the candidate's; any other non-finite value is a deviation.
TEST(TuneVerify, NonFiniteValuesMatchOnlyThemselves) {
  Tensor t = Tensor::empty(DType::kF32, {4});
  int calls = 0;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  OutputCheck check([t] { return std::vector<Output>{{"lse", t}}; });
  auto write = [&](std::initializer_list<float> v) {
    check.prepare();
    EXPECT_EQ(t.data_as<float>()[0], 0.0f) << "prepare zero-fills";
    std::copy(v.begin(), v.end(), t.data_as<float>());
    ++calls;
  };
  write({1.0f, -inf, nan, 2.0f});
  check.take_reference();
  write({1.0f, -inf, nan, 2.0f});
  EXPECT_TRUE(check.compare().ok());
  EXPECT_EQ(check.compare().max_abs, 0.0);
  write({1.0f, inf, nan, 2.0f});
  EXPECT_FALSE(check.compare().ok());
  EXPECT_EQ(check.compare().index, 1);
  write({1.0f, -inf, 3.0f, 2.0f});
  EXPECT_FALSE(check.compare().ok()) << "a number where the reference has NaN";
  EXPECT_EQ(calls, 4);
}

// bf16 outputs: one rounding flip of the largest value passes; a change of 2^-5 of it does not.
TEST(TuneVerify, Bf16ToleranceAllowsRoundingNotErrors) {
  Tensor t = Tensor::empty(DType::kBF16, {3});
  OutputCheck check([t] { return std::vector<Output>{{"dx", t}}; });
  auto write = [&](float a, float b, float c) {
    check.prepare();
    store_from_f32(t.data(), DType::kBF16, 0, a);
    store_from_f32(t.data(), DType::kBF16, 1, b);
    store_from_f32(t.data(), DType::kBF16, 2, c);
  };
  write(1.5f, -0.25f, 0.01f);
  check.take_reference();
  EXPECT_DOUBLE_EQ(default_rtol(DType::kBF16), 1.0 / 64);
  write(1.5f + 1.0f / 128, -0.25f, 0.01f);  // the last bit of 1.5 in bf16 (ulp 2^-7)
  EXPECT_TRUE(check.compare().ok()) << check.compare().str();
  write(1.5f, -0.25f + 0.05f, 0.01f);  // 0.05 > 1.5 / 64
  EXPECT_FALSE(check.compare().ok()) << check.compare().str();
  EXPECT_EQ(check.compare().index, 1);
}

TEST(TuneVerify, RecordsCarryStatusWrongAndTheDeviation) {
  Fake f;
  const SweepResult r = sweep(cands({1, 3, 4}), f.runner(), quick());
  std::vector<Record> rows;
  for (const auto& m : r.measurements) rows.push_back({"k", "cpu", "dev", "f32", "all", "fused", "B=1", m});
  TempDir d;
  write_csv(d.path() + "/r.csv", rows);
  write_json(d.path() + "/r.json", rows, {{"kernel", "k"}});
  std::stringstream csv;
  csv << std::ifstream(d.path() + "/r.csv").rdbuf();
  std::string header, row0, row1, row2;
  std::getline(csv, header), std::getline(csv, row0), std::getline(csv, row1), std::getline(csv, row2);
  EXPECT_EQ(header,
            "kernel,implementation,device_kind,dtype,bucket,op,shape,candidate,status,median_ms,min_ms,"
            "first_call_ms,runs,max_abs_dev,tolerance,dev_output,failure");
  EXPECT_NE(row0.find(",ok,"), std::string::npos) << row0;
  EXPECT_NE(row0.find(",0,"), std::string::npos) << row0;  // the reference: deviation 0
  EXPECT_NE(row1.find(",wrong,,,,,0.1,"), std::string::npos) << row1;
  EXPECT_NE(row2.find(",wrong,,,,,inf,"), std::string::npos) << row2;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(d.path() + "/r.json"));
  EXPECT_EQ(j["records"][1]["status"], "wrong");
  EXPECT_NEAR(j["records"][1]["max_abs_dev"].get<double>(), 0.1, 1e-6);
  EXPECT_EQ(j["records"][2]["max_abs_dev"], "inf");
  EXPECT_EQ(j["records"][2]["dev_output"], "out");
}

// Autotune-on-miss: the fastest candidates are wrong; the winner (and the cache) is the right one.
TEST(TuneVerify, AutotuneOnMissNeverPicksAWrongCandidate) {
  TempDir d;
  clear_autotune_memo();
  Fake f;
  AutotuneRequest req;
  req.prefix = "fake.cpu";
  req.key = "fake|impl=cpu|version=" TESSERA_VERSION;
  req.candidates = cands({1, 3, 4, 5});
  req.make_run = [&] { return f.runner(); };
  LogCapture log;
  const AutotuneResult r = lookup_or_autotune(DiskCache(d.path()), req);
  ASSERT_EQ(r.kind, AutotuneResult::Kind::kFound);
  EXPECT_EQ(r.params, (Params{{"b", 1}}));
  EXPECT_NE(log.text().find("b=3 is not used: outputs differ"), std::string::npos) << log.text();
  const auto e = DiskCache(d.path()).read(req.prefix, req.key);
  ASSERT_TRUE(e.has_value());
  EXPECT_FALSE(e->negative);
  EXPECT_EQ(e->params, (Params{{"b", 1}}));
  EXPECT_EQ(e->candidates[1]["status"], "wrong");
  EXPECT_EQ(e->candidates[2]["max_abs_dev"], "inf");
  clear_autotune_memo();
}

// ---- every kernel's real tune job ----

// The first bucket's representative shape, each dim capped at 512 (within the bucket): big
// enough for several tiles per candidate, small enough for a unit test.
// The first bucket's representative, each dim at most 512; slstm's steps at most 64 (its steps run
// one after another and no candidate depends on S: at 256 its sweep took 100 s under ASan).
std::vector<int64_t> test_shape(const std::string& kernel, const Bucket& b) {
  std::vector<int64_t> s;
  for (const auto& d : b.dims) {
    const int64_t cap = kernel == "slstm" && d.name == "S" ? 64 : 512;
    s.push_back(std::max(d.lo, std::min<int64_t>(d.representative, cap)));
  }
  return s;
}

std::vector<std::string> tunable_here(const kernels::KernelSpec& k) {
  std::vector<std::string> out;
  for (const auto& info : k.implementations().infos())
    if (info.available && k.tune.tunable(info.name)) out.push_back(info.name);
  return out;
}

SweepPolicy once() {
  SweepPolicy p;
  p.warmup = 0;
  p.repeats = 1;
  return p;
}

std::vector<std::string> tunable_kernels() {
  std::vector<std::string> out;
  for (const kernels::KernelSpec* k : kernels::all())
    if (k->tune.buckets) out.push_back(k->name);
  return out;
}

// One test per kernel (ctest runs them side by side: together they were the suite's longest test).
class TuneVerifyEachKernel : public ::testing::TestWithParam<std::string> {};

TEST_P(TuneVerifyEachKernel, EverySweepFindsAValidWinnerAndFlagsNoCandidate) {
  const kernels::KernelSpec& k = kernels::get(GetParam());
  size_t sweeps = 0;
  const auto shape = test_shape(k.name, k.tune.buckets().front());
  for (const std::string& impl : tunable_here(k))
    for (DType dt : {DType::kF32, DType::kBF16})
      for (Pass pass : k.passes) {
        SCOPED_TRACE(k.name + " " + impl + " " + dtype_name(dt) + " " + pass_name(pass));
        const kernels::TuneJob job = k.tune.job(impl, shape, dt, pass, true);
        if (!job.support.ok) continue;
        const Runner run = job.make_run();
        ASSERT_TRUE(static_cast<bool>(run.outputs)) << "the adapter hands back its outputs";
        const SweepResult r = sweep(job.candidates, run, once());
        ++sweeps;
        ASSERT_GE(r.best, 0);
        EXPECT_EQ(r.reference, 0) << "the default ran and is the reference";
        double worst = 0;
        for (const auto& m : r.measurements) {
          EXPECT_NE(m.status, Measurement::Status::kWrong) << params_str(m.candidate) << ": " << m.failure;
          if (m.ok()) {
            ASSERT_TRUE(m.checked()) << params_str(m.candidate);
            if (m.tolerance > 0) worst = std::max(worst, m.max_abs_dev / m.tolerance);
          }
        }
        // Reordered sums stay within one last-bit flip of the largest value (half the
        // tolerance of a 16-bit output; a tiny part of the f32 one).
        EXPECT_LE(worst, 0.5) << "largest deviation / tolerance";
        std::printf("%s %s %s %s: %zu candidates, worst deviation %.3g of the tolerance\n", k.name.c_str(),
                    impl.c_str(), dtype_name(dt), pass_name(pass), r.measurements.size(), worst);
      }
  if (sweeps == 0) GTEST_SKIP() << "no tunable implementation of " << k.name << " is built";
}

INSTANTIATE_TEST_SUITE_P(TuneVerifyKernels, TuneVerifyEachKernel, ::testing::ValuesIn(tunable_kernels()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Every kernel with buckets has its own test above: a kernel that gains buckets gains one.
TEST(TuneVerifyKernels, EveryTunableKernelHasItsSweepTest) {
  EXPECT_GE(tunable_kernels().size(), 3u) << "linear_cross_entropy, attention, grouped_matmul at least";
}

// A real kernel job whose fastest candidate is planted wrong (its dx corrupted after the call):
// recorded wrong with the deviation of dx, and the winner is another candidate.
TEST(TuneVerifyKernels, APlantedWrongCandidateOfARealKernelNeverWins) {
  const kernels::KernelSpec& k = kernels::get("linear_cross_entropy");
  std::vector<std::string> impls;  // host ones: the planted corruption writes dx on the host
  for (const auto& info : k.implementations().infos())
    if (info.available && info.device == DeviceType::kCPU && k.tune.tunable(info.name)) impls.push_back(info.name);
  if (impls.empty()) GTEST_SKIP() << "no tunable host implementation is built";
  const kernels::TuneJob job = k.tune.job(impls.front(), {64, 64, 1024}, DType::kF32, Pass::kFused, true);
  ASSERT_GE(job.candidates.size(), 3u);
  const Runner real = job.make_run();
  const Params bad = job.candidates[2];
  Runner planted{[real, bad](const Params& p) {
                   const double t = real.run(p);
                   if (p != bad) return t;
                   for (const Output& o : real.outputs())
                     if (o.name == "dx") o.tensor.data_as<float>()[7] += 1.0f;
                   return 1e-9;  // the fastest by far
                 },
                 real.outputs};
  const SweepResult r = sweep(job.candidates, planted, once());
  const Measurement& m = r.measurements[2];
  EXPECT_EQ(m.status, Measurement::Status::kWrong) << m.failure;
  EXPECT_EQ(m.dev_output, "dx");
  EXPECT_NEAR(m.max_abs_dev, 1.0, 1e-3);
  ASSERT_GE(r.best, 0);
  EXPECT_NE(r.best, 2);
}

}  // namespace
}  // namespace tessera::tune
