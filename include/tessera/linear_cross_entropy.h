// Tessera: fused linear + softmax cross-entropy (large-vocabulary LM head).
//
// Computes, per token t (x's leading axes flattened to B tokens):
//   z      = x_t · W (+ bias);   if softcap c > 0:  z = c · tanh(z / c)
//   lse    = logsumexp_j z_j                                  (f32 or wider)
//   nll    = lse − z[label_t]
//   ce     = (1 − ε)·nll + ε·(lse − mean_j z_j)               (label smoothing ε)
//   loss_t = weight_t · (ce + z_loss_weight · lse²),  weight_t = token_weight_t · class_weight[label_t]
// Rows whose label == ignore_index have loss 0 and count nowhere. Reductions: none (per token),
// sum, mean (Σ loss_t / Σ weight_t over non-ignored rows; 0 when that is 0). With class weights
// and no token weights, mean is PyTorch's cross_entropy(weight=...) exactly: Σ w[y]·nll / Σ w[y].
// Implementations never materialize the B×V logits (the reference may; it says so).
// See docs/kernels/linear_cross_entropy.md for the full contract.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/exec.h"
#include "tessera/tensor.h"

namespace tessera::linear_cross_entropy {

inline constexpr const char* kKernelName = "linear_cross_entropy";

enum class Reduction : uint8_t { kNone, kSum, kMean };
const char* reduction_name(Reduction r) noexcept;
Reduction parse_reduction(const std::string& s);  // "none" | "sum" | "mean"

// Layout of the classifier weight in memory.
//   kHV: w is [H, V], row-major (x @ w).
//   kVH: w is [V, H], row-major (PyTorch lm_head.weight; x @ w.T).
//   kAuto: taken from the view: a 2-D view whose shape matches [H, V] or [V, H] and that is
//          contiguous (or a transposed view of one) picks the layout. A square w (H == V) is
//          ambiguous and an error: PyTorch, Liger and CCE pass [V, H], x @ w would take [H, V].
enum class WLayout : uint8_t { kAuto, kHV, kVH };
const char* w_layout_name(WLayout l) noexcept;
WLayout parse_w_layout(const std::string& s);  // "auto" | "hv" | "vh"

// Tile sizes over tokens (b), hidden (h) and vocabulary (v). A backend documents how it uses
// them and validates them (validate_block_sizes); the generic API imposes nothing.
struct BlockSizes {
  int64_t b = 1024;
  int64_t h = 512;
  int64_t v = 2048;
  bool operator==(const BlockSizes& o) const { return b == o.b && h == o.h && v == o.v; }
  std::string str() const;  // "b=1024,h=512,v=2048"
};

// Math options; the execution options (implementation, threads, stream, budget, autotune,
// finiteness check) are the shared ExecOptions (tessera/exec.h).
struct Options : ExecOptions {
  Reduction reduction = Reduction::kMean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;  // ε in [0, 1]
  double z_loss_weight = 0.0;    // coefficient of lse², >= 0
  double softcap = 0.0;         // c > 0 enables c·tanh(z/c); 0 disables
  WLayout w_layout = WLayout::kAuto;
  bool return_argmax = false;    // fill ForwardOutputs::argmax
  // compute() / compute_with_grad() only: also allocate and fill Result::z_loss / ::accuracy
  // (the view API fills ForwardOutputs::z_loss / ::accuracy when they are given).
  bool return_z_loss = false;
  bool return_token_accuracy = false;
  // Skip ignored tokens before any GEMM (host inputs, when at least 1/16 of the tokens are
  // ignored): time scales with the tokens that count, for a copy of the kept rows of x (and a
  // compact dx in backward). Loss, dx, dw and dbias are unchanged (dx of ignored rows is 0 either
  // way); lse of ignored rows is unspecified (0 when skipped). Not applied when an argmax output
  // is asked for (a prediction for every token). false: every row is computed and the lse of
  // ignored rows is their real logsumexp.
  bool skip_ignored = true;
  // Vocab-parallel partial form (docs/DISTRIBUTED.md): 0 = off. Else w (and bias) hold a slice of
  // V of the vocab_total classes and labels are RELATIVE to it: a label in [0, V) is a class of
  // the slice, one in (−vocab_total, 0) or [V, vocab_total) a class held elsewhere; ignore_index
  // must lie outside (−vocab_total, vocab_total). class_weights are all vocab_total weights,
  // rotated so that entry c is class c of the slice (the label's weight is entry label mod
  // vocab_total). forward_partial() writes the slice's per-token statistics; backward() takes
  // the GLOBAL lse and writes this slice's dw, dbias and its share of dx (the caller sums dx over
  // the slices). ε/V of label smoothing uses vocab_total. Not with forward_backward, z_loss or
  // accuracy outputs (the caller forms them from the combined statistics).
  int64_t vocab_total = 0;

