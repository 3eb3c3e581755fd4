// attention: the BLAS-materialized baseline of the bench, timed in the same run as the kernels.
//
// The plain unfused math that a framework's "math" path runs, one (sequence, head) at a time:
// S = scale·Q·Kᵀ into an Sq×Sk f32 buffer (sgemm), row softmax (causal: masked keys get −inf),
// O = P·V (sgemm); the fused pass keeps P and adds dP = dO·Vᵀ, dV += Pᵀ·dO, dS = P∘(dP − δ)·scale
// with δ = rowsum(P∘dP), dQ = dS·K, dK += dSᵀ·Q (five more sgemms). Inputs are f32 copies made
// outside the clock. Extra memory: two Sq×Sk f32 buffers (P, dP) — per head, where a framework
// keeps P for every head (B·H·S² floats). Forward and fused only; no ALiBi / softcap / windows
// (the bench uses none). Unavailable without a host BLAS.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/exec.h"
#include "tessera/tensor.h"

namespace tessera::attention {

struct BaselineInputs {
  int64_t B = 0, S = 0, H = 0, Hkv = 0, D = 0;  // Sq = Sk = S, Dv = D
  bool causal = false;
  const Tensor* q = nullptr;   // [B, S, H, D] host, any float dtype
  const Tensor* k = nullptr;   // [B, S, Hkv, D]
  const Tensor* v = nullptr;   // [B, S, Hkv, D]
  const Tensor* d_o = nullptr; // [B, S, H, D]
  int threads = 0;             // elementwise threads (0 = all)
};

struct MaterializedBaseline {
  std::string description;
  std::function<void()> run;
  // The last run's f32 results, in the inputs' layouts: o, and for fused dq, dk, dv (tests).
  std::function<std::vector<Tensor>()> results;
};

// Throws Error(kUnsupported) when no host BLAS is linked or the pass is backward.
MaterializedBaseline make_materialized_baseline(const BaselineInputs& in, Pass pass);

}  // namespace tessera::attention
