// Tessera harness: wall-clock timing of a callable (generic).
//
// measure() times the first call on its own (cold: lazy initialization, first-touch page
// faults, autotune-on-miss all land here), then runs `warmup` more untimed calls (skipped when
// they would cost more than a quarter of `max_seconds`), then times
// repeated calls until `repeats` samples are taken or `max_seconds` of timed work has passed
// (but never fewer than `min_repeats`). `sync` (optional) is called after every call inside
// the timed region: device work must be finished before the clock stops.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "harness/stats.h"

namespace tessera::harness {

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

struct TimingOptions {
  int warmup = 1;         // untimed calls after the first call
  int repeats = 7;        // timed samples wanted
  int min_repeats = 3;    // ... but at least this many, whatever max_seconds says
  double max_seconds = 10.0;  // budget of timed work per measurement
  // Called just before / just after the first call, outside the clock (e.g. to reset and read
  // memory peak counters around the cold call).
  std::function<void()> before_first, after_first;
  // Times one call and returns its seconds (e.g. CUDA events around it, DeviceHooks::time_call).
  // Unset: the host clock around the call and `sync`.
  std::function<double(const std::function<void()>&)> time_one;
};

struct Timing {
  double first_call_s = 0.0;
  std::vector<double> samples_s;  // steady-state samples, in call order
  Stats stats;                    // of samples_s
};

Timing measure(const std::function<void()>& fn, const TimingOptions& opt = {},
               const std::function<void()>& sync = {});

}  // namespace tessera::harness
