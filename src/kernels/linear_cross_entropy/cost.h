// linear_cross_entropy: cost model (FLOPs, minimum bytes, transcendentals) per pass, for the
// performance harness (src/harness/cost.h explains the terms).
#pragma once

#include <string>

#include "harness/cost.h"
#include "tessera/dtype.h"
#include "tessera/exec.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy {

struct CostShape {
  int64_t B = 0, H = 0, V = 0;
  DType dtype = DType::kF32;        // x and w
  DType label_dtype = DType::kI64;
  bool bias = false;
  DType bias_dtype = DType::kF32;
  bool weights = false;             // per-token f32 weights
  Reduction reduction = Reduction::kMean;
  double label_smoothing = 0.0;
  double z_loss_weight = 0.0;
  double soft_cap = 0.0;
  bool argmax = false;
  DType grad_dtype = DType::kF32;   // dx / dw / dbias storage
};

// GEMMs of B·H·V multiply-adds (2·B·H·V flops each) the math needs: fwd 1 (logits), bwd 2
// (dx, dw), fused 3.
int useful_gemms(Pass pass);
// GEMMs an implementation issues. fwd 1; bwd 3 (the logits are recomputed: nothing B×V is
// kept between forward and backward). fused: "reference" runs forward, then backward with
// recomputation: 4. Every other implementation is ASSUMED to issue 3 (logits once per token
// chunk, then dx and dw from them); a backend that recomputes in its fused pass should be
// listed here (this table is the only place that knows).
int issued_gemms(const std::string& implementation, Pass pass);

harness::Cost cost(const CostShape& s, Pass pass, const std::string& implementation = "");

}  // namespace tessera::linear_cross_entropy
