#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace tessera {

Progress::Progress(std::string title, size_t total, bool enabled, std::FILE* out)
    : Progress(std::move(title), total, enabled, out, ::isatty(::fileno(out)) != 0, 2.0) {}

Progress::Progress(std::string title, size_t total, bool enabled, std::FILE* out, bool tty,
                   double interval_s)
    : title_(std::move(title)), total_(total), enabled_(enabled), out_(out), tty_(tty),
      interval_s_(interval_s), start_(std::chrono::steady_clock::now()), last_(start_) {}

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string Progress::line(const std::string& now, const std::string& best) const {
  constexpr size_t kWidth = 24;
  const size_t filled = total_ ? std::min(kWidth, kWidth * done_ / total_) : kWidth;
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  char secs[32];
  std::snprintf(secs, sizeof secs, " (%.0f s)", elapsed());
  std::string s = title_ + " [" + bar + "] " + std::to_string(done_) + "/" +
                  std::to_string(total_) + " " + now + secs;
  if (!best.empty()) s += " | best " + best;
  return s;
}

void Progress::update(size_t done, const std::string& now, const std::string& best) {
  done_ = std::min(done, total_);
  if (!enabled_) return;
  if (tty_) {
    int columns = 120;
    if (const char* c = std::getenv("COLUMNS")) columns = std::max(40, std::atoi(c));
    std::string s = line(now, best);
    if (s.size() > static_cast<size_t>(columns - 1)) s.resize(static_cast<size_t>(columns - 1));
    std::fprintf(out_, "\r\033[K%s", s.c_str());
    drawn_ = true;
  } else {
    const auto t = std::chrono::steady_clock::now();
    if (printed_ && std::chrono::duration<double>(t - last_).count() < interval_s_ && done_ < total_)
      return;
    last_ = t;
    printed_ = true;
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

}  // namespace tessera
