// `tessera bench --trace` (a Chrome / Perfetto trace with the kernels' named phases) and
// `tessera bench --predict` (the cost model against stored ceilings, nothing run).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "primitives/cpu_bf16_gemm.h"
#include "tools/cli_test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using cli_test::Cmd;
using nlohmann::json;

class BenchTrace : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = tessera::cli_test::fresh_test_dir("tessera_trace_cli");
    // Ceilings with round numbers: 100 GFLOP/s for f32 GEMMs, 10 GB/s.
    std::ofstream(p("roof.json")) << R"({"schema": "tessera-roofline/1", "measured_at": "2026-01-01T00:00:00Z",
      "devices": [{"device": "cpu", "name": "test", "gemm_gflops": {"f32": 100}, "bandwidth_gbs": 10}]})";
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string p(const std::string& name) const { return (dir / name).string(); }
  static json read_json(const std::string& path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return json::parse(s.str());  // throws (failing the test) when it is not valid JSON
  }
  fs::path dir;
};

// Names of the complete events of a trace, after checking every event's fields.
std::multiset<std::string> scope_names(const json& doc) {
  std::multiset<std::string> names;
  for (const json& e : doc.at("traceEvents")) {
    EXPECT_TRUE(e.contains("name") && e.contains("ph") && e.contains("pid") && e.contains("tid")) << e.dump();
    if (e.at("ph") != "X") continue;
    EXPECT_TRUE(e.at("ts").is_number() && e.at("dur").is_number() && e.at("args").is_object()) << e.dump();
    names.insert(e.at("name").get<std::string>());
  }
  return names;
}

// Chrome's rule for "X" events: on one track (tid) they nest, never partly overlap.
bool nests_per_track(const json& doc) {
  std::map<int, std::vector<std::pair<double, double>>> tracks;
  for (const json& e : doc.at("traceEvents"))
    if (e.at("ph") == "X")
      tracks[e.at("tid").get<int>()].push_back({e.at("ts"), e.at("ts").get<double>() + e.at("dur").get<double>()});
  for (auto& [tid, spans] : tracks) {
    std::sort(spans.begin(), spans.end(),
              [](auto& a, auto& b) { return a.first < b.first || (a.first == b.first && a.second > b.second); });
    std::vector<double> open;  // ends of the enclosing spans
    for (const auto& [begin, end] : spans) {
      while (!open.empty() && open.back() <= begin) open.pop_back();
      if (!open.empty() && end > open.back() + 2e-3) return false;  // ts, dur are rounded to ns
      open.push_back(end);
    }
  }
  return true;
}

#if defined(TESSERA_HAVE_CPU_BACKEND)
TEST_F(BenchTrace, EachKernelsTraceHoldsItsNamedPhases) {
  const std::map<std::string, std::pair<std::string, std::set<std::string>>> want = {
      {"linear_cross_entropy",
       {"cpu,cpu_v2",
        {"lce.call", "lce.phase_a", "lce.gemm.logits", "lce.softmax", "lce.merge", "lce.phase_b1", "lce.gemm.dw",
         "lce.phase_b2", "lce.finish", "lce.pack_w"}}},
      {"attention",
       {"cpu", {"attn.fwd", "attn.fwd.item", "attn.fwd.store", "attn.bwd", "attn.bwd.item", "attn.bwd.kv_block"}}},
      {"grouped_matmul",
       {"cpu", {"gmm.gmm", "gmm.gmm.item", "gmm.tgmm", "gmm.tgmm.item", "gmm.gemm", "gmm.pack"}}},
  };
  // cpu_v2 converts a bf16 w to f32 once per gradient call, unless bf16 takes the dot route
  // (AVX512-BF16: a Zen 4 reads bf16 w directly, and no conversion runs).
  std::map<std::string, std::set<std::string>> unless_bf16_dot = {{"linear_cross_entropy", {"lce.convert_w"}}};
  for (auto [kernel, spec] : want) {
    if (!cpu_bf16_gemm::available()) spec.second.merge(unless_bf16_dot[kernel]);
    const std::string out = p(kernel + ".trace.json");
    const Cmd c = cli_test::run_cli("bench " + kernel + " --grid smoke --dtype f32,bf16 --impl " + spec.first +
                                    " --repeats 1 --max-seconds 0.05 --no-gemm --no-roofline -q --trace " + out);
    ASSERT_EQ(c.code, 0) << c.out;
    EXPECT_NE(c.out.find("wrote " + out), std::string::npos) << c.out;
    const json doc = read_json(out);
    const auto names = scope_names(doc);
    for (const std::string& n : spec.second) EXPECT_GT(names.count(n), 0u) << kernel << ": no '" << n << "' scope";
    // The driver's row scopes: "<implementation> <pass> <shape> <dtype>".
    EXPECT_GT(names.count("cpu forward small f32"), 0u) << kernel;
    EXPECT_GT(names.count("cpu fused tiny bf16"), 0u) << kernel;
    EXPECT_EQ(doc.at("otherData").at("dropped"), 0) << kernel;
    EXPECT_TRUE(nests_per_track(doc)) << kernel << ": scopes partly overlap on a track";
    EXPECT_EQ(doc.at("otherData").at("events").get<size_t>(), names.size()) << kernel;
  }
}

