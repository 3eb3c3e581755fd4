// Contention: several processes autotuning the same keys into one cache directory while another
// deletes entries; several threads calling linear_cross_entropy on different inputs at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "harness/npy.h"
#include "reliability/process_util.h"
#include "reliability/test_util.h"
#include "tessera/linear_cross_entropy.h"
#include "tune/cache.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
namespace lce = linear_cross_entropy;
using reliability::TempDir;

// Four tuner processes × 8 keys × 20 rounds (every lookup bypasses the in-process memo, so each
// one reads the disk or tunes and writes), and a deleter removing every file it sees, entries and
// in-flight temp files alike. Each tuner checks every result and every entry it finds on disk
// (tessera_cache_stress tune); afterwards every file left must be a whole, right entry.
TEST(CacheConcurrency, ProcessesTuningAndDeletingNeverSeeATornOrWrongEntry) {
  TempDir dir("stress");
  const std::string bin = TESSERA_CACHE_STRESS_PATH;
  const pid_t deleter = reliability::spawn({bin, "delete", dir.str()});
  ASSERT_GT(deleter, 0);
  std::vector<pid_t> tuners;
  for (int i = 0; i < 4; ++i) {
    const pid_t p = reliability::spawn({bin, "tune", dir.str(), "8", "20"}, dir.str() + "-" + std::to_string(i) + ".log");
    ASSERT_GT(p, 0);
    tuners.push_back(p);
  }
  for (size_t i = 0; i < tuners.size(); ++i) {
    const int rc = reliability::wait_for(tuners[i]);
    EXPECT_EQ(rc, 0) << reliability::read_file(dir.str() + "-" + std::to_string(i) + ".log.err");
  }
  ::kill(deleter, SIGTERM);
  reliability::wait_for(deleter);
  // One more round with no deleter: every key is written and every entry is whole.
  EXPECT_EQ(reliability::wait_for(reliability::spawn({bin, "tune", dir.str(), "8", "1"})), 0);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << "temp file left: " << name;
    ++entries;
  }
  EXPECT_EQ(entries, 8);
  for (int i = 0; i < 4; ++i) {
    fs::remove(dir.str() + "-" + std::to_string(i) + ".log");
    fs::remove(dir.str() + "-" + std::to_string(i) + ".log.err");
  }
}

// ANCHORS (Levanter: one shared JSON cache file, concurrent writers of different keys overwrote
// each other's entries). Four processes at once, each tuning 16 keys of its own into one
// directory: all 64 entries are there afterwards, each whole, for its own key (the tuners check
// each winner themselves).
TEST(CacheConcurrency, WritersOfDifferentKeysLoseNothing) {
  TempDir dir("distinct");
  const std::string bin = TESSERA_CACHE_STRESS_PATH;
  std::vector<pid_t> tuners;
  for (int i = 0; i < 4; ++i)
    tuners.push_back(reliability::spawn({bin, "tune", dir.str(), "16", "1", std::to_string(16 * i)},
                                        dir.str() + "-" + std::to_string(i) + ".log"));
  for (size_t i = 0; i < tuners.size(); ++i)
    EXPECT_EQ(reliability::wait_for(tuners[i]), 0) << reliability::read_file(dir.str() + "-" + std::to_string(i) + ".log.err");
  std::vector<std::string> keys;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    const auto entry = tune::entry_from_json(nlohmann::json::parse(reliability::read_file(e.path().string())));
    EXPECT_FALSE(entry.negative) << entry.key;
    keys.push_back(entry.key);
  }
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(std::unique(keys.begin(), keys.end()), keys.end());
  EXPECT_EQ(keys.size(), 64u);
  for (int k = 0; k < 64; ++k)
    EXPECT_TRUE(std::binary_search(keys.begin(), keys.end(), "stress|cpu|f32|key=" + std::to_string(k) + "|0.1.0"))
        << "key " << k << " lost";
  for (int i = 0; i < 4; ++i) {
    fs::remove(dir.str() + "-" + std::to_string(i) + ".log");
    fs::remove(dir.str() + "-" + std::to_string(i) + ".log.err");
  }
}

