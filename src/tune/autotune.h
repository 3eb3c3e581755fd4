// Tessera internal (tuning): autotune-on-miss with the persistent cache.
//
// lookup_or_autotune(cache, request): an in-process memo, then the disk cache, then a sweep of
// the request's candidates with its RunFn under a time budget; the result (the fastest viable
// candidate, or a negative entry when every candidate failed) is written to the cache and
// memoized. Tuning is serialized within a process (timings taken side by side would disturb
// each other); across processes the last atomic write wins, and every winner is a valid answer.
// Kernel-agnostic: the kernel builds the key, the candidates and the RunFn.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tune/cache.h"
#include "tune/sweep.h"

namespace tessera::tune {

struct AutotuneRequest {
  std::string prefix;  // cache file name prefix, e.g. "linear_cross_entropy.cpu"
  std::string key;     // the full key (see cache.h)
  std::vector<Params> candidates;
  // Builds the Runner (allocating its scratch) only when a sweep is needed. An exception from
  // it propagates (it is not a candidate's failure); one from the RunFn fails that candidate.
  // With outputs, a candidate whose results differ from the default's is never chosen.
  std::function<Runner()> make_run;
  SweepPolicy policy;
};

struct AutotuneResult {
  enum class Kind {
    kFound,         // `params` is the winner
    kNegative,      // every candidate failed: the implementation cannot run this problem
    kInconclusive,  // nothing measured (e.g. the budget ran out on failures): use defaults
  } kind = Kind::kInconclusive;
  Params params;
  std::string source;  // "autotune" (tuned now), "autotune cache" (disk or memo)
  std::string detail;  // failures (negative), or a summary for the debug log
  std::string path;    // the cache file
};

AutotuneResult lookup_or_autotune(const DiskCache& cache, const AutotuneRequest& req);

// Forgets the in-process memo (tests; a process that changed its cache directory).
void clear_autotune_memo();

// Summary of a sweep as the JSON list stored in cache entries and raw records.
nlohmann::json measurements_to_json(const std::vector<Measurement>& ms);

}  // namespace tessera::tune
