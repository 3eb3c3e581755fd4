// Tessera internal: tracked scratch memory. Implementations allocate their workspace through
// these helpers so that "extra memory" is a measured number (bench reports the peak), not a
// claim. Host and device bytes are counted apart. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tessera::memory {

enum class Space { kHost = 0, kDevice = 1 };

// Counters (bytes currently allocated through the helpers, and the peak since reset_peak).
size_t current_bytes(Space s);
size_t peak_bytes(Space s);
void reset_peak(Space s);  // peak := current

// Record allocations made elsewhere (e.g. cudaMalloc in a backend).
void note_alloc(Space s, size_t bytes);
void note_free(Space s, size_t bytes);

// 64-byte aligned host scratch, counted in Space::kHost. Throws Error(kOutOfMemory).
struct HostDeleter {
  size_t bytes = 0;
  void operator()(void* p) const noexcept;
};
using HostBuffer = std::unique_ptr<void, HostDeleter>;
HostBuffer host_alloc(size_t bytes);

template <class T>
T* as(const HostBuffer& b) {
  return static_cast<T*>(b.get());
}

}  // namespace tessera::memory
