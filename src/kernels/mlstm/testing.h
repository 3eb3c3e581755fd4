// mlstm: deterministic cases, the check grid and parity against the reference — shared by the
// GoogleTest suites and `tessera check`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/parity.h"
#include "tessera/mlstm.h"

namespace tessera::mlstm::testing {

struct CaseSpec {
  std::string label = "case";
  int64_t B = 1, NH = 2, S = 7, DK = 8, DV = 8;
  DType dtype = DType::kF32;       // q, k, v
  DType gate_dtype = DType::kF32;  // i, f
  std::string resets = "none";  // none | chunk (at chunk boundaries) | inside | every | pair | random
  bool initial_state = false;
  float gate_scale = 3.0f;      // i, f uniform in ±gate_scale (+2 on f: mostly remembering)
  bool last_states = true;      // the forward returns (C, n, m) at S−1, the backward takes dc_last, dn_last
  Options opt;                  // chunk_size, eps, threads
  uint64_t seed = 1;
  std::string name() const;
};

struct CaseData {
  Tensor q, k, v, i, f, resets, c0, n0, m0;  // resets / states undefined when absent
  Tensor dh, dc_last, dn_last;
  Inputs inputs() const;
  CaseData to(Device dev) const;  // every defined tensor copied to `dev`
};
CaseData make_case(const CaseSpec& s);

harness::Tolerance tolerance(const CaseSpec& s);
// `implementation` runs on copies of the inputs and outputs on `dev` (the reference on the host).
harness::ParityReport check_parity(const CaseSpec& s, const std::string& implementation, Pass pass, Device dev = {});
std::vector<CaseSpec> check_grid(bool quick);

// Every output of a forward (h, last states) and a backward (dq, dk, dv, di, df, dc0, dn0) of
// `implementation` on `dev` (eps 1e-6, the given chunk), as f32 host vectors in that order; `d`
// has an initial state (its gradient is asked for).
std::vector<std::vector<float>> forward_backward_outputs(const CaseData& d, const std::string& implementation,
                                                         int64_t chunk, Device dev = {});
// A case (NH 3, S 29, random resets, an initial state; f32) whose forget gates erase the state
// (f = `erase`: −inf, −FLT_MAX) at step 0, a chunk's first and last step (chunks of 8), twice in
// one chunk and beside resets.
CaseData erasing_forget_case(float erase);

}  // namespace tessera::mlstm::testing
