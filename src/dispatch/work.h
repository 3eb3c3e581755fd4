// Tessera internal: what a call's work is, for the thread count (tessera/exec.h's
// resolve_num_threads(requested, work)).
#pragma once

#include <cstdint>

namespace tessera::dispatch {

// Products over the (row, key) pairs of n sequences, pairs(s) of sequence s: 2·heads·dims flops
// per pair (a score and a weighted value: dims = D + Dv); masks ignored (an upper bound).
template <class Pairs>
double pair_products_flops(int64_t n, int64_t heads, int64_t dims, Pairs pairs) {
  double sum = 0.0;
  for (int64_t s = 0; s < n; ++s) sum += pairs(s);
  return 2.0 * static_cast<double>(heads) * static_cast<double>(dims) * sum;
}

}  // namespace tessera::dispatch