TEST_F(BenchTrace, KernelScopesNestInsideTheirRowOnTheCallingThread) {
  const std::string out = p("t.json");
  const Cmd c = cli_test::run_cli("bench grouped_matmul --shape 256,64,128,4 --impl cpu --pass forward --repeats 1 "
                                  "--threads 1 --no-gemm --no-roofline -q --trace " + out);
  ASSERT_EQ(c.code, 0) << c.out;
  const json doc = read_json(out);
  json row, call;
  int items = 0;
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    if (e.at("name") == "cpu forward 256x64x128x4 f32") row = e;  // --shape names the case by its dims
    if (e.at("name") == "gmm.gmm" && call.is_null()) call = e;
    items += e.at("name") == "gmm.gmm.item";
    if (e.at("name") == "gmm.gmm.item") EXPECT_TRUE(e.at("args").contains("i")) << e.dump();  // the group
  }
  ASSERT_FALSE(row.is_null()) << doc.dump();
  ASSERT_FALSE(call.is_null()) << doc.dump();
  EXPECT_EQ(call.at("tid"), row.at("tid"));
  EXPECT_GE(call.at("ts").get<double>(), row.at("ts").get<double>());
  EXPECT_LE(call.at("ts").get<double>() + call.at("dur").get<double>(),
            row.at("ts").get<double>() + row.at("dur").get<double>() + 1e-3);
  EXPECT_GE(items, 4);  // one item per group at least, per call
}

// --memory-budget-mib reaches the call (ExecOptions::memory_budget) and the JSON's settings: a bf16
// fused LCE whose f32 dw accumulator (4·64·8192 bytes = 2 MiB) exceeds 1 MiB runs its gradients
// in vocabulary slices (the trace's lce.vocab_slices scope), and without the flag it does not.
TEST_F(BenchTrace, AMemoryBudgetReachesTheCallAndTheSettings) {
  auto run = [&](const std::string& flag) {
    const Cmd c = cli_test::run_cli("bench linear_cross_entropy --shape 16,64,8192 --dtype bf16 --impl cpu --pass fused "
                                    "--repeats 1 --threads 1 --no-gemm --no-roofline -q " + flag + " --trace " +
                                    p("t.json") + " --json " + p("b.json"));
    EXPECT_EQ(c.code, 0) << c.out;
    int slices = 0;
    const json trace = read_json(p("t.json"));  // (a temporary's member would dangle in the loop)
    for (const json& e : trace.at("traceEvents")) slices += e.at("name") == "lce.vocab_slices";
    return std::pair{slices, read_json(p("b.json")).at("settings").at("memory_budget_mib").get<int64_t>()};
  };
  const auto [with, budget] = run("--memory-budget-mib 1");
  EXPECT_GE(with, 1);
  EXPECT_EQ(budget, 1);
  const auto [without, none] = run("");
  EXPECT_EQ(without, 0);
  EXPECT_EQ(none, 0);
  for (const std::string sub : {"bench linear_cross_entropy", "run linear_cross_entropy --x x.npy --w w.npy --labels y.npy"})
    for (const std::string value : {"-1", "2000000000"}) {  // below 0; past 1 PiB (MiB << 20 would wrap)
      const Cmd bad = cli_test::run_cli(sub + " --memory-budget-mib " + value);
      EXPECT_EQ(bad.code, 2) << sub << " " << value << ": " << bad.out;
      EXPECT_NE(bad.out.find("--memory-budget-mib"), std::string::npos) << sub << " " << value << ": " << bad.out;
    }
}

