#include "tune/sweep.h"

#include <algorithm>
#include <exception>

namespace tessera::tune {

const char* status_name(Measurement::Status s) noexcept {
  switch (s) {
    case Measurement::Status::kOk: return "ok";
    case Measurement::Status::kFailed: return "failed";
    case Measurement::Status::kSkipped: return "skipped";
  }
  return "?";
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

SweepResult sweep(const std::vector<Params>& candidates, const RunFn& run,
                  const SweepPolicy& policy, const SweepStart& on_start,
                  const SweepObserver& on_done) {
  SweepResult r;
  const bool limited = policy.budget_s > 0;
  auto left = [&] { return !limited || r.spent_s < policy.budget_s; };
  for (size_t i = 0; i < candidates.size(); ++i) {
    Measurement m;
    m.candidate = candidates[i];
    if (!left()) {
      m.status = Measurement::Status::kSkipped;
      m.failure = "time budget exhausted";
      r.budget_exhausted = true;
    } else {
      if (on_start) on_start(i, m.candidate);
      try {
        const double first = run(m.candidate);
        r.spent_s += first;
        m.first_call_ms = first * 1e3;
        for (int w = 0; w < policy.warmup && left(); ++w) r.spent_s += run(m.candidate);
        std::vector<double> times;
        for (int k = 0; k < policy.repeats; ++k) {
          if (static_cast<int>(times.size()) >= policy.min_repeats && !left()) break;
          const double t = run(m.candidate);
          r.spent_s += t;
          times.push_back(t);
        }
        m.runs = static_cast<int>(times.size());
        m.median_ms = median(times) * 1e3;
        m.min_ms = times.empty() ? 0 : *std::min_element(times.begin(), times.end()) * 1e3;
        if (m.runs == 0) {  // repeats == 0: score by the first call
          m.median_ms = m.min_ms = m.first_call_ms;
          m.runs = 1;
        }
      } catch (const std::exception& e) {
        m.status = Measurement::Status::kFailed;
        m.failure = e.what();
      } catch (...) {
        m.status = Measurement::Status::kFailed;
        m.failure = "unknown exception";
      }
      if (m.ok() && (r.best < 0 || m.median_ms < r.measurements[r.best].median_ms))
        r.best = static_cast<int>(i);
    }
    r.measurements.push_back(m);
    if (on_done) on_done(i, r.measurements.back(), r.best);
  }
  return r;
}

}  // namespace tessera::tune
