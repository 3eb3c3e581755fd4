#include "tune/sweep.h"

#include <algorithm>
#include <exception>
#include <new>

#include "tessera/error.h"
#include "tune/verify.h"

namespace tessera::tune {

const char* status_name(Measurement::Status s) noexcept {
  switch (s) {
    case Measurement::Status::kOk: return "ok";
    case Measurement::Status::kFailed: return "failed";
    case Measurement::Status::kSkipped: return "skipped";
    case Measurement::Status::kWrong: return "wrong";
  }
  return "?";
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

// After candidate i's first call: the reference, or checked against it (false: wrong).
bool check_outputs(OutputCheck& check, SweepResult& r, size_t i) {
  Measurement& m = r.measurements[i];
  if (!check.has_reference()) {
    check.take_reference();
    r.reference = static_cast<int>(i);
    m.max_abs_dev = m.tolerance = 0;
    return true;
  }
  const OutputDeviation d = check.compare();
  m.max_abs_dev = d.max_abs;
  m.tolerance = d.tolerance;
  m.dev_output = d.output;
  if (d.ok()) return true;
  const Measurement& ref = r.measurements[static_cast<size_t>(r.reference)];
  m.status = Measurement::Status::kWrong;
  m.failure = "outputs differ from " + std::string(r.reference == 0 ? "the default's" : "the reference's") + " (" +
              params_str(ref.candidate) + "): " + d.str();
  return false;
}

}  // namespace

SweepResult sweep(const std::vector<Params>& candidates, const Runner& runner,
                  const SweepPolicy& policy, const SweepStart& on_start,
                  const SweepObserver& on_tick) {
  SweepResult r;
  const RunFn& run = runner.run;
  OutputCheck check(runner.outputs);
  const size_t n = candidates.size();
  const int warmup = std::max(0, policy.warmup), repeats = std::max(0, policy.repeats);
  const int min_repeats = std::clamp(policy.min_repeats, 0, repeats);
  std::vector<std::vector<double>> times(n);
  r.measurements.resize(n);
  for (size_t i = 0; i < n; ++i) r.measurements[i].candidate = candidates[i];

  const size_t per_candidate = static_cast<size_t>(1 + warmup + repeats);  // runs
  std::vector<size_t> runs_done(n, 0);
  SweepTick tick;
  tick.total = n * per_candidate;
  size_t emitted = 0;  // tick.done at the last on_tick
  auto left = [&] { return policy.budget_s <= 0 || r.spent_s < policy.budget_s; };
  auto live = [&](size_t i) { return r.measurements[i].ok(); };
  auto refresh_best = [&] {
    r.best = -1;
    for (size_t i = 0; i < n; ++i) {
      if (!live(i) || times[i].empty()) continue;
      const double med = median(times[i]) * 1e3;
      if (r.best < 0 || med < tick.best_ms) {
        r.best = static_cast<int>(i);
        tick.best_ms = med;
      }
    }
    tick.best = r.best;
  };
  // One run of candidate i; false if it failed or was wrong (then it is dropped). The first
  // call (checked) is the one whose outputs are compared.
  auto once = [&](size_t i, const char* phase, double* seconds, bool timed, bool checked = false) {
    if (on_start) on_start(i, phase);
    Measurement& m = r.measurements[i];
    bool ok = true;
    // A failure of the check itself (no memory for the copies, say) is not the candidate's:
    // the sweep goes on unchecked and says why.
    auto guarded = [&](const auto& f) {
      try {
        if (check.enabled()) f();
      } catch (const std::exception& e) {
        r.unchecked = std::string("the output check stopped: ") + e.what();
        check.stop();
      }
    };
    try {
      if (checked) guarded([&] { check.prepare(); });
      *seconds = run(m.candidate);
      r.spent_s += *seconds;
      if (timed) times[i].push_back(*seconds);
      if (checked) guarded([&] { ok = check_outputs(check, r, i); });
    } catch (const Error& e) {
      ok = false;
      m.failure = e.what();
      m.out_of_memory = e.code() == ErrorCode::kOutOfMemory;
    } catch (const std::bad_alloc& e) {
      ok = false;
      m.failure = std::string("out of memory: ") + e.what();
      m.out_of_memory = true;
    } catch (const std::exception& e) {
      ok = false;
      m.failure = e.what();
    } catch (...) {
      ok = false;
      m.failure = "unknown exception";
    }
    ++runs_done[i];
    ++tick.done;
    if (!ok) {
      if (m.status != Measurement::Status::kWrong) m.status = Measurement::Status::kFailed;
      tick.done += per_candidate - runs_done[i];  // the runs it will not do
    }
    tick.index = i;
    tick.phase = phase;
    tick.seconds = ok ? *seconds : -1;
    refresh_best();
    if (on_tick) on_tick(tick);
    emitted = tick.done;
    return ok;
  };
  auto cancel = [&](size_t runs) {  // runs that will not happen (budget)
    tick.done += runs;
  };

  // 1. First calls.
  for (size_t i = 0; i < n; ++i) {
    Measurement& m = r.measurements[i];
    if (!left()) {
      m.status = Measurement::Status::kSkipped;
      m.failure = "time budget exhausted";
      r.budget_exhausted = true;
      cancel(per_candidate);
      continue;
    }
    double t = 0;
    const bool ok = once(i, "first call", &t, false, check.enabled());
    if (ok || m.status == Measurement::Status::kWrong) m.first_call_ms = t * 1e3;
  }
  // 2. Warm-up rounds.
  for (int w = 0; w < warmup; ++w)
    for (size_t i = 0; i < n; ++i) {
      if (!live(i)) continue;
      double t = 0;
      if (left())
        once(i, "warm-up", &t, false);
      else
        cancel(1);
    }
  // 3. Timed rounds.
  for (int k = 0; k < repeats; ++k)
    for (size_t i = 0; i < n; ++i) {
      if (!live(i)) continue;
      double t = 0;
      if (k < min_repeats || left()) {
        once(i, "timed", &t, true);
      } else {
        cancel(1);
        r.budget_exhausted = true;
      }
    }

  for (size_t i = 0; i < n; ++i) {
    Measurement& m = r.measurements[i];
    if (!m.ok()) continue;
    if (times[i].empty()) times[i].push_back(m.first_call_ms / 1e3);  // repeats == 0
    m.runs = static_cast<int>(times[i].size());
    m.median_ms = median(times[i]) * 1e3;
    m.min_ms = *std::min_element(times[i].begin(), times[i].end()) * 1e3;
  }
  refresh_best();
  if (on_tick && emitted < tick.done) on_tick(tick);  // runs the budget cancelled at the end
  return r;
}

}  // namespace tessera::tune
