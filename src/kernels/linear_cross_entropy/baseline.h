// linear_cross_entropy: BLAS baselines for the bench, timed in the same run as the kernels.
//
// (The plain GEMM floor is timed by the generic bench driver, harness/bench.h.)
//   materialized  the plain unfused math with the same BLAS: logits GEMM into a B×V f32 buffer,
//                 row-wise bias / soft cap / softmax cross-entropy (mean over the tokens), and
//                 for bwd / fused dlogits in place plus dx = dlogits·Wᵀ and dw = xᵀ·dlogits.
//                 bwd recomputes the logits (given lse, like the kernel's backward), fused reuses
//                 them: 3 GEMMs. It supports the bench's options (bias, soft cap, layout); it
//                 has no weights / ignore_index / smoothing / z-loss (the bench uses none).
// Both compute in f32 from f32 copies of the inputs (converted once, outside the clock).
// Unavailable without a host BLAS (blas::available()).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "tessera/exec.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy {

struct BaselineInputs {
  int64_t B = 0, H = 0, V = 0;
  DType dtype = DType::kF32;
  WLayout layout = WLayout::kHV;  // kHV or kVH
  const void* x = nullptr;        // host, dtype
  const void* w = nullptr;        // host, dtype, layout
  const void* bias = nullptr;     // host, bias_dtype, or nullptr
  DType bias_dtype = DType::kF32;
  const int64_t* labels = nullptr;  // host [B], all in [0, V)
  double softcap = 0.0;
  int threads = 0;                // elementwise threads (0 = all); BLAS threads are set apart
};

class Baseline {
 public:
  virtual ~Baseline() = default;
  virtual void run() = 0;
  // Short description of what run() does ("sgemm f32 2048x32768x1024", ...).
  virtual std::string description() const = 0;
  // Loss of the last run (materialized only; NaN for gemm) — a sanity value.
  virtual double loss() const { return std::numeric_limits<double>::quiet_NaN(); }
};

// Throws Error(kUnsupported) with the reason when no host BLAS is linked.
std::unique_ptr<Baseline> make_materialized_baseline(const BaselineInputs& in, Pass pass);

}  // namespace tessera::linear_cross_entropy
