// Tessera internal (tuning): a progress display on stderr. On a terminal: one bar redrawn in
// place (done/total, what runs now, best so far). Otherwise (logs, CI): one plain line per
// finished step.
#pragma once

#include <cstdio>
#include <string>

namespace tessera::tune {

class Progress {
 public:
  explicit Progress(size_t total, std::FILE* out = stderr);
  Progress(size_t total, std::FILE* out, bool tty);  // force the mode (tests)
  void start(const std::string& what);                // a step begins
  void done(const std::string& result, const std::string& best);  // it ended
  void finish();                                      // ends the bar's line

 private:
  void draw(const std::string& tail);
  std::FILE* out_;
  bool tty_;
  size_t total_, count_ = 0;
  std::string what_, best_;
};

}  // namespace tessera::tune
