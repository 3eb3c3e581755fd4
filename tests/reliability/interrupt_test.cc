// Interruption: `tessera tune` killed mid-sweep (SIGKILL, SIGINT) leaves no partial results and
// no partial or changed tuned table, and a rerun completes; an autotune-on-miss killed mid-sweep
// leaves no cache entry, and the next lookup tunes again.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "reliability/process_util.h"
#include "reliability/test_util.h"
#include "tessera/linear_cross_entropy.h"
#include "tune/autotune.h"
#include "tune/cache.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using reliability::TempDir;

int count_files(const fs::path& dir) {
  int n = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    n += it->is_regular_file() ? 1 : 0;
  return n;
}

// Waits until `path` has some bytes (the child has started its sweep), up to `seconds`.
bool wait_for_output(const std::string& path, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    std::error_code ec;
    if (fs::file_size(path, ec) > 0 && !ec) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

#ifdef TESSERA_CLI_PATH
TEST(TuneInterruption, KilledTuneLeavesNoPartialResultsOrTable) {
  bool have_cpu = false;  // the gpu preset builds no cpu backend: nothing to tune on the host
  for (const auto& info : tessera::linear_cross_entropy::implementations())
    have_cpu |= info.name == "cpu" && info.available;
  if (!have_cpu) GTEST_SKIP() << "no cpu backend in this build";
  TempDir dir("tune-kill");
  const std::string table = dir.file("tables/tuned_table.cc");
  fs::create_directories(dir.path / "tables");
  const std::string original = "// the table before the interrupted run\n";
  reliability::write_file(table, original);
  for (int sig : {SIGKILL, SIGINT}) {
    // A long sweep (50 timed runs per candidate), killed once it is under way.
    const std::string log = dir.file("tune-" + std::to_string(sig) + ".log");
    const pid_t p = reliability::spawn({TESSERA_CLI_PATH, "tune", "linear_cross_entropy", "--impl", "cpu",
                                        "--buckets", "small", "--dtype", "f32", "--repeats", "50",
                                        "--out", dir.file("results"), "--emit-table", "--table", table},
                                       log);
    ASSERT_GT(p, 0);
    ASSERT_TRUE(wait_for_output(log + ".err", 60)) << "no progress from tessera tune";
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(p, sig);
    EXPECT_EQ(reliability::wait_for(p), 128 + sig) << "tune finished before it was killed";
    EXPECT_EQ(count_files(dir.path / "results"), 0) << "partial raw results";
    EXPECT_EQ(reliability::read_file(table), original) << "table changed by an interrupted run";
    EXPECT_EQ(count_files(dir.path / "tables"), 1) << "temp file left beside the table";
  }
  // The rerun (a small shape, one run per candidate) completes and writes everything.
  const std::string log = dir.file("tune-rerun.log");
  const pid_t p = reliability::spawn({TESSERA_CLI_PATH, "tune", "linear_cross_entropy", "--impl", "cpu",
                                      "--buckets", "small", "--dtype", "f32", "--shape", "16,32,512",
                                      "--warmup", "0", "--repeats", "1", "--out", dir.file("results"),
                                      "--emit-table", "--table", table},
                                     log);
  ASSERT_EQ(reliability::wait_for(p), 0) << reliability::read_file(log + ".err");
  EXPECT_EQ(count_files(dir.path / "results"), 2);  // one .csv, one .json
  const std::string text = reliability::read_file(table);
  EXPECT_NE(text, original);
  EXPECT_NE(text.find("tuned_table"), std::string::npos);
  EXPECT_EQ(count_files(dir.path / "tables"), 1);
}
#endif

TEST(AutotuneInterruption, KilledSweepLeavesNoCacheEntry) {
  TempDir dir("autotune-kill");
  const std::string bin = TESSERA_CACHE_STRESS_PATH;
  const std::string log = dir.file("../" + dir.path.filename().string() + ".log");
  const pid_t p = reliability::spawn({bin, "slow", dir.str()}, log);
  ASSERT_GT(p, 0);
  ASSERT_TRUE(wait_for_output(log, 30));
  ::kill(p, SIGKILL);
  EXPECT_EQ(reliability::wait_for(p), 128 + SIGKILL);
  EXPECT_EQ(count_files(dir.path), 0);
  // The rerun finds no entry and tunes (here: the stress helper's planted winner for key 0).
  EXPECT_EQ(reliability::wait_for(reliability::spawn({bin, "tune", dir.str(), "1", "1"})), 0);
  EXPECT_EQ(count_files(dir.path), 1);
  fs::remove(log);
  fs::remove(log + ".err");
}

}  // namespace
}  // namespace tessera
