// Tessera core: the one progress display for long jobs (bench, tune, roofline) on stderr.
//
// On a terminal: one line redrawn in place, "title [####....] done/total what | best ...".
// Otherwise (logs, CI): that line at most every `interval_s` seconds, and always the first.
// note() prints a line of its own in both modes (results, skips, failures). enabled = false
// (--quiet) silences updates; notes are still printed.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace tessera {

class Progress {
 public:
  Progress(std::string title, size_t total, bool enabled = true, std::FILE* out = stderr);
  // Tests: force the mode and the interval.
  Progress(std::string title, size_t total, bool enabled, std::FILE* out, bool tty,
           double interval_s);
  ~Progress() { finish(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `done` of total steps; what runs now; the best so far ("" if none).
  void update(size_t done, const std::string& now, const std::string& best = "");
  void note(const std::string& line);
  void finish();  // ends the redrawn line
  double elapsed() const;

 private:
  std::string line(const std::string& now, const std::string& best) const;
  std::string title_;
  size_t total_, done_ = 0;
  bool enabled_;
  std::FILE* out_;
  bool tty_;
  double interval_s_;
  bool drawn_ = false, printed_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace tessera
