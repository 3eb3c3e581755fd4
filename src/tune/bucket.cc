#include "tune/bucket.h"

namespace tessera::tune {

const Bucket* match_bucket(const std::vector<Bucket>& buckets, const std::vector<int64_t>& shape) {
  for (const Bucket& b : buckets) {
    if (b.dims.size() != shape.size()) continue;
    bool all = true;
    for (size_t i = 0; i < shape.size() && all; ++i) all = b.dims[i].contains(shape[i]);
    if (all) return &b;
  }
  return nullptr;
}

int64_t pow2_class(int64_t x) {
  int64_t c = 1;
  while (c < x) c *= 2;
  return c;
}

std::vector<int64_t> representative_shape(const Bucket& b) {
  std::vector<int64_t> s;
  for (const DimRange& d : b.dims) s.push_back(d.representative);
  return s;
}

std::string shape_str(const Bucket& b, const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < b.dims.size() && i < shape.size(); ++i) {
    if (i) s += ",";
    s += b.dims[i].name + "=" + std::to_string(shape[i]);
  }
  return s;
}

std::string ranges_str(const Bucket& b) {
  std::string s;
  for (const DimRange& d : b.dims) {
    if (!s.empty()) s += ", ";
    s += d.name + " ";
    const bool open_lo = d.lo <= 1, open_hi = d.hi == std::numeric_limits<int64_t>::max();
    if (open_lo && open_hi)
      s += "any";
    else if (open_hi)
      s += ">=" + std::to_string(d.lo);
    else
      s += std::to_string(d.lo) + ".." + std::to_string(d.hi);
  }
  return s;
}

}  // namespace tessera::tune
