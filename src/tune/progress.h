// Tessera internal (tuning): a progress display on stderr. On a terminal: one bar redrawn in
// place (done/total, what runs now, best so far). Otherwise (logs, CI): a plain line at most
// every few seconds, plus every line passed to note().
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace tessera::tune {

class Progress {
 public:
  explicit Progress(size_t total, std::FILE* out = stderr);
  Progress(size_t total, std::FILE* out, bool tty, double line_interval_s = 5.0);  // tests
  // `done` of total steps; what ran last; the best so far ("" if none).
  void update(size_t done, const std::string& now, const std::string& best);
  // A line of its own (a result, a failure), printed in both modes.
  void note(const std::string& line);
  void finish();  // ends the bar's line

 private:
  std::string line(const std::string& now, const std::string& best) const;
  std::FILE* out_;
  bool tty_;
  double interval_s_;
  size_t total_, done_ = 0;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace tessera::tune
