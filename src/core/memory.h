// Tessera internal: tracked scratch memory. Implementations allocate their workspace through
// these helpers so that "extra memory" is a measured number (bench reports the peak), not a
// claim. Host and device bytes are counted apart. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tessera::memory {

enum class Space { kHost = 0, kDevice = 1 };

// Counters (bytes currently allocated through the helpers, and the peak since reset_peak).
size_t current_bytes(Space s);
size_t peak_bytes(Space s);
void reset_peak(Space s);  // peak := current

// Record allocations made elsewhere (e.g. cudaMalloc in a backend).
void note_alloc(Space s, size_t bytes);
void note_free(Space s, size_t bytes);

// Host memory this machine has at all (RAM + swap, from sysinfo), in bytes; 0 if unknown.
// TESSERA_HOST_MEMORY_LIMIT (bytes) lowers it, for tests and for jobs that share a machine.
size_t host_memory_limit();

// bytes <= host_memory_limit() (or the limit is unknown).
bool host_fits(size_t bytes);

// Throws Error(kOutOfMemory) naming `what`, the size in bytes and GiB and the limit when
// `bytes` exceeds host_memory_limit(): a request that can never be met fails before it is
// attempted (with overcommit, malloc would succeed and the first touch would kill the process).
void check_host_fits(size_t bytes, const std::string& what);

// "12884901888 bytes (12.0 GiB)"
std::string bytes_str(size_t bytes);

// 64-byte aligned host scratch, counted in Space::kHost. Throws Error(kOutOfMemory).
struct HostDeleter {
  size_t bytes = 0;
  void operator()(void* p) const noexcept;
};
using HostBuffer = std::unique_ptr<void, HostDeleter>;
// Checks check_host_fits first.
HostBuffer host_alloc(size_t bytes);

template <class T>
T* as(const HostBuffer& b) {
  return static_cast<T*>(b.get());
}

}  // namespace tessera::memory
