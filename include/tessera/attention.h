// Tessera: scaled dot-product attention (FlashAttention layout), forward and backward.
//
// Dense form:  q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv] -> o [B, Sq, Hq, Dv],
//              lse [B, Hq, Sq] (f32).
// Varlen form: q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv] with int32 cu_seqlens_q / _k of
//              N+1 offsets (sequence n is rows cu[n] .. cu[n+1]) -> o [Tq, Hq, Dv], lse [Hq, Tq].
// Hq % Hkv == 0 (MHA, GQA, MQA): query head h reads kv head h / (Hq / Hkv).
//
// Per sequence, with off = Sk − Sq (bottom-right alignment, as FlashAttention >= 2.1), for query
// row i and key j:
//   s_ij = scale · q_i·k_j                          (scale defaults to 1/sqrt(D))
//   if softcap c > 0:  s_ij = c · tanh(s_ij / c)
//   if ALiBi:          s_ij += −slope_h · |i + off − j|
//   if bias:           s_ij += bias[b, h, i, j]     (dense form; each dim broadcast when 1)
//   allowed(i, j) =  (!causal || j <= i + off)
//                 && (window_left  < 0 || j >= i + off − window_left)
//                 && (window_right < 0 || j <= i + off + window_right)
//                 && (no segment ids || seg_q[i] == seg_k[j])
//   lse_i = log Σ_{allowed j} exp(s_ij),   o_i = Σ_{allowed j} exp(s_ij − lse_i) · z_ij · v_j
// with z_ij = 1 without dropout; with dropout_p > 0, z_ij = 0 (dropped) or 1 / (1 − dropout_p)
// (kept) by a counter-based Philox draw from dropout_seed and (sequence, query head, i, j): the
// same z in forward and backward, on every implementation (docs/kernels/attention.md, "dropout").
// lse is the undropped one.
// A row that sees no key has o_i = 0 and lse_i = −inf (never NaN; FlashAttention 2's non-split
// forward writes +inf there).
// Backward takes dO and the forward's o and lse and returns dq, dk, dv (f32 accumulation; dk and
// dv summed over the query heads that share a kv head), and dbias = dL/ds_ij summed over the
// bias's broadcast dims when asked for. See docs/kernels/attention.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/exec.h"
#include "tessera/tensor.h"

namespace tessera::attention {

inline constexpr const char* kKernelName = "attention";

// Tiles: q query rows × kv keys. A backend documents how it uses them and validates them
// (validate_block_sizes); the generic API imposes nothing.
struct BlockSizes {
  int64_t q = 128;
  int64_t kv = 256;
  bool operator==(const BlockSizes& o) const { return q == o.q && kv == o.kv; }
  std::string str() const;  // "q=128,kv=256"
};

// Math options; execution options (implementation, threads, ...) are the shared ExecOptions.
struct Options : ExecOptions {
  std::optional<double> scale;  // default 1/sqrt(D); must be finite and > 0
  double softcap = 0.0;         // c > 0 enables c·tanh(s/c); 0 disables
  bool causal = false;          // bottom-right aligned: j <= i + (Sk − Sq)
  int64_t window_left = -1;     // keys allowed left of i + off; −1 = unbounded
  int64_t window_right = -1;    // keys allowed right of i + off; −1 = unbounded
  // Backward: bitwise-repeatable gradients. false lets cudnn take cuDNN's faster non-deterministic
  // engine (as PyTorch's SDPA does; 1.1-1.4x on an H200); cpu and cuda are deterministic either way.
  bool deterministic = true;
  // Dropout on the attention probabilities (FlashAttention's dropout_p): in [0, 1); > 0 needs
  // Inputs::dropout_seed. 0 (the default) is exactly no dropout.
  double dropout_p = 0.0;
  // Unset: the implementation's defaults.
  std::optional<BlockSizes> block_sizes;
};

// Inputs (host or device memory, contiguous row-major). q, k, v share one dtype (f32, bf16, f16).
//   alibi_slopes: f32 [Hq] or [B, Hq] (dense) / [N, Hq] (varlen).
//   segment_ids_q / _k: i32 [B, Sq] / [B, Sk] (dense form only), both or neither: a query sees a
//     key only when their ids are equal (packed sequences).
//   cu_seqlens_q / _k: i32 [N+1], both or neither; present = the varlen form.
//   dropout_seed: i32 [2] on the inputs' device, the Philox key of the dropout mask (read by the
//     kernels, so a device seed drawn by the framework's generator never comes to the host);
//     required when dropout_p > 0. Draw a new one per step: the same seed gives the same mask.
//   bias: additive attention bias [B|1, Hq|1, Sq|1, Sk|1] (dense form only; a dim of 1 is
//     broadcast), f32 or q's dtype, added to the scores after the soft cap and ALiBi; −inf entries
//     mask (a row whose keys are all −inf sees nothing: o = 0, lse = −inf); NaN and +inf refused
//     under check_finite.
struct Inputs {
  TensorView q, k, v;
  std::optional<TensorView> alibi_slopes;
  std::optional<TensorView> segment_ids_q, segment_ids_k;
  std::optional<TensorView> cu_seqlens_q, cu_seqlens_k;
  std::optional<TensorView> dropout_seed;
  std::optional<TensorView> bias;
};

// o: q's dtype or f32, shape [..., Hq, Dv] as above. lse: f32 [B, Hq, Sq] or [Hq, Tq].
struct ForwardOutputs {
  TensorView o;
  TensorView lse;
};

// The forward's o and lse and the upstream gradient grad_o (shape of o; dtype f32 or q's dtype).
struct BackwardInputs {
  TensorView o;
  TensorView lse;
  TensorView grad_o;
};

// dq like q, dk like k, dv like v; each f32 or its input's dtype. dbias (only with a bias; absent
// or an empty view: not computed, which spares its pass): the bias's shape, f32 or its dtype.
struct Gradients {
  TensorView dq, dk, dv;
  std::optional<TensorView> dbias;
};

// Each returns the name of the implementation that ran ("(empty)" when nothing had to).
std::string forward(const Inputs& in, const ForwardOutputs& out, const Options& opt = {});
std::string backward(const Inputs& in, const BackwardInputs& saved, const Gradients& grads,
                     const Options& opt = {});
// Forward, then backward with its own o and lse (training).
std::string forward_backward(const Inputs& in, const TensorView& grad_o, const ForwardOutputs& out,
                             const Gradients& grads, const Options& opt = {});

// Convenience wrappers that allocate outputs (o in q's dtype, gradients in the inputs' dtypes)
// on the inputs' device.
struct Result {
  Tensor o, lse;
  Tensor dq, dk, dv;           // undefined unless gradients were asked for
  Tensor dbias;                // with gradients and a bias
  std::string implementation;  // which implementation ran
};
Result compute(const Inputs& in, const Options& opt = {});
Result compute_with_grad(const Inputs& in, const TensorView& grad_o, const Options& opt = {});

// ---- introspection ----
using tessera::ImplementationInfo;  // tessera/exec.h
std::vector<ImplementationInfo> implementations();

// Throws Error(kInvalidArgument) naming the broken constraint (kNotFound for an unknown name).
void validate_block_sizes(const std::string& implementation, const BlockSizes& bs);

}  // namespace tessera::attention
