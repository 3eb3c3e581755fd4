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
  int min_repeats = 1;  // when the budget runs short, still this many timed runs per candidate
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

// Progress: called after every run of the sweep. `done` of `total` runs (total counts the
// runs a failure or the budget cancelled, so done reaches total), the candidate that ran, the
// phase ("first call", "warm-up", "timed"), its seconds (< 0: it failed), and the best candidate
// so far by median of its timed runs (-1 while none has one) with that median in ms.
struct SweepTick {
  size_t done = 0, total = 0;
  size_t index = 0;
  const char* phase = "";
  double seconds = 0;
  int best = -1;
  double best_ms = 0;
};
using SweepObserver = std::function<void(const SweepTick&)>;
// Called before each run (index, phase).
using SweepStart = std::function<void(size_t index, const char* phase)>;

// Times the candidates interleaved, so that a change of machine load during the sweep shifts
// every candidate alike instead of deciding the ranking (a shared 2-core machine does that):
//   1. each candidate's first call, in order (its first_call_ms; a failure drops it);
//   2. `warmup` rounds of one untimed run per live candidate;
//   3. `repeats` rounds of one timed run per live candidate; the median scores it.
// Budget: once the measured time reaches policy.budget_s, candidates without a first call are
// skipped and rounds stop, except that every live candidate still gets `min_repeats` timed runs.
// Ties go to the earlier candidate.
SweepResult sweep(const std::vector<Params>& candidates, const RunFn& run,
                  const SweepPolicy& policy, const SweepStart& on_start = {},
                  const SweepObserver& on_tick = {});

double median(std::vector<double> v);

}  // namespace tessera::tune
