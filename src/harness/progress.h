// Tessera harness: progress lines on stderr for long runs (generic).
//
// Quiet for the first second: a run that finishes within it prints nothing. Once a second has
// passed, the current step's line "title: [i/n] what  (elapsed)" is printed (by a watcher
// thread if the step is still running) and every later step prints its line when it starts.
// enabled = false (e.g. --quiet) silences it.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "harness/timer.h"

namespace tessera::harness {

class Progress {
 public:
  Progress(std::string title, int total, bool enabled = true);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Announces step i (1-based) of total before it runs.
  void step(int i, const std::string& what);
  // A note printed under the same rules (force: print now even within the quiet second).
  void note(const std::string& msg, bool force = false);
  double elapsed() const { return clock_.seconds(); }

 private:
  void flush_locked();  // prints the pending line if any
  void watch();

  std::string title_;
  int total_;
  bool enabled_;
  Stopwatch clock_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool loud_ = false;     // past the quiet second
  std::string pending_;   // not yet printed
  std::thread watcher_;
};

}  // namespace tessera::harness
