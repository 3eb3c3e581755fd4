// Tessera harness: summary statistics of repeated measurements (generic).
#pragma once

#include <cstddef>
#include <vector>

namespace tessera::harness {

struct Stats {
  size_t n = 0;
  double min = 0, max = 0, mean = 0;
  double median = 0;
  double q1 = 0, q3 = 0;  // 25th / 75th percentiles (linear interpolation between order stats)
  double iqr() const { return q3 - q1; }
};

// Linear-interpolation quantile (q in [0, 1]) of `sorted` (ascending, non-empty).
double quantile_sorted(const std::vector<double>& sorted, double q);
// Summary of `samples` (any order). An empty input gives all zeros and n = 0.
Stats summarize(std::vector<double> samples);

}  // namespace tessera::harness