  // Unset: tuned table -> autotune-on-miss (if enabled) -> backend defaults.
  std::optional<BlockSizes> block_sizes;
};

// Inputs. x: [..., H] float; w: [H, V] or [V, H] float (same dtype as x); bias: [V] float;
// labels: [...] i32/i64 matching x's leading axes; token_weights: [...] f32 matching them — a
// weight per TOKEN (loss_t scaled by it); class_weights: [V] f32, finite and >= 0 — PyTorch's
// `weight` / Liger's `ce_weight`, PyTorch's definition: the nll of token t is scaled by
// class_weights[label_t] (and the mean divides by their sum), the label-smoothing term by each
// class's own weight (docs/kernels/linear_cross_entropy.md); host memory only for now.
struct Inputs {
  TensorView x;
  TensorView w;
  std::optional<TensorView> bias;
  TensorView labels;
  std::optional<TensorView> token_weights;
  std::optional<TensorView> class_weights = std::nullopt;  // (a default: older brace-inits stay warning-free)
};

// Outputs of the forward pass (caller-allocated, on the inputs' device, contiguous):
//   loss: f32, shape = labels' shape for kNone, 0-d (shape {}) for kSum / kMean
//   lse:  f32, shape = labels' shape: the row's logsumexp; for ignored rows unspecified with
//         Options::skip_ignored (the default: 0 when they were skipped), real without it
//   argmax: i64, shape = labels' shape (first maximal index), only when return_argmax.
//   z_loss: f32, loss's shape: the z-loss part of loss alone, weight_t · z_loss_weight · lse_t²,
//           reduced like loss (Liger's return_z_loss). Host memory only for now.
//   accuracy: f32, 0-d: the fraction of non-ignored tokens whose argmax is their label (Liger's
//           return_token_accuracy; unweighted; 0 when every token is ignored), from the argmax
//           the forward computes anyway. Host memory only for now.
struct ForwardOutputs {
  TensorView loss;
  TensorView lse;
  std::optional<TensorView> argmax;
  std::optional<TensorView> z_loss = std::nullopt;
  std::optional<TensorView> accuracy = std::nullopt;
};

// Outputs of the partial form's forward (Options::vocab_total > 0), f32 of labels' shape, over
// the slice's classes c (z after bias and soft cap, σ = class weights or 1):
//   lse:         log Σ_c exp(z_c)
//   label_logit: z_label when the label is a class of the slice, else 0 (ignored rows: 0)
//   logit_sum:   Σ_c σ_c·z_c
//   argmax, max_logit (both or neither; with return_argmax): the slice's first maximal class and its z
// Combined over the slices: lse = logsumexp of the lse's, z_y and Σσz = sums; then
// loss_t = weight_t·[(1−ε)(lse − z_y) + λ·lse²] + token_weight_t·ε/vocab_total·(Σσ·lse − Σσz).
struct PartialOutputs {
  TensorView lse;
  TensorView label_logit;
  TensorView logit_sum;
  std::optional<TensorView> argmax = std::nullopt;
  std::optional<TensorView> max_logit = std::nullopt;
};

// Gradients (caller-allocated, contiguous, on the inputs' device). dx like x (dtype f32 or x's
// dtype), dw in w's layout (dtype f32 or w's dtype), dbias [V] (f32 or bias's dtype; only when
// bias is given). Accumulation is f32 whatever the storage dtype.
// Each may be left out (dx, dw: an empty TensorView{}; dbias: nullopt, even with a bias): nothing
// is written there, and cpu, cpu_v2 and cuda skip its work — a frozen w costs no dw GEMM and no
// dw accumulator (the logits and dx GEMMs remain: two of the three); the reference computes it
// into scratch. The gradients given are the same bits as with all three, except where a
// memory_budget puts a 16-bit dw in vocabulary slices (cpu) or limits cuda's chunk rows: without
// dw (or a 16-bit dbias) the route or the chunks may differ, and dx, dbias are within rounding.
// None at all: forward_backward runs the forward alone (its bits), backward runs nothing and
// returns "(no gradient asked for)".
struct Gradients {
  TensorView dx;
  TensorView dw;
  std::optional<TensorView> dbias;
};

// Argument order everywhere: inputs, then outputs, then options.
// grad_loss: upstream gradient of `loss`. f32; 0-d for kSum / kMean, labels' shape for kNone.
// lse: the forward's lse (an input of backward that saves recomputing it), when you have it.
// Each returns the name of the implementation that ran ("(empty batch)" when nothing had to).
std::string forward(const Inputs& in, const ForwardOutputs& out, const Options& opt = {});
std::string backward(const Inputs& in, const TensorView& grad_loss, const Gradients& grads,
                     const Options& opt = {});
std::string backward(const Inputs& in, const TensorView& grad_loss, const TensorView& lse,
                     const Gradients& grads, const Options& opt = {});
// The partial form's forward (Options::vocab_total > 0 required).
std::string forward_partial(const Inputs& in, const PartialOutputs& out, const Options& opt);
// Loss and gradients in one pass (training). grad_loss as in backward.
std::string forward_backward(const Inputs& in, const TensorView& grad_loss, const ForwardOutputs& out,
                             const Gradients& grads, const Options& opt = {});

// Convenience wrappers that allocate outputs on the inputs' device.
struct Result {
  Tensor loss, lse, argmax;              // argmax undefined unless requested
  Tensor z_loss, accuracy;               // undefined unless return_z_loss / return_token_accuracy
  Tensor dx, dw, dbias;                  // undefined unless gradients were asked for
  std::string implementation;            // which implementation ran
};
Result compute(const Inputs& in, const Options& opt = {});
// Gradients for an upstream gradient of 1 (ones per token for kNone). Gradient dtypes follow
// the inputs' dtypes.
Result compute_with_grad(const Inputs& in, const Options& opt = {});

// ---- introspection ----
using tessera::ImplementationInfo;
std::vector<ImplementationInfo> implementations();

// Validates block sizes for a named implementation; throws Error(kInvalidArgument) naming the
// broken constraint.
void validate_block_sizes(const std::string& implementation, const BlockSizes& bs);

}  // namespace tessera::linear_cross_entropy
