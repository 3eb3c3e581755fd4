// Tessera internal: linear_cross_entropy skips ignored tokens before any GEMM (issue #17).
//
// With Options::skip_ignored (the default) and host inputs, the API hands the backends a problem
// of the kept rows only (label != ignore_index): x rows, labels and weights are gathered into
// compact buffers, the backend writes compact per-token outputs, and they are scattered back to
// the caller's rows, ignored rows getting loss 0, lse 0, argmax 0 and dx 0. Sums and the mean's
// denominator are unchanged (ignored rows count nowhere), so loss, dw and dbias are the same
// numbers; only the time changes: it scales with the tokens that count. The cost: a copy of the
// kept rows of x (and, in backward, a compact dx) — at most the size of x, never logits-sized.
#pragma once

#include <optional>
#include <vector>

#include "kernels/linear_cross_entropy/impl.h"
#include "tessera/tensor.h"

namespace tessera::linear_cross_entropy {

class Compaction {
 public:
  // A compaction of `p` when it is on the host and at least 1/kMinIgnoredShare of its rows are
  // ignored; nullopt otherwise (device data, or too little to gain for the copy of the kept rows).
  static constexpr int64_t kMinIgnoredShare = 16;
  static std::optional<Compaction> make(const Problem& p);

  const Problem& problem() const { return q_; }  // the kept rows (B may be 0)
  int64_t kept() const { return static_cast<int64_t>(rows_.size()); }

  // Compact views of the caller's outputs / upstream values (scalar losses pass through).
  ForwardOut forward_out(const ForwardOut& full);
  GradIn grad_in(const GradIn& full);
  GradOut grad_out(const GradOut& full);
  // Back to the caller's rows; ignored rows are zero.
  void scatter_forward(const ForwardOut& full) const;
  void scatter_backward(const GradOut& full) const;

 private:
  Problem p_, q_;
  std::vector<int64_t> rows_;  // kept row indices of p
  const float* gather(const float* src, Tensor& dst) const;

  Tensor x_, labels_, weights_, token_weights_, loss_, lse_, argmax_, grad_, lse_in_, dx_;
  bool per_token_loss_ = false;
  DType dx_dtype_ = DType::kF32;
};

}  // namespace tessera::linear_cross_entropy
