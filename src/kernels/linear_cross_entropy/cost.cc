// linear_cross_entropy: the cost model. Counts per logit (B·V of them) and per token are
// spelled out term by term so a reader can check them against the kernel's math
// (include/tessera/linear_cross_entropy.h):
//
//   forward, per logit   bias add 1 flop; soft cap c·tanh(z/c) 2 flops + 1 tanh; online
//                        logsumexp (max, subtract, add) 3 flops + 1 exp; label smoothing's
//                        Σz 1 flop; argmax 1 compare (counted as a flop)
//   forward, per token   1 log, ~6 flops for the loss (+2 for z-loss)
//   backward, per logit  p = exp(z − lse) 1 flop + 1 exp; dz = scale·(k·p − ε/V − [j=y])
//                        3 flops; soft cap derivative 1 − (z/c)² and product 3 flops; dbias
//                        column sum 1 flop
//   GEMMs                2·B·H·V flops each (useful_gemms / issued_gemms in cost.h)
//
// A recomputed GEMM also recomputes its elementwise epilogue (bias, soft cap): those flops
// and tanh evaluations are issued, not useful. Bytes are the minimum traffic: each input read
// once, each output written once; nothing B×V ever reaches memory.
#include "kernels/linear_cross_entropy/cost.h"

#include "tessera/error.h"

namespace tessera::linear_cross_entropy {

int useful_gemms(Pass pass) {
  switch (pass) {
    case Pass::kForward: return 1;
    case Pass::kBackward: return 2;
    case Pass::kFused: return 3;
  }
  return 0;
}

int issued_gemms(const std::string& implementation, Pass pass) {
  switch (pass) {
    case Pass::kForward: return 1;
    case Pass::kBackward: return 3;
    case Pass::kFused: return implementation == "reference" ? 4 : 3;
  }
  return 0;
}

harness::Cost cost(const CostShape& s, Pass pass, const std::string& implementation) {
  harness::Cost c;
  const double B = static_cast<double>(s.B), H = static_cast<double>(s.H), V = static_cast<double>(s.V);
  const double BV = B * V;
  const double gemm = 2.0 * B * H * V;
  const double in = static_cast<double>(dtype_size(s.dtype));
  const double gsz = static_cast<double>(dtype_size(s.grad_dtype));
  const bool cap = s.soft_cap > 0.0;
  const bool fwd = pass != Pass::kBackward;
  const bool bwd = pass != Pass::kForward;

  // Logits: GEMM plus epilogue (bias, soft cap). `recompute` marks issued-only work.
  auto logits = [&](const std::string& why, bool recompute) {
    c.add({why + ": logits GEMM x·W", gemm, 0, 0, recompute});
    if (s.bias) c.add({why + ": bias add", BV, 0, 0, recompute});
    if (cap) c.add({why + ": soft cap c·tanh(z/c)", 2 * BV, 0, BV, recompute});
  };

  if (fwd) {
    logits("forward", false);
    c.add({"forward: online logsumexp", 3 * BV, 0, BV + B, false});
    if (s.label_smoothing > 0.0) c.add({"forward: label smoothing sum of logits", BV, 0, 0, false});
    if (s.argmax) c.add({"forward: argmax", BV, 0, 0, false});
    c.add({"forward: row loss", (6 + (s.z_loss_weight > 0 ? 2 : 0)) * B, 0, 0, false});
  }
  if (bwd) {
    // Backward alone always recomputes; fused recomputes only when the implementation issues
    // more than the useful 3 GEMMs.
    const int issued = issued_gemms(implementation, pass);
    const bool recompute = pass == Pass::kBackward || issued > useful_gemms(pass);
    if (recompute) logits(pass == Pass::kBackward ? "backward (recomputed)" : "fused (recomputed)", true);
    c.add({"backward: softmax gradient dz", 4 * BV, 0, BV, false});
    if (cap) c.add({"backward: soft cap derivative", 3 * BV, 0, 0, false});
    c.add({"backward: dx = dz·Wᵀ GEMM", gemm, 0, 0, false});
    c.add({"backward: dw = xᵀ·dz GEMM", gemm, 0, 0, false});
    if (s.bias) c.add({"backward: dbias column sum", BV, 0, 0, false});
  }

  // Minimum bytes.
  c.add({"read x", 0, B * H * in, 0, false});
  c.add({"read w", 0, H * V * in, 0, false});
  c.add({"read labels", 0, B * static_cast<double>(dtype_size(s.label_dtype)), 0, false});
  if (s.bias) c.add({"read bias", 0, V * static_cast<double>(dtype_size(s.bias_dtype)), 0, false});
  if (s.weights) c.add({"read weights", 0, B * 4, 0, false});
  if (fwd) {
    c.add({"write loss", 0, (s.reduction == Reduction::kNone ? B : 1.0) * 4, 0, false});
    c.add({"write lse", 0, B * 4, 0, false});
    if (s.argmax) c.add({"write argmax", 0, B * 8, 0, false});
  }
  if (bwd) {
    if (pass == Pass::kBackward) c.add({"read lse", 0, B * 4, 0, false});
    c.add({"read grad_loss", 0, (s.reduction == Reduction::kNone ? B : 1.0) * 4, 0, false});
    c.add({"write dx", 0, B * H * gsz, 0, false});
    c.add({"write dw", 0, H * V * gsz, 0, false});
    if (s.bias) c.add({"write dbias", 0, V * gsz, 0, false});
  }

  if (pass == Pass::kFused) {
    if (implementation == "reference")
      c.assumptions.push_back("reference fused = forward + backward with recomputation: 4 GEMMs issued");
    else
      c.assumptions.push_back("fused assumed to issue 3 GEMMs (logits once per token chunk, then dx "
                              "and dw); if '" + implementation + "' recomputes, issued is 4");
  }
  if (pass == Pass::kBackward)
    c.assumptions.push_back("backward recomputes the logits from x and W: 3 GEMMs issued, 2 useful");
  return c;
}

}  // namespace tessera::linear_cross_entropy
