// core/files: atomic whole-file writes with temp names unique across threads.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/files.h"
#include "tessera/error.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("tessera_files_test_" + name + "_" +
                                                   std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  fs::remove_all(d);
  return d;
}

TEST(Files, TempNamesAreUniqueAcrossThreads) {
  std::vector<std::vector<std::string>> names(4);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] { for (int i = 0; i < 200; ++i) names[t].push_back(files::unique_temp_name("x")); });
  for (auto& t : ts) t.join();
  std::set<std::string> all;
  for (const auto& v : names) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), 800u);
  EXPECT_EQ(all.begin()->rfind("x.tmp.", 0), 0u);
}

TEST(Files, WriteCreatesParentsReplacesAndLeavesNoTempFile) {
  const fs::path d = fresh_dir("write");
  const fs::path p = d / "a" / "b.txt";
  files::write_atomically(p.string(), "first");
  files::write_atomically(p.string(), "second, longer");
  EXPECT_EQ(slurp(p), "second, longer");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(p.parent_path())) ++entries;
  EXPECT_EQ(entries, 1);
  fs::remove_all(d);
}

// Threads writing one path at once: the file always ends whole (one writer's full text), and no
// temp file is left behind (with pid-only temp names two threads shared one temp file).
TEST(Files, ConcurrentWritersOfOnePathLeaveOneWholeFile) {
  const fs::path d = fresh_dir("race");
  const fs::path p = d / "out.json";
  std::vector<std::string> texts;
  for (int t = 0; t < 4; ++t) texts.push_back(std::string(100000 + t, static_cast<char>('a' + t)));
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] { for (int i = 0; i < 20; ++i) files::write_atomically(p.string(), texts[t]); });
  for (auto& t : ts) t.join();
  const std::string got = slurp(p);
  bool whole = false;
  for (const auto& t : texts) whole = whole || got == t;
  EXPECT_TRUE(whole) << "size " << got.size();
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(d)) ++entries;
  EXPECT_EQ(entries, 1);
  fs::remove_all(d);
}

TEST(Files, UnwritablePlaceIsAnIoErrorNamingThePath) {
  const fs::path d = fresh_dir("bad");
  fs::create_directories(d);
  const fs::path blocker = d / "file";
  files::write_atomically(blocker.string(), "x");
  const std::string target = (blocker / "sub.txt").string();  // a file where a directory must be
  try {
    files::write_atomically(target, "y");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find(target), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

}  // namespace
}  // namespace tessera
