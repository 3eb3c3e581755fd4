#include "tune/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace tessera::tune {

Progress::Progress(size_t total, std::FILE* out)
    : Progress(total, out, ::isatty(::fileno(out)) != 0) {}

Progress::Progress(size_t total, std::FILE* out, bool tty) : out_(out), tty_(tty), total_(total) {}

void Progress::draw(const std::string& tail) {
  constexpr int kWidth = 24;
  const int filled = total_ ? static_cast<int>(kWidth * count_ / total_) : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  int columns = 120;
  if (const char* c = std::getenv("COLUMNS")) columns = std::max(40, std::atoi(c));
  std::string line = "[" + bar + "] " + std::to_string(count_) + "/" + std::to_string(total_) + " " + tail;
  if (static_cast<int>(line.size()) > columns - 1) line.resize(static_cast<size_t>(columns - 1));
  std::fprintf(out_, "\r\033[K%s", line.c_str());
  std::fflush(out_);
}

void Progress::start(const std::string& what) {
  what_ = what;
  if (tty_) draw(what_ + (best_.empty() ? "" : " | best " + best_));
}

void Progress::done(const std::string& result, const std::string& best) {
  ++count_;
  best_ = best;
  if (tty_) {
    draw(what_ + ": " + result + (best_.empty() ? "" : " | best " + best_));
  } else {
    std::fprintf(out_, "[%zu/%zu] %s: %s%s\n", count_, total_, what_.c_str(), result.c_str(),
                 best_.empty() ? "" : (" | best " + best_).c_str());
    std::fflush(out_);
  }
}

void Progress::finish() {
  if (tty_) {
    std::fprintf(out_, "\n");
    std::fflush(out_);
  }
}

}  // namespace tessera::tune
