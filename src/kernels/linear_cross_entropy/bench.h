// linear_cross_entropy: the benchmark behind `tessera bench linear_cross_entropy`.
//
// For every (shape, dtype), implementation and pass it times the public API
// (forward / backward / forward_backward with Options::implementation = that name), so every
// registered implementation is benchmarked the same way, including ones added later. Each row
// carries: first-call time, steady-state median with min / max / IQR, useful and issued
// GFLOP/s, GB/s of the minimum traffic, arithmetic intensity, the fraction of the roofline
// (stored or on-the-fly ceilings), peak extra memory (tracked scratch, and RSS growth for the
// host), and ratios to BLAS baselines timed in the same run: the plain GEMM of the same shape
// (× the pass's useful GEMM count) and, with compare, a materialized baseline of the same math
// (baseline.h). Baselines appear as rows of their own ("blas-gemm", "blas-materialized").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/roofline.h"
#include "harness/table.h"
#include "harness/timer.h"
#include "kernels/linear_cross_entropy/cost.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy {

struct BenchShape {
  std::string name;
  int64_t B = 0, H = 0, V = 0;
};

struct BenchConfig {
  std::vector<std::string> implementations;  // empty: every available implementation
  std::vector<BenchShape> shapes;
  std::vector<DType> dtypes{DType::kF32};
  std::vector<Pass> passes{Pass::kForward, Pass::kBackward, Pass::kFused};
  WLayout layout = WLayout::kHV;
  bool bias = false;
  double soft_cap = 0.0;
  harness::TimingOptions timing;
  int threads = 0;             // Options::num_threads and the BLAS / baseline threads; 0 = all
  bool gemm_baseline = true;   // time the plain GEMM (when a host BLAS is linked)
  bool compare = false;        // time the materialized baseline
  // The reference is plain double loops: shapes with B·H·V above this are skipped unless
  // include_reference_large.
  double reference_max_bhv = 16.0 * 1024 * 1024;
  bool include_reference_large = false;
  bool check_finite = false;   // Options::check_finite (off: time the kernel, not the scan)
  const harness::Roofline* roofline = nullptr;  // ceilings for the fraction column
  uint64_t seed = 1;
  bool progress = true;
};

struct BenchResult {
  std::vector<harness::Row> rows;
  std::vector<std::string> messages;  // skips, fallbacks, notes (also printed as they happen)
};

BenchResult run_bench(const BenchConfig& cfg);

// The row fields in a sensible column order (for CSV and tables).
std::vector<std::string> bench_columns();

}  // namespace tessera::linear_cross_entropy
