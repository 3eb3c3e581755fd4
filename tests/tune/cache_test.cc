// The persistent autotune cache: round trips, corrupt / foreign / mismatched files ignored with a
// warning, atomic writes under concurrent writers (threads and processes), persistence across
// processes (the child is this test binary run again), negative entries, the in-process memo.
// Every test uses its own temp directory, never the user's cache.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <new>
#include <stdexcept>
#include <thread>

#include "core/text.h"
#include "tessera/error.h"
#include "tune/autotune.h"
#include "tune/cache.h"
#include "tune/tune_test_util.h"

extern char** environ;

namespace tessera::tune {
namespace {

using testing_tune::LogCapture;
using testing_tune::ScopedEnv;
using testing_tune::TempDir;

const std::string kPrefix = "kern.impl";
const std::string kKey = "kern|impl=impl|device=test|dtype=f32|B<=64|H=8|V=16|version=" TESSERA_VERSION;

CacheEntry sample(int64_t b, size_t n_candidates = 3) {
  CacheEntry e;
  e.key = kKey;
  e.version = TESSERA_VERSION;
  e.params = {{"b", b}, {"h", 8}};
  e.median_ms = 1.25;
  e.created = "2026-01-01T00:00:00Z";
  for (size_t i = 0; i < n_candidates; ++i)
    e.candidates.push_back({{"candidate", "b=" + std::to_string(i)}, {"status", "ok"}, {"median_ms", 1.0 * i}});
  return e;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

size_t count_files(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) (void)e, ++n;
  return n;
}

TEST(TuneCache, DefaultDirFollowsEnv) {
  {
    ScopedEnv a("TESSERA_CACHE_DIR", "/x/y");
    EXPECT_EQ(default_cache_dir(), "/x/y");
  }
  ScopedEnv a("TESSERA_CACHE_DIR", nullptr);
  {
    ScopedEnv b("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(default_cache_dir(), "/xdg/tessera");
  }
  ScopedEnv b("XDG_CACHE_HOME", nullptr);
  ScopedEnv c("HOME", "/home/u");
  EXPECT_EQ(default_cache_dir(), "/home/u/.cache/tessera");
}

TEST(TuneCache, FileNameIsSafeAndHashed) {
  DiskCache c("/tmp/d");
  const std::string p = c.path_for("a/b c", "key with / and spaces");
  EXPECT_EQ(p.rfind("/tmp/d/a_b_c-", 0), 0u) << p;
  EXPECT_EQ(p.size(), std::string("/tmp/d/a_b_c-").size() + 16 + 5);
  EXPECT_NE(key_hash("a"), key_hash("b"));
  EXPECT_EQ(key_hash("a"), key_hash("a"));
}

TEST(TuneCache, RoundTrip) {
  TempDir d;
  DiskCache c(d.path() + "/sub/dir");  // created on write
  EXPECT_FALSE(c.read(kPrefix, kKey).has_value());
  c.write(kPrefix, sample(64));
  const auto e = c.read(kPrefix, kKey);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->params, (Params{{"b", 64}, {"h", 8}}));
  EXPECT_DOUBLE_EQ(e->median_ms, 1.25);
  EXPECT_EQ(e->candidates.size(), 3u);
  EXPECT_FALSE(e->negative);
  // The full key is stored inside the file.
  EXPECT_EQ(nlohmann::json::parse(slurp(c.path_for(kPrefix, kKey)))["key"], kKey);
  EXPECT_EQ(count_files(d.path() + "/sub/dir"), 1u);  // no temp files left behind
}

TEST(TuneCache, NegativeEntryRoundTrip) {
  TempDir d;
  DiskCache c(d.path());
  CacheEntry e = sample(0);
  e.negative = true;
  e.params.clear();
  c.write(kPrefix, e);
  const auto r = c.read(kPrefix, kKey);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->negative);
  EXPECT_EQ(nlohmann::json::parse(slurp(c.path_for(kPrefix, kKey)))["result"], "none");
}

TEST(TuneCache, CorruptFileIgnoredWithWarning) {
  TempDir d;
  DiskCache c(d.path());
  c.write(kPrefix, sample(64));
  const std::string path = c.path_for(kPrefix, kKey);
  for (const std::string bad : {std::string("{\"format\": \"tessera-tune-cache/1\", \"key\": "),  // truncated
                                std::string("not json at all"), std::string("[]"),
                                std::string("{\"format\": \"other/9\"}"),
                                [&] {
                                  auto j = nlohmann::json::parse(slurp(path));
                                  j["result"] = "maybe";
                                  return j.dump();
                                }(),
                                [&] {
                                  auto j = nlohmann::json::parse(slurp(path));
                                  j["params"]["b"] = "sixty-four";
                                  return j.dump();
                                }()}) {
    spit(path, bad);
    LogCapture log;
    EXPECT_FALSE(c.read(kPrefix, kKey).has_value()) << bad;
    EXPECT_NE(log.text().find("ignoring corrupt entry"), std::string::npos) << log.text();
  }
  // Raw bytes of a corrupt entry are quoted escaped: the warning stays valid UTF-8 text.
  spit(path, "\xff\xfe{\"format\"\x01");
  LogCapture log;
  EXPECT_FALSE(c.read(kPrefix, kKey).has_value());
  std::string warning = log.text();
  warning.erase(std::remove(warning.begin(), warning.end(), '\n'), warning.end());
  EXPECT_NE(warning.find("ignoring corrupt entry"), std::string::npos) << warning;
  EXPECT_EQ(text::printable(warning), warning) << warning;
}

TEST(TuneCache, ForeignVersionIgnoredWithWarning) {
  TempDir d;
  DiskCache old_version(d.path(), "0.0.1-old");
  CacheEntry e = sample(64);
  e.version = "0.0.1-old";
  old_version.write(kPrefix, e);  // same file name: the version inside is what is checked
  DiskCache c(d.path());
  LogCapture log;
  EXPECT_FALSE(c.read(kPrefix, kKey).has_value());
  EXPECT_NE(log.text().find("written by tessera 0.0.1-old"), std::string::npos) << log.text();
}

TEST(TuneCache, KeyMismatchIgnoredWithWarning) {
  TempDir d;
  DiskCache c(d.path());
  CacheEntry e = sample(64);
  e.key = "some other key that happens to share the file";
  const std::string text = entry_to_json(e).dump();
  std::filesystem::create_directories(d.path());
  spit(c.path_for(kPrefix, kKey), text);
  LogCapture log;
  EXPECT_FALSE(c.read(kPrefix, kKey).has_value());
  EXPECT_NE(log.text().find("whose key differs"), std::string::npos) << log.text();
}

TEST(TuneCache, UnwritableDirectoryThrowsIo) {
  TempDir d;
  spit(d.path() + "/file", "x");
  DiskCache c(d.path() + "/file/sub");  // a path under a regular file
  try {
    c.write(kPrefix, sample(1));
    FAIL() << "expected Error(kIo)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
  }
}

// Several threads and processes write the same key while a reader checks that every file it
// sees is complete and valid (the read never warns).
TEST(TuneCache, ConcurrentWritersAlwaysLeaveACompleteFile) {
  TempDir d;
  DiskCache c(d.path());
  constexpr int kProcs = 3, kThreads = 3, kWrites = 40;
  // Processes first (fork before this process starts threads).
  std::vector<pid_t> kids;
  for (int i = 0; i < kProcs; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        for (int k = 0; k < kWrites; ++k) c.write(kPrefix, sample(100 + i, 200));  // ~10 KB files
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);
    }
    kids.push_back(pid);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, bad{0};
  LogCapture log;
  std::thread reader([&] {
    while (!stop) {
      if (auto e = c.read(kPrefix, kKey)) {
        ++reads;
        const int64_t b = e->params.at(0).second;
        if (!((b >= 100 && b < 100 + kProcs) || (b >= 200 && b < 200 + kThreads))) ++bad;
        if (e->candidates.size() != 200) ++bad;
      }
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t)
    writers.emplace_back([&, t] {
      for (int k = 0; k < kWrites; ++k) c.write(kPrefix, sample(200 + t, 200));
    });
  for (auto& w : writers) w.join();
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  stop = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(log.text(), "");  // no read ever saw a corrupt file
  EXPECT_TRUE(nlohmann::json::accept(slurp(c.path_for(kPrefix, kKey))));
  EXPECT_EQ(count_files(d.path()), 1u);  // every temp file was renamed away
}

// ---- across processes: the child is this binary, run with a filter and an env var ----

const char* kChildDir = "TESSERA_TUNE_TEST_CHILD_DIR";

// Planted costs by b: 16 -> 3 ms, 32 -> 1 ms, 64 -> 2 ms.
RunFn planted() {
  return [](const Params& p) {
    switch (p.at(0).second) {
      case 16: return 0.003;
      case 32: return 0.001;
      default: return 0.002;
    }
  };
}

AutotuneRequest request(std::function<RunFn()> make_run) {
  AutotuneRequest r;
  r.prefix = kPrefix;
  r.key = kKey;
  r.candidates = {{{"b", 16}}, {{"b", 32}}, {{"b", 64}}};
  r.make_run = std::move(make_run);
  return r;
}

// Runs only as the child of CrossProcess.*: autotunes into the directory it was given.
TEST(TuneCacheChild, AutotuneIntoDir) {
  const char* dir = std::getenv(kChildDir);
  if (!dir) GTEST_SKIP() << "helper for TuneCacheCrossProcess (runs as a child process)";
  const AutotuneResult r = lookup_or_autotune(DiskCache(dir), request(planted));
  ASSERT_EQ(r.kind, AutotuneResult::Kind::kFound);
  // "autotune cache" when a sibling child process finished first.
  EXPECT_TRUE(r.source == "autotune" || r.source == "autotune cache") << r.source;
  EXPECT_EQ(r.params, (Params{{"b", 32}}));
}

int run_child(const std::string& filter, const std::string& dir) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string f = "--gtest_filter=" + filter;
  std::vector<char*> argv = {const_cast<char*>(self.c_str()), f.data(), nullptr};
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  env_s.push_back(std::string(kChildDir) + "=" + dir);
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(TuneCacheCrossProcess, ChildTunesParentReads) {
  TempDir d;
  ASSERT_EQ(run_child("TuneCacheChild.AutotuneIntoDir", d.path()), 0);
  clear_autotune_memo();
  bool timed = false;
  const AutotuneResult r = lookup_or_autotune(DiskCache(d.path()), request([&] {
    timed = true;  // must not happen: the child's result is on disk
    return planted();
  }));
  EXPECT_FALSE(timed);
  ASSERT_EQ(r.kind, AutotuneResult::Kind::kFound);
  EXPECT_EQ(r.source, "autotune cache");
  EXPECT_EQ(r.params, (Params{{"b", 32}}));
  const auto e = DiskCache(d.path()).read(kPrefix, kKey);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->candidates.size(), 3u);
  EXPECT_TRUE(e->complete);
}

TEST(TuneCacheCrossProcess, ConcurrentChildProcessesAgree) {
  TempDir d;
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int i = 0; i < 3; ++i)
    ts.emplace_back([&] {
      if (run_child("TuneCacheChild.AutotuneIntoDir", d.path()) != 0) ++failures;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(count_files(d.path()), 1u);
  LogCapture log;
  EXPECT_TRUE(DiskCache(d.path()).read(kPrefix, kKey).has_value());
  EXPECT_EQ(log.text(), "");
}

TEST(TuneAutotune, NegativeEntryWhenEverythingFails) {
  TempDir d;
  clear_autotune_memo();
  auto failing = [] { return RunFn([](const Params&) -> double { throw std::runtime_error("no"); }); };
  const AutotuneResult r = lookup_or_autotune(DiskCache(d.path()), request(failing));
  EXPECT_EQ(r.kind, AutotuneResult::Kind::kNegative);
  EXPECT_NE(r.detail.find("b=16: no"), std::string::npos) << r.detail;
  clear_autotune_memo();
  bool timed = false;
  const AutotuneResult again = lookup_or_autotune(DiskCache(d.path()), request([&] {
    timed = true;
    return planted();
  }));
  EXPECT_FALSE(timed);
  EXPECT_EQ(again.kind, AutotuneResult::Kind::kNegative);
  EXPECT_EQ(again.source, "autotune cache");
}

// Candidates that all fail for memory (std::bad_alloc, Error(kOutOfMemory)) say nothing of the
// candidates: no negative entry (it turned the implementation off for this shape in every later
// process), nothing memoized; the next call tunes again and finds its winner.
TEST(TuneAutotune, FailuresForMemoryAreNotCached) {
  TempDir d;
  DiskCache c(d.path());
  for (int kind = 0; kind < 2; ++kind) {
    clear_autotune_memo();
    auto short_of_memory = [kind] {
      return RunFn([kind](const Params& p) -> double {
        if (kind == 0) throw std::bad_alloc();
        if (*param(p, "b") == 16) throw Error(ErrorCode::kOutOfMemory, "scratch");
        throw std::runtime_error("too big");  // one for memory is enough
      });
    };
    const AutotuneResult r = lookup_or_autotune(c, request(short_of_memory));
    EXPECT_EQ(r.kind, AutotuneResult::Kind::kInconclusive) << r.detail;
    EXPECT_NE(r.detail.find("for memory"), std::string::npos) << r.detail;
    EXPECT_EQ(count_files(d.path()), 0u);
    const AutotuneResult later = lookup_or_autotune(c, request(planted));
    EXPECT_EQ(later.kind, AutotuneResult::Kind::kFound);
    EXPECT_EQ(later.source, "autotune");
    std::filesystem::remove(c.path_for(kPrefix, kKey));
  }
}

TEST(TuneAutotune, MemoAvoidsRereadingTheDisk) {
  TempDir d;
  clear_autotune_memo();
  DiskCache c(d.path());
  EXPECT_EQ(lookup_or_autotune(c, request(planted)).source, "autotune");
  std::filesystem::remove(c.path_for(kPrefix, kKey));
  const AutotuneResult r = lookup_or_autotune(c, request([]() -> RunFn { throw std::logic_error("re-tuned"); }));
  EXPECT_EQ(r.source, "autotune cache");
  EXPECT_EQ(r.params, (Params{{"b", 32}}));
}

TEST(TuneAutotune, UnwritableCacheStillReturnsTheWinner) {
  TempDir d;
  spit(d.path() + "/file", "x");
  clear_autotune_memo();
  LogCapture log;
  const AutotuneResult r = lookup_or_autotune(DiskCache(d.path() + "/file/sub"), request(planted));
  EXPECT_EQ(r.kind, AutotuneResult::Kind::kFound);
  EXPECT_EQ(r.params, (Params{{"b", 32}}));
  EXPECT_NE(log.text().find("kept for this process only"), std::string::npos) << log.text();
}

}  // namespace
}  // namespace tessera::tune
