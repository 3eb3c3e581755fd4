// Tessera internal (tuning): timing a bounded set of candidates.
//
// A kernel hands the sweep its candidates and a RunFn that runs the kernel once with one
// candidate and returns the elapsed seconds (real timing, or a planted cost in tests). The sweep
// does the rest: first call timed apart, warm-up, median of repeats, failures recorded and
// skipped, a total time budget.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tune/params.h"

namespace tessera::tune {

// Runs one call with `candidate` and returns its duration in seconds (synchronized: the work
// is done when it returns). Throws (tessera::Error or anything else) when the candidate cannot
// run; the exception's message becomes the failure reason.
using RunFn = std::function<double(const Params& candidate)>;

struct SweepPolicy {
  int warmup = 1;       // untimed runs after the first call
  int repeats = 5;      // timed runs; the median is the score
  int min_repeats = 1;  // when the budget runs short, at least this many timed runs
  double budget_s = 0;  // total seconds of measured run time for the sweep; 0 = unlimited
};

struct Measurement {
  Params candidate;
  enum class Status { kOk, kFailed, kSkipped } status = Status::kOk;
  double first_call_ms = 0;  // the candidate's first run (cold caches, lazy set-up)
  double median_ms = 0;      // median of the timed runs (kOk only)
  double min_ms = 0;
  int runs = 0;              // timed runs behind median_ms
  std::string failure;       // why it failed or was skipped
  bool ok() const { return status == Status::kOk; }
};
const char* status_name(Measurement::Status s) noexcept;  // "ok", "failed", "skipped"

struct SweepResult {
  std::vector<Measurement> measurements;  // one per candidate, in candidate order
  int best = -1;                          // index of the fastest ok candidate, -1 if none
  double spent_s = 0;                     // measured run time used
  bool budget_exhausted = false;          // some candidates were skipped for the budget
};

// Called after each candidate (for progress display): index, measurement, best so far (-1).
using SweepObserver = std::function<void(size_t index, const Measurement& m, int best)>;
// Called before each candidate starts.
using SweepStart = std::function<void(size_t index, const Params& candidate)>;

// Times every candidate in order. Budget: a candidate is skipped once the measured time spent
// reaches the budget; a started candidate takes its first call, then warm-up and repeats while
// the budget lasts (at least min_repeats timed runs). Ties go to the earlier candidate.
SweepResult sweep(const std::vector<Params>& candidates, const RunFn& run,
                  const SweepPolicy& policy, const SweepStart& on_start = {},
                  const SweepObserver& on_done = {});

double median(std::vector<double> v);

}  // namespace tessera::tune
