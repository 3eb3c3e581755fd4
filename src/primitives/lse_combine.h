// Tessera primitives: the log-sum-exp combine of partial attention results (split-KV decode,
// context parallelism, a pipeline's second stage). Each of S partials is a softmax-normalized
// output o_s over its own share of the keys, with that share's log-sum-exp lse_s. Then
//   lse = log Σ_s exp(lse_s),   o = Σ_s exp(lse_s − lse) · o_s,
// computed with the largest lse_s as the shift (no overflow at any magnitude), weights and sums
// in f32. A partial with lse_s = −inf (it saw no key) contributes nothing; when every partial is
// −inf the row saw nothing: o = 0, lse = −inf. NaN in an lse propagates (never silently dropped).
#pragma once

#include <cstdint>

namespace tessera::primitives {

// One row: o_partial holds S rows of dv values, row s at o_partial + s·o_stride.
void lse_combine_row(int64_t splits, int64_t dv, const float* o_partial, int64_t o_stride,
                     const float* lse_partial, float* o, float* lse);

}  // namespace tessera::primitives
