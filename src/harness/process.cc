#include "harness/process.h"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>
#include <vector>

#include "core/time.h"

namespace tessera::harness {
namespace {
std::optional<size_t> status_kb(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream is(line.substr(key.size() + 1));
      size_t kb = 0;
      if (is >> kb) return kb * 1024;
    }
  }
  return std::nullopt;
}
std::string cpuinfo_field(const std::string& key) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) {
      auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  }
  return {};
}
}  // namespace

std::optional<size_t> rss_bytes() { return status_kb("VmRSS"); }
std::optional<size_t> peak_rss_bytes() { return status_kb("VmHWM"); }

bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

std::string cpu_model() { return cpuinfo_field("model name"); }

// Read once: hardware_concurrency() reads /sys on every call (src/core/exec.cc).
int hardware_threads() {
  static const int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return n;
}

std::string cpu_features() {
  std::istringstream flags(cpuinfo_field("flags"));
  static const char* kWanted[] = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
                                  "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"};
  std::string out, f;
  std::vector<std::string> have;
  while (flags >> f) have.push_back(f);
  for (const char* w : kWanted)
    if (std::find(have.begin(), have.end(), w) != have.end()) out += (out.empty() ? "" : " ") + std::string(w);
  return out;
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  if (threads <= 0) threads = hardware_threads();
  threads = static_cast<int>(std::min<int64_t>(threads, n));
  if (threads <= 1) {
    body(0, n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int i = 1; i < threads; ++i) {
    const int64_t b = i * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back([&body, b, e] { body(b, e); });
  }
  body(0, std::min(n, chunk));
  for (auto& t : pool) t.join();
}

std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string out;
  size_t start = 0;
  bool first = true;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    std::string arg = all.substr(start, end - start);
    if (first) {
      const auto slash = arg.rfind('/');
      if (slash != std::string::npos) arg = arg.substr(slash + 1);
      first = false;
    }
    const bool quote = arg.find_first_of(" \t\"'") != std::string::npos || arg.empty();
    out += (out.empty() ? "" : " ") + (quote ? "'" + arg + "'" : arg);
    start = end + 1;
  }
  return out;
}

std::string utc_timestamp() { return utc_now(); }

}  // namespace tessera::harness