TEST_F(BenchTrace, TheEventCapDropsAndSaysSo) {
  const std::string out = p("t.json");
  const Cmd c = cli_test::run_cli("bench grouped_matmul --grid smoke --impl cpu --repeats 1 --no-gemm --no-roofline "
                                  "-q --trace-max-events 3 --trace " + out);
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("dropped past --trace-max-events 3"), std::string::npos) << c.out;
  const json doc = read_json(out);
  EXPECT_EQ(scope_names(doc).size(), 3u);
  EXPECT_GT(doc.at("otherData").at("dropped").get<int>(), 0);
}
#endif

TEST_F(BenchTrace, BadTraceArgumentsAreUsageErrors) {
  Cmd c = cli_test::run_cli("bench grouped_matmul --predict --trace " + p("t.json"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("--predict runs nothing"), std::string::npos) << c.out;
  c = cli_test::run_cli("bench grouped_matmul --trace-max-events 0 --no-roofline -q --trace " + p("t.json"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_FALSE(fs::exists(p("t.json")));
}

// Inputs of this shape would take 160 GiB (f32: M·K + G·K·N + M·N = 10·2^32 floats): a
// prediction that allocated them would fail or take minutes.
TEST_F(BenchTrace, PredictPrintsTheRooflineTimeOfAHugeShapeWithoutRunningIt) {
  const auto t0 = std::chrono::steady_clock::now();
  const Cmd c = cli_test::run_cli("bench grouped_matmul --shape 65536,65536,65536,8 --impl reference --predict "
                                  "--roofline " + p("roof.json") + " --json " + p("pred.json"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_LT(seconds, 30.0) << "a prediction runs nothing";
  EXPECT_NE(c.out.find("predicted ms"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("nothing was run"), std::string::npos) << c.out;
  const json doc = read_json(p("pred.json"));
  EXPECT_EQ(doc.at("schema"), "tessera-predict/1");
  // Forward: 2·M·K·N = 2^49 FLOPs at 100 GFLOP/s = 5.6295e6 ms; bytes 10·2^32·4 at 10 GB/s =
  // 1.718e4 ms: compute-bound. Backward and fused issue two and three such products.
  const double f = std::ldexp(1.0, 49), bytes = 10.0 * std::ldexp(1.0, 32) * 4.0;
  const std::map<std::string, double> products = {{"forward", 1}, {"backward", 2}, {"fused", 3}};
  int seen = 0;
  for (const json& r : doc.at("rows")) {
    ASSERT_EQ(r.at("kind"), "prediction") << r.dump();
    if (r.at("mode") == "gemm") {
      EXPECT_NEAR(r.at("predicted_ms").get<double>(), f / 100e9 * 1e3, 1e-6 * f / 100e9 * 1e3) << r.dump();
      continue;
    }
    const double n = products.at(r.at("mode").get<std::string>());
    EXPECT_NEAR(r.at("gflop_issued").get<double>(), n * f / 1e9, 1e-9 * n * f / 1e9) << r.dump();
    EXPECT_NEAR(r.at("mbytes_min").get<double>(), n * bytes / 1e6, 1e-9 * n * bytes / 1e6) << r.dump();
    EXPECT_NEAR(r.at("predicted_ms").get<double>(), n * f / 100e9 * 1e3, 1e-9 * n * f / 100e9 * 1e3) << r.dump();
    EXPECT_NEAR(r.at("memory_ms").get<double>(), n * bytes / 10e9 * 1e3, 1e-9 * n * bytes / 10e9 * 1e3) << r.dump();
    EXPECT_EQ(r.at("bound"), "compute");
    EXPECT_EQ(r.at("M"), 65536);
    ++seen;
  }
  EXPECT_EQ(seen, 3);  // forward, backward, fused (the reference: built in every configuration)
}

TEST_F(BenchTrace, PredictCoversEveryKernelAndSaysWhenNoCeilingsAreStored) {
  for (const std::string args : {"linear_cross_entropy --shape 65536,16384,262144 --dtype bf16",
                                 "attention --shape 64,65536,64,128 --causal"}) {
    Cmd c = cli_test::run_cli("bench " + args + " --impl reference --predict --roofline " + p("roof.json"));
    ASSERT_EQ(c.code, 0) << c.out;
    EXPECT_NE(c.out.find("compute"), std::string::npos) << c.out;  // a bound was predicted
    c = cli_test::run_cli("bench " + args + " --impl reference --predict --roofline " + p("none.json"));
    ASSERT_EQ(c.code, 0) << c.out;
    EXPECT_NE(c.out.find("no ceilings stored at " + p("none.json")), std::string::npos) << c.out;
  }
}

}  // namespace
}  // namespace tessera
