// Tessera internal: row-level pieces shared by the linear_cross_entropy CPU backends (cpu and
// its versions), above the SIMD kernels of cpu_simd.h.
#pragma once

#include <cstdint>

#include "kernels/linear_cross_entropy/impl.h"

namespace tessera::linear_cross_entropy::cpu_rows {

// In place, for token t with class weights and label smoothing (p.class_weights set): the
// logits z of vocabulary columns [v0, v0 + n) become up · d loss_t / d z_j (grad_coefs, the
// soft cap's factor included). The label column is formed in f64 without cancellation.
void class_weighted_grad(const Problem& p, int64_t t, double lse, float up, int64_t v0, int64_t n, float* z);

}  // namespace tessera::linear_cross_entropy::cpu_rows
