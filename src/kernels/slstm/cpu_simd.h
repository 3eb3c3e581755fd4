// Tessera internal: the fused pointwise gates of the slstm CPU backend, one batch row of one
// head at a time (Highway, dispatched at run time; f32; exp / log1p / tanh from Highway's
// contrib/math, 1-2 ULP). sigmoid(x) = 1/(1 + e) or e/(1 + e) with e = exp(−|x|), and
// logsigmoid(x) = min(x, 0) − log1p(exp(−|x|)): no overflow, no flush to 0, for any finite x.
#pragma once

#include <cstdint>

namespace tessera::slstm::cpu_simd {

// The activations of one step that the backward reads, each [DH].
struct Act {
  float *I, *F, *zt, *og, *sfm;  // sfm = sigmoid(−f̄)
};

// One step of one row: pre = (ī, f̄, z̄, ō) [4·DH]; the state (m, c, n) is read and updated in
// place, h written. first: m = ī, I = 1, F = 0. act gets the activations (all null: forward only, not computed).
void forward_row(const float* pre, int64_t DH, bool first, float* m, float* c, float* n, float* h, const Act& act);

// Backward of one step of one row. dh: total gradient of h_t (upstream + recurrent); dc, dn: the
// gradients of c_t, n_t from later steps, replaced by those of c_{t-1}, n_{t-1} (zero when first).
// c, n, h: the step's outputs; cprev, nprev: the state it started from. dpre [4·DH] written.
void backward_row(const float* dh, float* dc, float* dn, const Act& act, const float* c, const float* n, const float* h,
                  const float* cprev, const float* nprev, int64_t DH, bool first, float* dpre);

// G[Bb, W] = h[Bb, DH]·R[DH, W] (row-major, f32 FMA; register blocks of 4 rows × 4 vectors with R
// streamed from its packed layout: no per-step packing, unlike a BLAS call).
void gemm_step(const float* h, int64_t Bb, int64_t DH, const float* R, int64_t W, float* G);

}  // namespace tessera::slstm::cpu_simd
