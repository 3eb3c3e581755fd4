#include "core/memory.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

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

HostBuffer host_alloc(size_t bytes) {
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (!p)
    throw Error(ErrorCode::kOutOfMemory,
                "could not allocate " + std::to_string(bytes) + " bytes of host scratch");
  note_alloc(Space::kHost, rounded);
  return HostBuffer(p, HostDeleter{rounded});
}

}  // namespace tessera::memory
