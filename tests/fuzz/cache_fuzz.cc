// Fuzz target: autotune cache entries. The input is written as the cache file of one key and
// read back through lookup_or_autotune (DiskCache::read, entry_from_json, the entry's use), the
// path every kernel call with autotune-on-miss takes. A bad entry must be ignored (a sweep
// runs and rewrites it) or trusted only when it is valid; never an escaped exception.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_util.h"
#include "tessera/error.h"
#include "tune/autotune.h"
#include "tune/cache.h"

namespace {

const std::string& cache_dir() {
  static const std::string dir = [] {
    // tmpfs when there is one: every rewritten entry is fsynced.
    namespace fs = std::filesystem;
    const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    static std::string d = (base / ("tessera-cache-fuzz-" + std::to_string(::getpid()))).string();
    fs::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(d, ec);
    });
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::tune;
  static const char* quiet = [] {
    ::setenv("TESSERA_LOG_LEVEL", "error", 1);  // the warnings for corrupt entries are expected
    return "";
  }();
  (void)quiet;
  const DiskCache cache(cache_dir(), "0.1.0");
  AutotuneRequest req;
  req.prefix = "linear_cross_entropy.cpu";
  req.key = "linear_cross_entropy|cpu|cpu:x86|f32|B=8,H=16,V=64|0.1.0";
  req.candidates = {{{"b", 8}, {"h", 16}, {"v", 64}}, {{"b", 4}, {"h", 16}, {"v", 32}}};
  req.make_run = [] { return RunFn([](const Params& p) { return p.empty() ? 1.0 : 1e-3 * static_cast<double>(p[0].second); }); };
  req.policy.warmup = 0;
  req.policy.repeats = 1;
  const std::string path = cache.path_for(req.prefix, req.key);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  clear_autotune_memo();
  try {
    const AutotuneResult r = lookup_or_autotune(cache, req);
    // A trusted entry must name one of the candidates' shapes of parameters.
    if (r.kind == AutotuneResult::Kind::kFound && r.params.empty()) __builtin_trap();
  } catch (const tessera::Error&) {
  }
  return 0;
}
