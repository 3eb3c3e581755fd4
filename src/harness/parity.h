// Tessera harness: deviation of a computed array from an oracle.
//
// Reported as max / mean absolute and relative deviation (not only pass/fail), and checked
// elementwise against a tolerance of the form
//     |got − want| <= atol + rtol·|want|,      atol = atol_scale · max_i |want_i|
// The absolute part is scaled by the oracle's largest magnitude so that entries that cancel to
// ~0 (common in gradients: sums of signed terms) are judged against the tensor's scale, the way
// a rounding error of the inputs propagates, not against their own tiny value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/tensor.h"

namespace tessera::harness {

struct Tolerance {
  double rtol = 0.0;
  double atol_scale = 0.0;
};

// A check grid under construction: add(case) gives every case the next seed, so a case keeps its
// seed whatever is added after it; take() hands the cases over.
template <class Case>
class SeededGrid {
 public:
  explicit SeededGrid(uint64_t first_seed) : seed_(first_seed) {}
  void operator()(Case c) {
    c.seed = seed_++;
    cases_.push_back(std::move(c));
  }
  std::vector<Case> take() { return std::move(cases_); }

 private:
  uint64_t seed_;
  std::vector<Case> cases_;
};

// The dtypes of a check grid: f32 and bf16 in the quick grid, f16 too in the full one.
inline std::vector<DType> check_dtypes(bool quick) {
  if (quick) return {DType::kF32, DType::kBF16};
  return {DType::kF32, DType::kBF16, DType::kF16};
}

struct Deviation {
  int64_t n = 0;
  double max_abs = 0.0, mean_abs = 0.0;
  double max_rel = 0.0, mean_rel = 0.0;  // relative to max(|want|, tiny)
  double ref_scale = 0.0;                // max |want|
  int64_t worst = -1;                    // index with the largest excess over the tolerance
  double worst_got = 0.0, worst_want = 0.0;
  int64_t violations = 0;                // entries outside the tolerance
  int64_t nonfinite = 0;                 // NaN / Inf in got where want is finite
  bool ok() const { return violations == 0 && nonfinite == 0; }
  std::string str() const;  // "max_abs=… mean_abs=… max_rel=… mean_rel=… (n=…, k violations)"
};

Deviation compare(const std::vector<double>& got, const std::vector<double>& want, Tolerance tol);

// Every element of a host tensor as a double, in index order: floating dtypes widened exactly
// (bf16 and f16 through f32), integer ones converted (exact below 2^53). What compare() takes.
std::vector<double> to_doubles(const Tensor& t);

// A host tensor of NaN in `dtype`: an output element an implementation forgets to write shows.
Tensor nan_filled(DType dtype, const Shape& shape);

// The deviation of one output of a kernel (a "field": "loss", "dx", "o", ...).
struct FieldReport {
  std::string field;
  Deviation dev;
};

// One parity check: an implementation against the reference on one case and pass.
struct ParityReport {
  std::string case_name;
  std::string implementation;
  std::string pass;        // pass_name(Pass)
  bool ran = false;        // false: the implementation could not run (see error)
  bool skipped = false;    // could not run because it does not support these inputs
  std::string error;
  std::vector<FieldReport> fields;
  bool ok() const;         // ran and every field within tolerance
  Deviation worst() const; // the largest of each statistic over the fields
};

}  // namespace tessera::harness
