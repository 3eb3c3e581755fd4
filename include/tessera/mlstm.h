// Tessera: mLSTM, the matrix-memory cell of xLSTM — forward and backward with resets, in the
// layout of PyPI `mlstm_kernels` (so its users can switch).
//
// Inputs: q, k [B, NH, S, DHQK], v [B, NH, S, DHV] (one of f32, bf16, f16, shared), gate
// pre-activations i, f [B, NH, S] (any float dtype). States are computed in f32, the gates'
// cumulative sums and stabilizers in double on cpu (the reference: double throughout). Per (b, head), from the state (C [DHQK, DHV], n [DHQK], m scalar), by
// default zeros (c0, n0, m0 set it: f32 [B, NH, DHQK, DHV], [B, NH, DHQK], [B, NH]), for t = 0..S−1:
//
//   logf_t = logsigmoid(f_t)
//   m_t    = max(logf_t + m_{t−1}, i_t)
//   F_t    = exp(logf_t + m_{t−1} − m_t),   I_t = exp(i_t − m_t)
//   C_t    = F_t·C_{t−1} + I_t·k_t v_tᵀ,    n_t = F_t·n_{t−1} + I_t·k_t
//   q̂_t    = q_t / √DHQK
//   h_t    = (C_tᵀ q̂_t) / (max(|n_tᵀ q̂_t|, exp(−m_t)) + eps)          eps default 1e-6
//
// (C, n) are stabilized by m: the true state is C·e^m, n·e^m. The last state (C, n, m) at t = S−1
// can be returned (f32) and fed back as the initial state of the next call: two calls = one call.
//
// Resets: an optional mask [B, S] (integer; nonzero = reset). A reset at t ≥ 1 starts step t
// from the zero state C = 0, n = 0, m = 0, exactly as if the sequence began at t; the initial
// state is used at t = 0 and a reset at t = 0 has no effect. Nothing crosses a reset, forward or
// backward.
//
// Backward, from dh [B, NH, S, DHV] and optionally upstream gradients of the last state
// (dc_last, dn_last, f32): dq, dk, dv, di, df and, with an initial state, dc0, dn0 (f32). The
// stabilizer m is held constant in the backward (as `mlstm_kernels` does): since the stabilized
// quotient does not depend on m when eps = 0, the gradients of anything computed from h are then
// exact; with eps > 0 they omit the eps·∂e^{m}/∂(i, f) term (of relative size eps/den: large only
// when m ≳ 14 and |q̂ᵀn| is tiny). dc_last/dn_last are exact for a next call (which depends on
// C·e^m and n·e^m only); a loss on the stabilized c_last/n_last themselves would also need
// −(⟨dC, C⟩ + ⟨dn, n⟩)·∂m_last/∂(i, f), which is left out. There is no dm0.
//
// Devices: every array of a call lives on q's device — host memory (cpu, reference) or one CUDA
// device (cuda: read and written in their own dtypes, nothing converted).
//
// Limits: S ≥ 1, DHQK and DHV ≥ 1; each backend names its own limit on DHQK/DHV (cpu:
// ≤ 1024 each, chunk_size ≤ 1024; cuda: ≤ 1024 each, chunk_size ≤ 128). See docs/kernels/mlstm.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/exec.h"
#include "tessera/tensor.h"

namespace tessera::mlstm {

// Math options; execution options (implementation, threads, ...) are the shared ExecOptions.
struct Options : ExecOptions {
  double eps = 1e-6;       // ≥ 0, finite
  int64_t chunk_size = 0;  // chunkwise backends: the chunk length; 0 = the backend's default (64)
};

// Optional tensors are empty views (data == nullptr, no shape).
struct Inputs {
  TensorView q, k, v, i, f;  // [B, NH, S, DHQK] ×2, [B, NH, S, DHV], [B, NH, S] ×2
  TensorView resets;         // [B, S] i32 or i64 (nonzero = reset), optional
  TensorView c0, n0, m0;     // initial state, all three or none (f32)
};

struct LastStates {  // optional outputs (f32): all three or none
  TensorView c, n, m;  // [B, NH, DHQK, DHV], [B, NH, DHQK], [B, NH]
};

struct Grads {
  TensorView dq, dk, dv;  // like q, k, v (their dtype or f32)
  TensorView di, df;      // [B, NH, S] (the gates' dtype or f32)
  TensorView dc0, dn0;    // f32, required exactly when the initial state was given
};

// h [B, NH, S, DHV] (q's dtype or f32). Throws Error(kInvalidArgument) before writing anything
// when a shape, dtype or option is wrong. Each returns the implementation that ran.
std::string forward(const Inputs& in, const TensorView& h, const LastStates& last = {}, const Options& opt = {});
// Gradients from dh (f32 or q's dtype) and optional dc_last, dn_last (f32).
std::string backward(const Inputs& in, const TensorView& dh, const Grads& grads, const Options& opt = {},
                     const TensorView& dc_last = {}, const TensorView& dn_last = {});
// forward, then backward, in one call (the same checks, all before anything is written): the cpu
// backend forms the chunk states once for both, where the two calls form them twice.
std::string forward_backward(const Inputs& in, const TensorView& h, const LastStates& last, const TensorView& dh,
                             const Grads& grads, const Options& opt = {}, const TensorView& dc_last = {},
                             const TensorView& dn_last = {});

std::vector<ImplementationInfo> implementations();

}  // namespace tessera::mlstm
