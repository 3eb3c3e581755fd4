// Tessera tests: a paged (or per-group) problem moved past element 2^31 of its cache.
//
// A case is built small (pages 0 .. n−1 of its cache) and copied page for page into a cache of P
// pages, small page i to page far[i]: the pages that hold element 2^31 − 1 and follow it, and the
// cache's very last pages, which start past element 2^32. Every value an implementation reads
// sits at the same offset inside its page as before, so the moved problem must give the same
// results; an element offset formed in 32 bits anywhere (page id · page elements, group · K · N),
// signed (wraps past 2^31) or unsigned (past 2^32), reads another page or faults.
// The users of paged and grouped kernels hit exactly this (ANCHORS.md: "indexing overflowed past
// 2^31 elements"): a cache of 8 GiB is an ordinary serving cache.
//
// Host caches are sparse (SparseHost): only the pages written cost memory, so a test needs a few
// MiB whatever P is. Device caches (the CUDA tests) are whole allocations with only the moved
// pages written; nothing else is read.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tessera/tensor.h"

namespace tessera::relocated {

inline constexpr int64_t k2To31 = int64_t{1} << 31, k2To32 = int64_t{1} << 32;

// Host memory that costs only what is written: an anonymous mapping without swap reservation;
// pages never written read as zeros. data() is nullptr when the system refuses the mapping
// (overcommit disabled): the caller skips.
class SparseHost {
 public:
  explicit SparseHost(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : p;
  }
  ~SparseHost() {
    if (data_) munmap(data_, bytes_);
  }
  SparseHost(const SparseHost&) = delete;
  SparseHost& operator=(const SparseHost&) = delete;
  void* data() const { return data_; }

 private:
  size_t bytes_;
  void* data_ = nullptr;
};

// The first page that holds element 2^31 − 1 of a cache of `page_elems` elements a page (the
// page that straddles 2^31, or the last one before it when pages divide 2^31).
inline int64_t boundary_page(int64_t page_elems) { return (k2To31 - 1) / page_elems; }

// A cache whose last `count` pages start past element 2^32 (and lie well after the boundary
// page and the `count` pages that follow it).
inline int64_t pages_for(int64_t page_elems, int64_t count) { return (k2To32 - 1) / page_elems + count + 2; }

// Where `count` small pages go in a cache of pages_for(page_elems, count) pages, distinct:
// alternately boundary, last, boundary + 1, last − 1, ... (far[0] holds element 2^31 − 1, far[1]
// ends the cache; from far[2] on the boundary side starts at or past 2^31).
inline std::vector<int64_t> far_pages(int64_t page_elems, int64_t count) {
  const int64_t first = boundary_page(page_elems), P = pages_for(page_elems, count);
  std::vector<int64_t> far;
  for (int64_t i = 0; i < count; ++i) far.push_back(i % 2 == 0 ? first + i / 2 : P - 1 - i / 2);
  return far;
}

// A copy of an i32 page table (host) with every page id in [0, n) replaced by far[id]; other
// entries (the poison a case puts past a sequence's pages) are kept.
inline Tensor renumber(const Tensor& table, const std::vector<int64_t>& far) {
  Tensor out = Tensor::empty(DType::kI32, table.shape());
  const int64_t n = static_cast<int64_t>(far.size());
  for (int64_t i = 0; i < table.numel(); ++i) {
    const int32_t id = table.data_as<int32_t>()[i];
    out.data_as<int32_t>()[i] = id >= 0 && id < n ? static_cast<int32_t>(far[static_cast<size_t>(id)]) : id;
  }
  return out;
}

// Copies page i of `small` (host, contiguous, `page_bytes` a page) to page far[i] of `big`
// through `copy(dst, src, bytes)` (memcpy on the host, cudaMemcpy for a device cache).
template <class Copy>
void place_pages(const void* small, void* big, size_t page_bytes, const std::vector<int64_t>& far, Copy copy) {
  for (size_t i = 0; i < far.size(); ++i)
    copy(static_cast<char*>(big) + static_cast<size_t>(far[i]) * page_bytes,
         static_cast<const char*>(small) + i * page_bytes, page_bytes);
}

inline void host_copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

// Two host tensors of one dtype hold the same bits.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

// The largest |a − b| over two f32 host tensors (equal values, infinities included, count 0);
// infinity when the shapes differ or one value is NaN or infinite where the other is not. For
// device results, where a library may pick another kernel for other addresses.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.dtype() != DType::kF32 || b.dtype() != DType::kF32 || a.shape() != b.shape()) return INFINITY;
  double worst = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.data_as<float>()[i], y = b.data_as<float>()[i];
    if (x == y) continue;
    const double d = std::fabs(double(x) - double(y));
    worst = std::isfinite(d) ? std::max(worst, d) : INFINITY;
  }
  return worst;
}

}  // namespace tessera::relocated
