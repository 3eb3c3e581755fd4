// Tessera internal (tuning): shape buckets.
//
// A kernel lists a small, reviewable set of named buckets; each bucket is a range per problem
// dimension (inclusive) and a representative shape that `tessera tune` sweeps. Lookup is by
// first match, so order the list from specific to general. Tuned tables are keyed by bucket
// name, never by every exact shape.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace tessera::tune {

inline constexpr int64_t kAny = std::numeric_limits<int64_t>::max();  // a DimRange open above

struct DimRange {
  std::string name;  // "B", "H", "V": matches the kernel's dimension order
  int64_t lo = 0;
  int64_t hi = std::numeric_limits<int64_t>::max();  // inclusive
  int64_t representative = 0;  // the size `tessera tune` uses for this dimension
  bool contains(int64_t x) const { return x >= lo && x <= hi; }
};

struct Bucket {
  std::string name;         // "llama3-ish"
  std::string description;  // one line for docs and `tessera tune --list`
  std::vector<DimRange> dims;
};

// First bucket whose every range contains the matching entry of `shape` (same order and length
// as the bucket's dims), or nullptr.
const Bucket* match_bucket(const std::vector<Bucket>& buckets, const std::vector<int64_t>& shape);

// The representative shape of a bucket, in dimension order.
std::vector<int64_t> representative_shape(const Bucket& b);

// The smallest power of two >= x (1 for x <= 1): the size class of a dim in autotune cache keys,
// so that nearby shapes share an entry.
int64_t pow2_class(int64_t x);

// "B=512,H=1024,V=32000" for a shape in the bucket's dimension order.
std::string shape_str(const Bucket& b, const std::vector<int64_t>& shape);
// "B 1..1024, H any, V 16k..64k" — the ranges, for listings.
std::string ranges_str(const Bucket& b);

}  // namespace tessera::tune
