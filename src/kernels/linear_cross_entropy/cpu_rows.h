// Tessera internal: row-level pieces shared by the linear_cross_entropy CPU backends (cpu and
// its versions), above the SIMD kernels of cpu_simd.h.
#pragma once

#include <cstdint>

#include "kernels/linear_cross_entropy/impl.h"

namespace tessera::linear_cross_entropy {

// loss_t of a non-ignored row from its lse, label logit and Σ_c σ_c·z_c (Σ z without class
// weights): weight·[(1−ε)(lse − z_y) + λ·lse²] + smooth_weight·ε/V·(Σσ·lse − Σ σ·z).
inline double row_loss_value(const Problem& p, int64_t t, double lse, double zy, double sigma_z) {
  const double eps = p.label_smoothing;
  const double main = (1.0 - eps) * (lse - zy) + p.z_loss_weight * lse * lse;
  // Absent without smoothing (not 0·it: a −inf logit makes Σσ·z −inf, and 0·inf is NaN).
  const double smooth = eps > 0.0 ? eps / p.vocab() * (p.smooth_total() * lse - sigma_z) : 0.0;
  return static_cast<double>(p.weight(t)) * main + static_cast<double>(p.smooth_weight(t)) * smooth;
}

// d loss_t / d z_j = coef·p_j − offset·σ_j − label·[j == y]  (before the upstream gradient and
// the soft cap's factor), for a non-ignored row with log-sum-exp lse.
struct GradCoefs {
  double coef = 0.0, offset = 0.0, label = 0.0;
};
inline GradCoefs grad_coefs(const Problem& p, int64_t t, double lse) {
  const double eps = p.label_smoothing, V = p.vocab();
  const double w = p.weight(t), s = p.smooth_weight(t);
  return {w * (1.0 - eps + 2.0 * p.z_loss_weight * lse) + s * eps * p.smooth_total() / V, s * eps / V,
          w * (1.0 - eps)};
}

}  // namespace tessera::linear_cross_entropy

namespace tessera::linear_cross_entropy::cpu_rows {

// One row's online statistics over the vocabulary tiles one thread owns (merged across threads
// in thread order by the backends).
struct RowPartial {
  float m;       // running max (−inf before the first tile)
  float zy;      // the label's logit, when the label falls in this range
  double s;      // Σ exp(z − m)
  double sumz;   // Σ z (class-weighted when p.class_weights)
  int64_t amax;  // first index of m
  bool poisoned = false;  // a NaN or +inf logit was seen: the row's lse is NaN (as the reference's)
};

// Token t's logits z[0..n) of vocabulary columns v0.. get the bias (biasf: [V] f32 or nullptr)
// and the soft cap in place; then, with need_stats, they update t's online statistics s.
void row_stats(const Problem& p, const float* biasf, bool need_stats, RowPartial& s, float* z, int64_t n,
               int64_t v0, int64_t t);

// In place, for token t with class weights and label smoothing (p.class_weights set): the
// logits z of vocabulary columns [v0, v0 + n) become up · d loss_t / d z_j (grad_coefs, the
// soft cap's factor included). The label column is formed in f64 without cancellation.
void class_weighted_grad(const Problem& p, int64_t t, double lse, float up, int64_t v0, int64_t n, float* z);

}  // namespace tessera::linear_cross_entropy::cpu_rows
