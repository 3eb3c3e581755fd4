#include "core/memory.h"

#include <algorithm>
#include <atomic>
#include <sys/sysinfo.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "core/env.h"

#include "tessera/error.h"

namespace tessera::memory {
namespace {
std::atomic<size_t> g_cur[2];
std::atomic<size_t> g_peak[2];
}  // namespace

size_t current_bytes(Space s) { return g_cur[static_cast<int>(s)].load(); }
size_t peak_bytes(Space s) { return g_peak[static_cast<int>(s)].load(); }
void reset_peak(Space s) { g_peak[static_cast<int>(s)].store(current_bytes(s)); }

void note_alloc(Space s, size_t bytes) {
  const int i = static_cast<int>(s);
  const size_t now = g_cur[i].fetch_add(bytes) + bytes;
  size_t peak = g_peak[i].load();
  while (now > peak && !g_peak[i].compare_exchange_weak(peak, now)) {
  }
}

void note_free(Space s, size_t bytes) { g_cur[static_cast<int>(s)].fetch_sub(bytes); }

void HostDeleter::operator()(void* p) const noexcept {
  if (!p) return;
  std::free(p);
  note_free(Space::kHost, bytes);
}

size_t host_memory_limit() {
  static const size_t machine = [] {
    struct sysinfo si {};
    if (::sysinfo(&si) != 0) return size_t{0};
    return (static_cast<size_t>(si.totalram) + static_cast<size_t>(si.totalswap)) * si.mem_unit;
  }();
  size_t limit = machine;
  if (auto v = env::get("TESSERA_HOST_MEMORY_LIMIT")) {
    const long long n = std::atoll(v->c_str());
    if (n > 0 && (limit == 0 || static_cast<size_t>(n) < limit)) limit = static_cast<size_t>(n);
  }
  return limit;
}

std::string bytes_str(size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%zu bytes (%.1f GiB)", bytes, static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

bool host_fits(size_t bytes) {
  const size_t limit = host_memory_limit();
  return !limit || bytes <= limit;
}

void check_host_fits(size_t bytes, const std::string& what) {
  const size_t limit = host_memory_limit();
  if (limit && bytes > limit)
    throw Error(ErrorCode::kOutOfMemory, what + " needs " + bytes_str(bytes) +
                                             " of host memory, more than this machine has (" +
                                             bytes_str(limit) + "); nothing was allocated");
}

HostBuffer host_alloc(size_t bytes) {
  check_host_fits(bytes, "host scratch");
  if (bytes > std::numeric_limits<size_t>::max() - 64)
    throw Error(ErrorCode::kOutOfMemory, "could not allocate " + bytes_str(bytes) + " of host scratch");
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (!p)
    throw Error(ErrorCode::kOutOfMemory,
                "could not allocate " + bytes_str(bytes) + " of host scratch");
  note_alloc(Space::kHost, rounded);
  return HostBuffer(p, HostDeleter{rounded});
}

}  // namespace tessera::memory
