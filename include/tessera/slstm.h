// Tessera: slstm — the sLSTM cell of xLSTM (scalar memory, head-wise recurrent weights), forward
// and backward through time, with resets and an initial state.
//
// THE CONTRACT (xlstm's sLSTM with the stabilizer rule; its parameters map by permutes: slstm.md):
//   wx [B, S, 4, NH, DH]  gate pre-activations from the input projection, gates (i, f, z, o)
//   r  [4, NH, DH, DH]    head-wise recurrent weights: ry[g, h, k] = Σ_j h_{t-1}[h, j]·r[g, h, j, k]
//   b  [4, NH, DH]        bias
//   wx, r, b share one dtype: f32, bf16 or f16; gates and states are computed in f32 (the
//   reference in double).
//   State (h, c, n, m) [B, NH, DH] each, f32, zeros unless an initial state is given. Step t:
//     (ī, f̄, z̄, ō) = wx_t + ry + b
//     first step (t = 0 without an initial state, or a reset at t >= 1):
//       m_t = ī,  I = 1,  F = 0
//     else
//       m_t = max(ī, m_{t-1} + logsigmoid(f̄)),  I = exp(ī − m_t),  F = exp(m_{t-1} + logsigmoid(f̄) − m_t)
//     c_t = F·c_{t-1} + I·tanh(z̄),  n_t = F·n_{t-1} + I,  h_t = sigmoid(ō)·c_t / n_t
//   Outputs h [B, S, NH, DH] in f32 or the inputs' dtype (each value the f32 h rounded once: what
//   a bf16 model's next layer takes); optionally the last state (h, c, n, m) [B, NH, DH] f32.
//   Resets: optional mask [B, S] (int32 or int64; nonzero = reset; the CLI widens bool/uint8 .npy). A reset at t >= 1
//   zeroes (h, c, n, m) before step t, which is then a first step; a reset at t = 0 changes nothing
//   (the initial state, when given, is used at t = 0). No gradient crosses a reset.
//   Initial state: h0, c0, n0, m0 all or none. With one, n0 must be > 0 everywhere (n_t = F·n0 + I
//   is 0 wherever I underflows, and h = c/n would divide by zero; rejected for host data, device
//   data is not inspected). Resets are host memory, also for device inputs.
//
// BACKWARD: from dh [B, S, NH, DH] (f32 or the inputs' dtype) and an optional upstream gradient of the last h
// (dh_last), gives dwx, dr, db (in the inputs' dtype, accumulated in f32 over
// B·S) and, with an initial state, dh0, dc0, dn0 (f32). The stabilizer m is not differentiated:
// h does not depend on m_t for t >= 1 (c_t and n_t both carry exp(−m_t)), so this is exact; the
// gradient of m0, were it wanted, is c0·dc0 + n0·dn0. Upstream gradients of the last state
// (dh_last, dc_last, dn_last; C++ API) are taken with m held: a next call depends on c·e^m and
// n·e^m only, so feeding its dh0, dc0, dn0 back as these chains calls exactly.
//
// Errors (tessera::Error, kInvalidArgument, before any output is written): shapes, dtypes,
// S = 0 (and an empty B, NH or DH), a partial initial state, n0 <= 0, non-contiguous views; DH over an implementation's limit is
// named by that implementation (kUnsupported).
#pragma once

#include <string>
#include <vector>

#include "tessera/exec.h"
#include "tessera/tensor.h"

namespace tessera::slstm {

struct Options : ExecOptions {
  // Batch rows per thread task of the cpu backend (each step: one GEMM of this many rows against
  // the head's packed recurrent weights). 0: tuned (table, autotune on a miss) or 64.
  int64_t batch_block = 0;
};

// An optional view is absent when its data is null.
struct Inputs {
  TensorView wx, r, b;
  TensorView resets;          // [B, S], optional
  TensorView h0, c0, n0, m0;  // [B, NH, DH] f32, optional (all or none)
};

struct Outputs {
  TensorView h;                               // [B, S, NH, DH] f32 or the inputs' dtype
  TensorView h_last, c_last, n_last, m_last;  // [B, NH, DH] f32, optional (all or none)
};

struct Upstream {
  TensorView dh;                         // [B, S, NH, DH] f32 (or the inputs' dtype)
  TensorView dh_last, dc_last, dn_last;  // [B, NH, DH] f32, optional (c, n with m held: BACKWARD above)
};

struct Grads {
  TensorView dwx, dr, db;     // the inputs' shapes and dtype
  TensorView dh0, dc0, dn0;   // [B, NH, DH] f32: required with an initial state, absent without
};

// Each returns the name of the implementation that ran.
std::string forward(const Inputs& in, const Outputs& out, const Options& opt = {});
std::string backward(const Inputs& in, const Upstream& up, const Grads& grads, const Options& opt = {});
std::string forward_backward(const Inputs& in, const Upstream& up, const Outputs& out, const Grads& grads,
                             const Options& opt = {});

std::vector<ImplementationInfo> implementations();

}  // namespace tessera::slstm
