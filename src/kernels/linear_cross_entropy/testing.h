// linear_cross_entropy: deterministic test cases, the built-in check grid, and parity of an
// implementation against the reference. Used by the GoogleTest suites of every backend and by
// `tessera check`, so that both judge with the same cases and the same tolerances.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness/parity.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy::testing {

struct CaseSpec {
  Shape lead = {7};      // x's leading axes (B = their product); {} = one unbatched example
  int64_t H = 13, V = 37;
  DType dtype = DType::kF32;          // x and w
  WLayout memory_layout = WLayout::kHV;  // how w lies in memory
  bool transposed_view = false;       // pass w as the transposed view of the other layout
  bool bias = false;
  DType bias_dtype = DType::kF32;
  bool weights = false;
  bool class_weights = false;         // per-class weights [V] (PyTorch's weight), one of them 0
  DType label_dtype = DType::kI64;
  double ignore_fraction = 0.15;      // share of rows labelled ignore_index
  bool f32_grads = false;             // dx/dw/dbias stored as f32 (else in the inputs' dtypes)
  double logit_scale = 3.0;           // typical |z|
  Options opt;                        // reduction, smoothing, z-loss, soft cap, argmax, ...
  uint64_t seed = 1;
  std::string name() const;           // short readable description
};

// Inputs made from a CaseSpec (host memory). Values are rounded to the case's dtype when
// generated, so every implementation sees the very same numbers.
struct CaseData {
  Tensor x, w, bias, labels, weights, class_weights;
  Tensor w_view_owner;  // w or its transposed view (shares storage)
  Tensor grad_loss;     // upstream gradient: random per token for kNone, a scalar otherwise
  Inputs inputs() const;
  CaseData to(Device device) const;  // copies every tensor (layout kept)
};
CaseData make_case(const CaseSpec& spec);

// The spec's options for `implementation`, with a square w's layout said (H == V is ambiguous).
Options options_for(const CaseSpec& spec, const std::string& implementation);

// The lse values a comparison may look at: the contract leaves an ignored row's lse unspecified
// under skip_ignored (0 where the host path skipped the row, the true logsumexp where a device
// backend computed it), so those rows are set to 0 in `lse` (memory order of the leading dims).
std::vector<double> specified_lse(const CaseSpec& spec, const CaseData& host, std::vector<double> lse);

// Tolerances per output, justified in testing.cc.
struct Tolerances {
  harness::Tolerance loss, lse, dx, dw, dbias;
};
Tolerances tolerances(const CaseSpec& spec);

using harness::FieldReport;
using harness::ParityReport;

// Runs `implementation` (inputs copied to `device`) and the reference on the same case and
// compares every output. Never throws for an implementation's failure: it is reported.
ParityReport check_parity(const CaseSpec& spec, const std::string& implementation, Pass pass,
                          Device device = Device::cpu());

// The built-in grid: odd shapes, every dtype, every option, both layouts, edge cases.
// quick = a smaller subset (for sanitizer runs).
std::vector<CaseSpec> check_grid(bool quick = false);

}  // namespace tessera::linear_cross_entropy::testing
