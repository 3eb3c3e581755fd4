// Tessera internal (tuning): checking what a sweep times.
//
// Block sizes change how a kernel tiles and orders its sums, never what it computes. A
// candidate whose outputs differ from the default's beyond rounding has found a bug (a tile
// skipped or written twice, a tail left out, a race), and the fastest wrong answer must not be
// tuned in. The sweep (tune/sweep.h) keeps the reference candidate's outputs and compares every
// other candidate's first call with them, output by output:
//
//   |got - want| <= rtol(dtype) * max |want|   over the output's elements,
//
// with max |want| the largest finite magnitude of the reference's output. A non-finite value
// matches only the same non-finite value in the reference (a fully masked row's -inf lse is
// the data's, not the candidate's); any other NaN or Inf is a deviation of inf. Integer outputs
// must match exactly.
//
// Tolerances (default_rtol), relative to the output's largest magnitude: reordered sums in f32
// (block sizes split the H or V reductions differently) differ by a few ulps times sqrt(terms),
// ~1e-6 of the largest value at the sizes tuned; a bf16 / f16 output is rounded once more on
// store, so a reordered sum may flip its last bit (at most 2^-7 / 2^-10 of the largest value).
// The tolerances are 2^-6 for bf16 and 2^-9 for f16 (two such flips, four at the top of a
// binade) and 1e-4 for f32 (~840 ulps of the largest value): well above reordering and
// rounding, well below what a dropped, doubled or misplaced tile does (terms of the size of the
// values themselves).
//
// The reference is the default (what the library runs untuned, and what `tessera check` holds
// to the oracle), or the first candidate that ran when the default failed.
#pragma once

#include <string>
#include <vector>

#include "tune/sweep.h"

namespace tessera::tune {

// Tolerance of an output of `dtype`, as a fraction of the reference's largest |value|; 0 for
// integers (exact).
double default_rtol(DType dtype) noexcept;

struct OutputDeviation {
  std::string output;      // the output with the largest deviation relative to its tolerance
  double max_abs = 0;      // its largest |got - want| (inf: a non-finite mismatch)
  double tolerance = 0;    // its absolute tolerance
  int64_t index = -1;      // the element where max_abs was found
  double got = 0, want = 0;
  bool ok() const { return max_abs <= tolerance; }
  std::string str() const;  // "dw: max |dev| 0.5 at [17] (got 0.1, want 0.6) > tolerance 1e-05"
};

// Holds the reference outputs of one sweep.
class OutputCheck {
 public:
  explicit OutputCheck(OutputsFn outputs) : outputs_(std::move(outputs)) {}
  bool enabled() const { return static_cast<bool>(outputs_); }
  // Gives up checking (the check itself failed): enabled() is false from now on.
  void stop() {
    outputs_ = {};
    ref_.clear();
  }
  bool has_reference() const { return !ref_.empty(); }
  // Zero-fills the outputs before a checked call, so that stale results of the previous
  // candidate cannot pass for this one's.
  void prepare() const;
  // The last call's outputs become the reference (host copies).
  void take_reference();
  // The last call's outputs against the reference. Error(kInternal) when the outputs changed
  // name, dtype or size between calls.
  OutputDeviation compare() const;

 private:
  struct Ref {
    std::string name;
    Tensor host;
    double tolerance = 0;
  };
  OutputsFn outputs_;
  std::vector<Ref> ref_;
};

}  // namespace tessera::tune
