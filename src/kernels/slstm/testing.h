// slstm: deterministic cases, the check grid and parity of an implementation against the
// reference — shared by the GoogleTest suites and `tessera check`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/parity.h"
#include "tessera/slstm.h"

namespace tessera::slstm::testing {

struct CaseSpec {
  std::string label = "case";
  int64_t B = 2, S = 5, NH = 2, DH = 8;
  DType dtype = DType::kF32;
  std::string resets = "none";  // none, random, every (each step), at1 (t = 1 only)
  float gate_scale = 1.0f;      // wx uniform in ±gate_scale (50: saturated gates)
  bool initial = false;         // an initial state (h0, c0, n0 > 0, m0)
  bool last = true;             // ask for the last state (and give its upstream gradients)
  int num_threads = 0;
  uint64_t seed = 1;
  std::string name() const;
};

// Host tensors of a case, rounded to its dtype when generated (every implementation sees the same numbers).
struct CaseData {
  Tensor wx, r, b, resets, h0, c0, n0, m0, dh, dh_last, dc_last, dn_last;
  Inputs inputs() const;
  Upstream upstream() const;
};
CaseData make_case(const CaseSpec& spec);

harness::Tolerance tolerance(const CaseSpec& spec, bool gradient);

harness::ParityReport check_parity(const CaseSpec& spec, const std::string& implementation, Pass pass,
                                   Device device = Device{});

// Shapes from S ∈ {1, 2, 33, 300}, B ∈ {1, 17, 33}, DH ∈ {8, 64, 96, 128}, NH ∈ {1, 4}; reset patterns,
// ±50 gates, initial states, every dtype (a subset that keeps the suite fast).
std::vector<CaseSpec> check_grid(bool quick);

}  // namespace tessera::slstm::testing
