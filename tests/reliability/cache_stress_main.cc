// Helper for the multi-process autotune cache tests (concurrency_test.cc, interrupt_test.cc).
//
//   tessera_cache_stress tune DIR KEYS ROUNDS [FIRST]   autotune KEYS keys (numbered from FIRST,
//        default 0) ROUNDS times into DIR; each result must be the planted winner, and each entry
//        on disk, when there is one, must be complete and right. Exit 0 when every check held, 1
//        (with a message) otherwise.
//   tessera_cache_stress delete DIR             delete every file in DIR, over and over, until
//        killed (SIGTERM).
//   tessera_cache_stress slow DIR               one autotune whose candidates take 60 s each
//        (to be killed mid-sweep); prints "sweeping" once the sweep has started.
//
// The sweep's RunFn returns planted times (candidate i of key k costs 1 ms when i == k % 3,
// else 2 ms + i µs), so every process, whatever it read or tuned, must end with the same winner.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <chrono>
#include <thread>

#include "tessera/error.h"
#include "tune/autotune.h"
#include "tune/cache.h"

namespace {

using namespace tessera::tune;

constexpr int kCandidates = 3;

std::string key_of(int k) { return "stress|cpu|f32|key=" + std::to_string(k) + "|0.1.0"; }
Params candidate(int i) { return {{"b", 16 << i}, {"v", 64}}; }
Params winner(int k) { return candidate(k % kCandidates); }

AutotuneRequest request(int k) {
  AutotuneRequest r;
  r.prefix = "stress.cpu";
  r.key = key_of(k);
  for (int i = 0; i < kCandidates; ++i) r.candidates.push_back(candidate(i));
  r.make_run = [k] {
    return RunFn([k](const Params& p) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // widen the race windows
      for (int i = 0; i < kCandidates; ++i)
        if (p == candidate(i)) return i == k % kCandidates ? 1e-3 : 2e-3 + 1e-6 * i;
      return 1.0;
    });
  };
  r.policy.warmup = 0;
  r.policy.repeats = 1;
  r.policy.min_repeats = 1;
  return r;
}

[[noreturn]] void fail(const std::string& m) {
  std::fprintf(stderr, "tessera_cache_stress[%d]: %s\n", static_cast<int>(::getpid()), m.c_str());
  std::exit(1);
}

// The file on disk, if any, must be one complete entry for this key with the planted winner.
void check_file(const DiskCache& cache, const AutotuneRequest& req, int k) {
  const std::string path = cache.path_for(req.prefix, req.key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return;  // deleted meanwhile, or not written yet
  std::stringstream ss;
  ss << in.rdbuf();
  CacheEntry e;
  try {
    e = entry_from_json(nlohmann::json::parse(ss.str()));
  } catch (const std::exception& ex) {
    fail("torn or corrupt entry " + path + ": " + ex.what() + "\n" + ss.str());
  }
  if (e.key != req.key) fail("entry " + path + " has key " + e.key);
  if (e.negative || e.params != winner(k)) fail("entry " + path + " has the wrong winner " + params_str(e.params));
}

int tune(const std::string& dir, int keys, int rounds, int first) {
  const DiskCache cache(dir, "0.1.0");
  for (int round = 0; round < rounds; ++round) {
    for (int k = first; k < first + keys; ++k) {
      clear_autotune_memo();  // every lookup goes to the disk (or tunes)
      const AutotuneRequest req = request(k);
      const AutotuneResult r = lookup_or_autotune(cache, req);
      if (r.kind != AutotuneResult::Kind::kFound)
        fail("key " + std::to_string(k) + ": no result (" + r.detail + ")");
      if (r.params != winner(k))
        fail("key " + std::to_string(k) + ": wrong winner " + params_str(r.params) + " from " + r.source);
      check_file(cache, req, k);
    }
  }
  return 0;
}

int del(const std::string& dir) {
  namespace fs = std::filesystem;
  for (;;) {
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) fs::remove(it->path(), ec);
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

int slow(const std::string& dir) {
  const DiskCache cache(dir, "0.1.0");
  AutotuneRequest req = request(0);
  req.make_run = [] {
    std::printf("sweeping\n");
    std::fflush(stdout);
    return RunFn([](const Params&) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 1e-3;
    });
  };
  lookup_or_autotune(cache, req);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ::setenv("TESSERA_LOG_LEVEL", "error", 1);  // deleted temp files make expected warnings
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "tune" && (argc == 5 || argc == 6))
      return tune(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), argc == 6 ? std::atoi(argv[5]) : 0);
    if (mode == "delete" && argc == 3) return del(argv[2]);
    if (mode == "slow" && argc == 3) return slow(argv[2]);
  } catch (const tessera::Error& e) {
    fail(std::string("tessera::Error: ") + e.what());
  }
  std::fprintf(stderr, "usage: tessera_cache_stress tune DIR KEYS ROUNDS [FIRST] | delete DIR | slow DIR\n");
  return 2;
}
