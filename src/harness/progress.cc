#include "harness/progress.h"

#include <chrono>
#include <cstdio>

namespace tessera::harness {

Progress::Progress(std::string title, int total, bool enabled)
    : title_(std::move(title)), total_(total), enabled_(enabled) {
  if (enabled_) watcher_ = std::thread([this] { watch(); });
}

Progress::~Progress() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

void Progress::flush_locked() {
  if (pending_.empty()) return;
  std::fprintf(stderr, "%s\n", pending_.c_str());
  std::fflush(stderr);
  pending_.clear();
}

void Progress::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  // Wake once the quiet second is over; from then on lines print as they come.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  if (cv_.wait_until(lock, deadline, [this] { return stop_; })) return;
  loud_ = true;
  flush_locked();
}

void Progress::step(int i, const std::string& what) {
  if (!enabled_) return;
  char buf[96];
  std::snprintf(buf, sizeof buf, "[%d/%d] ", i, total_);
  char tail[32];
  std::snprintf(tail, sizeof tail, "  (%.1f s)", clock_.seconds());
  std::lock_guard<std::mutex> lock(mu_);
  pending_ = title_ + ": " + buf + what + tail;
  if (loud_) flush_locked();
}

void Progress::note(const std::string& msg, bool force) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!loud_ && !force) return;
  flush_locked();
  std::fprintf(stderr, "%s: %s\n", title_.c_str(), msg.c_str());
  std::fflush(stderr);
}

}  // namespace tessera::harness
