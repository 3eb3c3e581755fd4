#include "harness/timer.h"

#include <algorithm>

namespace tessera::harness {

Timing measure(const std::function<void()>& fn, const TimingOptions& opt,
               const std::function<void()>& sync) {
  Timing t;
  auto once = [&] {
    if (opt.time_one) return opt.time_one(fn);
    Stopwatch sw;
    fn();
    if (sync) sync();
    return sw.seconds();
  };
  if (opt.before_first) opt.before_first();
  t.first_call_s = once();
  if (opt.after_first) opt.after_first();
  // A slow kernel (seconds per call) is already warm after its first call: skip the extra
  // warm-up rather than spend the budget on it.
  if (t.first_call_s * opt.warmup <= 0.25 * opt.max_seconds)
    for (int i = 0; i < opt.warmup; ++i) once();
  const int want = std::max(1, opt.repeats);
  const int at_least = std::clamp(opt.min_repeats, 1, want);
  double spent = 0.0;
  while (static_cast<int>(t.samples_s.size()) < want) {
    if (static_cast<int>(t.samples_s.size()) >= at_least && spent >= opt.max_seconds) break;
    const double s = once();
    t.samples_s.push_back(s);
    spent += s;
  }
  t.stats = summarize(t.samples_s);
  return t;
}

}  // namespace tessera::harness