#ifdef TESSERA_CLI_PATH
// The same through the real kernel path: `tessera run linear_cross_entropy` processes, with the
// tuned table off and autotune-on-miss on, all missing the same key in one cache directory at
// once while the directory is being emptied, then a second wave that reads what the first left.
// Every process succeeds with the same loss (block sizes may differ, the loss may not beyond
// rounding), and the directory ends with one whole entry for the key.
TEST(CacheConcurrency, TesseraRunProcessesAutotuningOneKey) {
  bool have_cpu = false;
  for (const auto& info : lce::implementations()) have_cpu |= info.name == "cpu" && info.available;
  if (!have_cpu) GTEST_SKIP() << "no cpu backend in this build";
  TempDir dir("run-autotune");
  const int64_t B = 128, H = 64, V = 8192;  // B·H·V = 2^26, the smallest problem worth autotuning
  Tensor x = Tensor::empty(DType::kF32, {B, H}), w = Tensor::empty(DType::kF32, {H, V});
  Tensor y = Tensor::empty(DType::kI64, {B});
  for (int64_t i = 0; i < B * H; ++i) x.data_as<float>()[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  for (int64_t i = 0; i < H * V; ++i) w.data_as<float>()[i] = static_cast<float>((i * 53) % 97) / 97.0f - 0.5f;
  for (int64_t i = 0; i < B; ++i) y.data_as<int64_t>()[i] = (i * 311) % V;
  npy::save(dir.file("x.npy"), x.view());
  npy::save(dir.file("w.npy"), w.view());
  npy::save(dir.file("y.npy"), y.view());
  const std::string cache = dir.file("cache");
  reliability::ScopedEnv e1("TESSERA_AUTOTUNE", "1"), e2("TESSERA_TUNED_TABLE", "0"), e3("TESSERA_CACHE_DIR", cache),
      e4("TESSERA_AUTOTUNE_BUDGET_MS", "400"), e5("TESSERA_LOG_LEVEL", "error");
  auto run = [&](int i) {
    return reliability::spawn({TESSERA_CLI_PATH, "run", "linear_cross_entropy", "--x", dir.file("x.npy"), "--w",
                               dir.file("w.npy"), "--labels", dir.file("y.npy"), "--impl", "cpu", "--threads", "1",
                               "--out", dir.file("out" + std::to_string(i))},
                              dir.file("run" + std::to_string(i) + ".log"));
  };
  const pid_t deleter = reliability::spawn({TESSERA_CACHE_STRESS_PATH, "delete", cache});
  std::vector<pid_t> wave;
  for (int i = 0; i < 4; ++i) wave.push_back(run(i));
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(reliability::wait_for(wave[static_cast<size_t>(i)]), 0) << reliability::read_file(dir.file("run" + std::to_string(i) + ".log.err"));
  ::kill(deleter, SIGTERM);
  reliability::wait_for(deleter);
  wave.clear();
  for (int i = 4; i < 6; ++i) wave.push_back(run(i));
  for (int i = 4; i < 6; ++i)
    EXPECT_EQ(reliability::wait_for(wave[static_cast<size_t>(i - 4)]), 0) << reliability::read_file(dir.file("run" + std::to_string(i) + ".log.err"));

  const float loss0 = npy::load(dir.file("out0/loss.npy")).data_as<float>()[0];
  for (int i = 1; i < 6; ++i)
    EXPECT_NEAR(npy::load(dir.file("out" + std::to_string(i) + "/loss.npy")).data_as<float>()[0], loss0, 1e-5 * std::fabs(loss0));
  int entries = 0;
  for (const auto& f : fs::directory_iterator(cache)) {
    ++entries;
    const auto entry = tune::entry_from_json(nlohmann::json::parse(reliability::read_file(f.path().string())));
    EXPECT_FALSE(entry.negative);
    EXPECT_NE(entry.key.find("linear_cross_entropy"), std::string::npos) << entry.key;
  }
  EXPECT_EQ(entries, 1);
}
#endif

// Deterministic inputs of one shape.
struct Problem {
  Tensor x, w, labels, bias;
  Problem(int64_t B, int64_t H, int64_t V, uint32_t seed) {
    x = Tensor::empty(DType::kF32, {B, H});
    w = Tensor::empty(DType::kF32, {H, V});
    labels = Tensor::empty(DType::kI64, {B});
    bias = Tensor::empty(DType::kF32, {V});
    uint32_t s = seed;
    auto next = [&] {
      s = s * 1664525u + 1013904223u;
      return static_cast<float>(s >> 8) / 16777216.0f - 0.5f;
    };
    for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = next();
    for (int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = 0.5f * next();
    for (int64_t i = 0; i < V; ++i) bias.data_as<float>()[i] = 0.1f * next();
    for (int64_t i = 0; i < B; ++i) labels.data_as<int64_t>()[i] = (i * 7 + seed) % V;
    labels.data_as<int64_t>()[B / 2] = -100;  // an ignored row
  }
  lce::Inputs inputs() const {
    lce::Inputs in;
    in.x = x.view();
    in.w = w.view();
    in.labels = labels.view();
    in.bias = bias.view();
    return in;
  }
};

std::string bytes_of(const lce::Result& r) {
  std::string s;
  for (const Tensor* t : {&r.loss, &r.lse, &r.dx, &r.dw, &r.dbias})
    s.append(static_cast<const char*>(t->data()), t->view().nbytes());
  return s;
}

// The API is re-entrant: the same kernel on different inputs from several threads at once gives
// bit-for-bit what one call at a time gives, for the reference and the cpu backend (which runs
// its own worker threads inside each call).
TEST(LceConcurrency, ThreadsGiveTheSameBitsAsSerialCalls) {
  std::vector<Problem> problems;
  problems.emplace_back(33, 40, 301, 1);
  problems.emplace_back(64, 24, 517, 2);
  problems.emplace_back(7, 64, 1000, 3);
  problems.emplace_back(50, 16, 129, 4);
  std::vector<std::string> impls = {"reference"};
  for (const auto& info : lce::implementations())
    if (info.name == "cpu" && info.available) impls.push_back("cpu");

  auto run = [&](size_t p, const std::string& impl) {
    lce::Options opt;
    opt.implementation = impl;
    opt.num_threads = 2;
    opt.z_loss_weight = 1e-4;
    opt.label_smoothing = 0.1;
    return lce::compute_with_grad(problems[p].inputs(), opt);
  };
  std::vector<std::vector<std::string>> serial(impls.size());
  for (size_t i = 0; i < impls.size(); ++i)
    for (size_t p = 0; p < problems.size(); ++p) serial[i].push_back(bytes_of(run(p, impls[i])));

  std::atomic<int> mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep)
        for (size_t k = 0; k < problems.size(); ++k) {
          const size_t p = (k + static_cast<size_t>(t)) % problems.size();  // different inputs at once
          const size_t i = (k + static_cast<size_t>(rep + t)) % impls.size();
          try {
            const lce::Result r = run(p, impls[i]);
            if (bytes_of(r) != serial[i][p] || r.implementation != impls[i]) ++mismatches;
          } catch (const std::exception&) {
            ++errors;
          }
        }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(errors.load(), 0);
}

}  // namespace
}  // namespace tessera
