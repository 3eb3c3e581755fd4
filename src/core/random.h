// Tessera core: the one deterministic random-input generator (tests, check grids, bench, tune).
//
// Counter-based (splitmix64 streams keyed by seed and element index), so a tensor's values
// depend only on (seed, index): filled in parallel chunks they are the same for every thread
// count, and the same seed gives the same inputs in tests, `tessera check` and `tessera bench`.
// Float values are rounded to the tensor's dtype when stored.
#pragma once

#include <cstdint>

#include "tessera/tensor.h"

namespace tessera {

// The i-th value of stream `seed`: uniform 64-bit / uniform double in [0, 1).
uint64_t random_bits(uint64_t seed, uint64_t i) noexcept;
double random_unit(uint64_t seed, uint64_t i) noexcept;

// Fills a float tensor (host, contiguous; f8e4m3 too) with uniform values in [lo, hi), each
// rounded once to the tensor's dtype.
void fill_uniform(Tensor& t, double lo, double hi, uint64_t seed);
// A new host tensor with uniform values in [-scale, scale).
Tensor random_uniform(DType dtype, Shape shape, float scale, uint64_t seed);
// A new host integer tensor (i32 / i64) with values uniform in [0, n).
Tensor random_indices(DType dtype, Shape shape, int64_t n, uint64_t seed);

}  // namespace tessera
