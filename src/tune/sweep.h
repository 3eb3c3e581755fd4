// Tessera internal (tuning): timing a bounded set of candidates.
//
// A kernel hands the sweep its candidates and a Runner: a RunFn that runs the kernel once with
// one candidate and returns the elapsed seconds (real timing, or a planted cost in tests), and
// optionally the outputs that call wrote. The sweep does the rest: first call timed apart,
// warm-up, median of repeats, failures recorded and skipped, a total time budget, and (with
// outputs) a check of every candidate's results against the default's (tune/verify.h): a
// candidate that computes something else is recorded as wrong and never wins.
#pragma once

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/tensor.h"
#include "tune/params.h"

namespace tessera::tune {

// Runs one call with `candidate` and returns its duration in seconds (synchronized: the work
// is done when it returns). Throws (tessera::Error or anything else) when the candidate cannot
// run; the exception's message becomes the failure reason.
using RunFn = std::function<double(const Params& candidate)>;

// An output of the kernel's timed call: scratch the RunFn writes on every call (host or device).
struct Output {
  std::string name;  // "dw"
  Tensor tensor;     // contiguous; shares the RunFn's scratch
  // The tolerance between candidates, as a fraction of the reference's largest |value|; 0:
  // default_rtol of the tensor's dtype (tune/verify.h). A kernel whose block sizes change
  // rounding, not only the order of sums, states its own (tune::Declared::rtol).
  double rtol = 0;
};
// The outputs the RunFn's calls write, each call overwriting the last. Only what the timed op
// computes: an input the RunFn prepared once (a backward's saved lse) is not an output.
using OutputsFn = std::function<std::vector<Output>()>;

struct Runner {
  RunFn run;
  OutputsFn outputs;  // empty: the sweep checks nothing (planted costs, old callers)
  Runner() = default;
  Runner(RunFn r, OutputsFn o) : run(std::move(r)), outputs(std::move(o)) {}
  // A plain RunFn (or a lambda) is an unchecked Runner.
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, Runner> &&
                                              std::is_constructible_v<RunFn, F>>>
  Runner(F&& f) : run(std::forward<F>(f)) {}  // NOLINT(google-explicit-constructor)
};

struct SweepPolicy {
  int warmup = 1;       // untimed runs after the first call
  int repeats = 5;      // timed runs; the median is the score
  int min_repeats = 1;  // when the budget runs short, still this many timed runs per candidate
  double budget_s = 0;  // total seconds of measured run time for the sweep; 0 = unlimited
};

struct Measurement {
  Params candidate;
  // kWrong: it ran, but its outputs differ from the reference candidate's (see max_abs_dev).
  enum class Status { kOk, kFailed, kSkipped, kWrong } status = Status::kOk;
  double first_call_ms = 0;  // the candidate's first run (cold caches, lazy set-up)
  double median_ms = 0;      // median of the timed runs (kOk only)
  double min_ms = 0;
  int runs = 0;              // timed runs behind median_ms
  std::string failure;       // why it failed, was skipped or is wrong
  // It failed for memory (std::bad_alloc, Error(kOutOfMemory)): a fact of the moment, not of
  // the candidate; a sweep whose candidates all failed so is not cached (autotune.cc).
  bool out_of_memory = false;
  // Its outputs against the reference candidate's (the Runner had outputs and both ran): the
  // output with the largest deviation relative to its tolerance, that deviation (inf: a
  // non-finite value where the reference has another value) and that tolerance, both absolute.
  // NaN when not checked; 0 for the reference itself.
  double max_abs_dev = std::numeric_limits<double>::quiet_NaN();
  double tolerance = std::numeric_limits<double>::quiet_NaN();
  std::string dev_output;
  bool ok() const { return status == Status::kOk; }
  bool checked() const { return !std::isnan(max_abs_dev); }
};
const char* status_name(Measurement::Status s) noexcept;  // "ok", "failed", "skipped", "wrong"

struct SweepResult {
  std::vector<Measurement> measurements;  // one per candidate, in candidate order
  int best = -1;                          // index of the fastest ok candidate, -1 if none
  int reference = -1;                     // whose outputs the others were checked against: the
                                          // default (0), else the first that ran; -1: unchecked
  std::string unchecked;                  // why the output check stopped part-way ("" if it did not)
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
// Outputs (runner.outputs set): before each candidate's first call they are zero-filled; after
// it, the first candidate to run (the default, candidates[0], unless it failed) becomes the
// reference and every other one is compared with it (tune/verify.h); a candidate beyond the
// tolerance is kWrong, dropped like a failure. The check is not timed.
SweepResult sweep(const std::vector<Params>& candidates, const Runner& runner,
                  const SweepPolicy& policy, const SweepStart& on_start = {},
                  const SweepObserver& on_tick = {});

double median(std::vector<double> v);

}  // namespace tessera::tune
