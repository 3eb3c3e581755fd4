#include "tune/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace tessera::tune {

Progress::Progress(size_t total, std::FILE* out)
    : Progress(total, out, ::isatty(::fileno(out)) != 0) {}

Progress::Progress(size_t total, std::FILE* out, bool tty, double line_interval_s)
    : out_(out), tty_(tty), interval_s_(line_interval_s), total_(total),
      last_(std::chrono::steady_clock::now()) {}

std::string Progress::line(const std::string& now, const std::string& best) const {
  constexpr size_t kWidth = 24;
  const size_t filled = total_ ? std::min(kWidth, kWidth * done_ / total_) : kWidth;
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::string s = "[" + bar + "] " + std::to_string(done_) + "/" + std::to_string(total_) + " " + now;
  if (!best.empty()) s += " | best " + best;
  return s;
}

void Progress::update(size_t done, const std::string& now, const std::string& best) {
  done_ = std::min(done, total_);
  if (tty_) {
    int columns = 120;
    if (const char* c = std::getenv("COLUMNS")) columns = std::max(40, std::atoi(c));
    std::string s = line(now, best);
    if (s.size() > static_cast<size_t>(columns - 1)) s.resize(static_cast<size_t>(columns - 1));
    std::fprintf(out_, "\r\033[K%s", s.c_str());
    drawn_ = true;
  } else {
    const auto t = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(t - last_).count() < interval_s_ && done_ < total_) return;
    last_ = t;
    std::fprintf(out_, "%s\n", line(now, best).c_str());
  }
  std::fflush(out_);
}

void Progress::note(const std::string& text) {
  if (tty_ && drawn_) std::fprintf(out_, "\r\033[K");
  std::fprintf(out_, "%s\n", text.c_str());
  drawn_ = false;
  std::fflush(out_);
}

void Progress::finish() {
  if (tty_ && drawn_) std::fprintf(out_, "\n");
  drawn_ = false;
  std::fflush(out_);
}

}  // namespace tessera::tune
