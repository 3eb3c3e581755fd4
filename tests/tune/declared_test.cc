// tune/declared.h: the call-time choice of a kernel whose tuning is declared as data, and
// kernels/declared_tune.h on a real kernel (mlstm's chunk length).
#include <gtest/gtest.h>

#include <chrono>
#include <algorithm>
#include <limits>
#include <thread>

#include "kernels/registry.h"
#include "tessera/error.h"
#include "tune/autotune.h"
#include "tune/declared.h"
#include "tune/device_kind.h"
#include "tune/tune_test_util.h"
#include "cpu_backend.h"

namespace tessera::tune {
namespace {

using testing_tune::ScopedEnv;
using testing_tune::TempDir;

std::vector<TableEntry> g_rows;
const std::vector<TableEntry>& rows() { return g_rows; }

Declared toy() {
  Declared d;
  d.kernel = "toy";
  d.options = {"block"};
  d.buckets = {{"small", "N <= 100", {{"N", 1, 100, 64}}},
               {"large", "N > 100", {{"N", 101, std::numeric_limits<int64_t>::max(), 1000}}}};
  d.implementations = {"cpu"};
  d.candidates = [](const std::vector<int64_t>&, int) {
    return std::vector<Params>{{{"block", 8}}, {{"block", 16}}, {{"block", 32}}};
  };
  d.work = [](const std::vector<int64_t>& n) { return double(n.at(0)); };
  d.min_work = 500;
  d.table = rows;
  return d;
}

DeclaredCall call(int64_t n, int64_t block = 0) {
  DeclaredCall c;
  c.implementation = "cpu";
  c.dims = {n};
  c.given = {{"block", block}};
  return c;
}

// A run that is fastest at block 32 (16 ms), slowest at the default 8 (28 ms): sleeps 4 ms apart
// at least, so that a loaded machine cannot reorder them (0.4 ms apart, 100 µs per step, once did).
void planted(const Params& p) {
  std::this_thread::sleep_for(std::chrono::microseconds(500 * (64 - param(p, "block").value())));
}

TEST(DeclaredTuning, AnExplicitOptionIsUsedAsGiven) {
  const Choice c = choose_declared(toy(), call(1000, 16), planted, {});
  EXPECT_EQ(param(c.params, "block"), 16);
  EXPECT_EQ(c.source, "options");
}

TEST(DeclaredTuning, ATableRowWinsForItsBucketAndDeviceKind) {
  g_rows = {{"cpu", default_device_kind(DeviceType::kCPU), "f32", "small", {{"block", 32}}, "N=64", "forward", 1.0, "2026-11-25"}};
  const ScopedEnv off("TESSERA_AUTOTUNE", "0");
  EXPECT_EQ(param(choose_declared(toy(), call(50), planted, {}).params, "block"), 32);
  EXPECT_EQ(choose_declared(toy(), call(50), planted, {}).source, "tuned table");
  EXPECT_EQ(choose_declared(toy(), call(5000), planted, {}).source, "default");  // other bucket: a miss
  DeclaredCall other = call(50);
  other.dtype = DType::kBF16;  // other dtype: a miss
  EXPECT_EQ(param(choose_declared(toy(), other, planted, {}).params, "block"), 8);
  g_rows.clear();
}

// dispatch_declared's registry: one cpu implementation, run as given.
struct OneImpl {
  std::string name() const { return "cpu"; }
  DeviceType device_type() const { return DeviceType::kCPU; }
};
struct OneImplRegistry {
  template <class Problem, class Body>
  std::string dispatch_problem(const std::string&, const Problem&, Body&& body) const {
    body(OneImpl{});
    return "cpu";
  }
};

// Sizes a table row gave that the backend refuses (kInvalidArgument): the error says where they
// came from and how to avoid them; sizes the caller gave, or the defaults, are refused as they are.
TEST(DeclaredTuning, SizesATableGaveAndTheBackendRefusesNameTheirSource) {
  g_rows = {{"cpu", default_device_kind(DeviceType::kCPU), "f32", "small", {{"block", 32}}, "N=64", "forward", 1.0, "2026-11-25"}};
  const ScopedEnv off("TESSERA_AUTOTUNE", "0");
  const auto refuse32 = [](const OneImpl&, int64_t block) {
    if (block == 32) throw Error(ErrorCode::kInvalidArgument, "toy cpu: block 32 is not supported");
  };
  const auto at = [](const Params& p) { return param(p, "block").value_or(0); };
  const auto dispatch = [&](const DeclaredCall& c) {
    return dispatch_declared(OneImplRegistry{}, toy(), ExecOptions{}, int64_t{0}, c, {}, at, refuse32);
  };
  try {
    dispatch(call(50));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    const std::string m = e.what();
    EXPECT_NE(m.find("toy cpu: block 32 is not supported [block sizes block=32 from the tuned table; "
                     "TESSERA_TUNED_TABLE=0 avoids them]"),
              std::string::npos) << m;
  }
  try {
    dispatch(call(50, 32));  // the caller's own sizes: the backend's message alone
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("[block sizes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dispatch(call(5000)), "cpu");  // the other bucket: the default 8 runs
  g_rows.clear();
}

// Sizes the caller gave that the backend refuses, but that the choice did not take (a 0 reads as
// "not given", so the table row ran): check_given refuses them first, with the backend's message
// alone — it said "from the tuned table; TESSERA_TUNED_TABLE=0 avoids them", which did not.
TEST(DeclaredTuning, GivenSizesAreCheckedBeforeTheChoiceAndBlameNoTable) {
  g_rows = {{"cpu", default_device_kind(DeviceType::kCPU), "f32", "small", {{"block", 32}}, "N=64", "forward", 1.0, "2026-11-25"}};
  const ScopedEnv off("TESSERA_AUTOTUNE", "0");
  int runs = 0;
  const auto run = [&](const OneImpl&, int64_t) { ++runs; };
  const auto at = [](const Params& p) { return param(p, "block").value_or(0); };
  const auto refuse_zero = [](const OneImpl&) { throw Error(ErrorCode::kInvalidArgument, "toy cpu: block 0 is not supported"); };
  try {
    dispatch_declared(OneImplRegistry{}, toy(), ExecOptions{}, int64_t{0}, call(50, 0), {}, at, run, refuse_zero);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "toy cpu: block 0 is not supported");
  }
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(dispatch_declared(OneImplRegistry{}, toy(), ExecOptions{}, int64_t{0}, call(50), {}, at, run,
                              [](const OneImpl&) {}),
            "cpu");
  EXPECT_EQ(runs, 1);
  g_rows.clear();
}

TEST(DeclaredTuning, AnUntunableImplementationGetsTheDefault) {
  DeclaredCall c = call(5000);
  c.implementation = "reference";
  const Choice ch = choose_declared(toy(), c, planted, {});
  EXPECT_EQ(param(ch.params, "block"), 8);
  EXPECT_EQ(ch.source, "default");
}

// An implementation with defaults of its own (a device backend's fixed tiles) gets those; the
// tunable one still starts from the first candidate.
TEST(DeclaredTuning, AnImplementationsOwnDefault) {
  Declared d = toy();
  d.default_of = [](const std::string& impl) { return Params{{"block", impl == "cuda" ? 4 : 8}}; };
  DeclaredCall c = call(5000);
  c.implementation = "cuda";
  EXPECT_EQ(param(choose_declared(d, c, planted, {}).params, "block"), 4);
  c.given = {{"block", 16}};
  EXPECT_EQ(param(choose_declared(d, c, planted, {}).params, "block"), 16);  // options still win
  const ScopedEnv off("TESSERA_AUTOTUNE", "0");
  EXPECT_EQ(param(choose_declared(d, call(5000), planted, {}).params, "block"), 8);
}

TEST(DeclaredTuning, AMissAutotunesBigProblemsOnceAndCachesTheWinner) {
  const TempDir dir;
  const ScopedEnv cache("TESSERA_CACHE_DIR", dir.path().c_str());
  const ScopedEnv on("TESSERA_AUTOTUNE", "1");
  clear_autotune_memo();
  int runs = 0;
  const auto counted = [&](const Params& p) { ++runs, planted(p); };
  const Choice first = choose_declared(toy(), call(5000), counted, {});
  EXPECT_EQ(first.source, "autotune");
  EXPECT_EQ(param(first.params, "block"), 32);
  EXPECT_GT(runs, 3);
  clear_autotune_memo();  // from the disk cache now, without running anything
  runs = 0;
  const Choice again = choose_declared(toy(), call(5000), counted, {});
  EXPECT_EQ(again.source, "autotune cache");
  EXPECT_EQ(param(again.params, "block"), 32);
  EXPECT_EQ(runs, 0);
  // Too small to be worth it (work 50 < min_work 500): the default, nothing run.
  EXPECT_EQ(choose_declared(toy(), call(50), counted, {}).source, "default");
  EXPECT_EQ(runs, 0);
  clear_autotune_memo();
}

// Autotune inside a call checks every candidate's outputs against the default's: the fastest
// candidate (32) computes something else, so it never wins nor reaches the cache.
TEST(DeclaredTuning, AWrongCandidateNeverWinsAnAutotuneInsideACall) {
  const TempDir dir;
  const ScopedEnv cache("TESSERA_CACHE_DIR", dir.path().c_str());
  const ScopedEnv on("TESSERA_AUTOTUNE", "1");
  clear_autotune_memo();
  std::vector<float> out(8);
  const auto run = [&](const Params& p) {
    planted(p);
    const float v = param(p, "block") == 32 ? 2.0f : 1.0f;  // 32 is wrong
    std::fill(out.begin(), out.end(), v);
  };
  const OutputsFn outs = borrowed_outputs({{"out", out.data(), DType::kF32, {8}}});
  const Choice c = choose_declared(toy(), call(5000), run, outs);
  EXPECT_EQ(c.source, "autotune");
  EXPECT_EQ(param(c.params, "block"), 16);  // the fastest right one
  clear_autotune_memo();
}

// Two stages' block sizes validated together: stage 2 combines `splits` partials of stage 1
// and takes at most 8 of them at once; a table row that breaks it is ignored, options that
// break it fail the call.
TEST(DeclaredTuning, StagesBlockSizesAreValidatedJointly) {
  Declared d = toy();
  d.options = {"splits", "combine_width"};
  d.candidates = [](const std::vector<int64_t>&, int) {
    return std::vector<Params>{{{"splits", 4}, {"combine_width", 4}}, {{"splits", 8}, {"combine_width", 8}}};
  };
  d.validate = [](const Params& p, const std::vector<int64_t>&) {
    if (param(p, "combine_width").value() < param(p, "splits").value())
      throw Error(ErrorCode::kInvalidArgument, "toy: combine_width must be >= splits");
  };
  DeclaredCall c = call(50);
  c.given = {{"splits", 16}, {"combine_width", 8}};
  try {
    choose_declared(d, c, planted, {});
    FAIL() << "expected the joint check to refuse splits 16 with combine_width 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("combine_width must be >= splits"), std::string::npos) << e.what();
  }
  c.given = {{"splits", 8}, {"combine_width", 8}};
  EXPECT_EQ(choose_declared(d, c, planted, {}).source, "options");
  g_rows = {{"cpu", default_device_kind(DeviceType::kCPU), "f32", "small", {{"splits", 8}, {"combine_width", 2}}, "N=64",
             "forward", 1.0, "2026-11-25"}};
  const ScopedEnv off("TESSERA_AUTOTUNE", "0");
  const Choice ch = choose_declared(d, call(50), planted, {});  // the broken row: ignored
  EXPECT_EQ(ch.source, "default");
  EXPECT_EQ(param(ch.params, "splits"), 4);
  g_rows.clear();
}

TEST(DeclaredTuning, MlstmDeclaresItsChunkAndTunesThroughItsSignature) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  const kernels::KernelSpec& k = kernels::get("mlstm");
  ASSERT_TRUE(k.tune.tunable);
  EXPECT_TRUE(k.tune.tunable("cpu"));
  EXPECT_FALSE(k.tune.tunable("reference"));
  ASSERT_FALSE(k.tune.buckets().empty());
  const kernels::TuneJob job = k.tune.job("cpu", {1, 2, 33, 8, 12}, DType::kF32, Pass::kFused, true);
  ASSERT_GE(job.candidates.size(), 2u);
  EXPECT_EQ(param(job.candidates.front(), "chunk_size"), 64);  // the default first
  const Runner r = job.make_run();
  EXPECT_GT(r.run(job.candidates[1]), 0.0);
  const auto outs = r.outputs();
  ASSERT_FALSE(outs.empty());  // h, dq, dk, dv, di, df: checked between candidates
  EXPECT_EQ(outs.front().name, "h");
}

}  // namespace
}  // namespace tessera::tune
