// Tessera harness: the cost model of one kernel call (generic; each kernel supplies its own in
// src/kernels/<kernel>/cost.cc).
//
//   flops_useful     the arithmetic the math needs (e.g. the GEMMs of forward + backward)
//   flops_issued     what the implementation actually executes, recomputation included (a
//                    backward that recomputes the forward's logits issues one more GEMM)
//   bytes            the bytes that must move at least: every input read once, every output
//                    written once (no re-reads, no intermediates) — the memory-side lower bound
//   transcendentals  exp / log / tanh evaluations issued
//
// Rates follow: useful GFLOP/s = flops_useful / time; arithmetic intensity = flops_useful /
// bytes; the roofline bound at that intensity is min(peak, intensity · bandwidth).
#pragma once

#include <string>
#include <vector>

namespace tessera::harness {

struct CostTerm {
  std::string what;  // "logits GEMM", "softmax elementwise", "read x", ...
  double flops = 0, bytes = 0, transcendentals = 0;
  bool recomputation = false;  // issued but not useful
};

struct Cost {
  double flops_useful = 0;
  double flops_issued = 0;
  double bytes = 0;
  double transcendentals = 0;
  std::vector<CostTerm> terms;  // the breakdown the totals were summed from
  std::vector<std::string> assumptions;  // what the model assumes about the implementation

  // Adds a term to the totals (useful unless it is recomputation).
  void add(CostTerm t) {
    flops_issued += t.flops;
    if (!t.recomputation) flops_useful += t.flops;
    bytes += t.bytes;
    transcendentals += t.transcendentals;
    terms.push_back(std::move(t));
  }
  double arithmetic_intensity() const { return bytes > 0 ? flops_useful / bytes : 0.0; }
};

}  // namespace tessera::harness
