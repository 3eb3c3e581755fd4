// mla_decode cpu: the two stages of the split-KV pipeline, exposed for tests.
//
// Stage 1 (split-KV partial attention): the keys [0, L_b) of each batch entry are cut into
// splits of split_keys keys; each (b, split) computes, for all R = Sq·Hq query rows at once (they
// share the one latent head), its partial softmax-normalized output o_s [R, Dv] and lse_s [R]
// over that split's visible keys. Keys are taken in chunks of kChunk gathered from their pages
// and converted to f32 once; per chunk two GEMMs: S = scale·Q·Cᵀ ([R, D]·[D, n]) and, after an
// online-softmax update, acc += P·C[:, :Dv] ([R, n]·[n, Dv]). Each cached entry is read once
// and used for both products.
// Stage 2 (combine): per (b, row), primitives::lse_combine_row over that batch entry's splits.
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "kernels/mla_decode/impl.h"

namespace tessera::mla_decode::cpu {

inline constexpr int64_t kChunk = 128;        // keys gathered and multiplied at a time
inline constexpr int64_t kMinSplitKeys = 256;  // automatic splits are never shorter
inline constexpr int64_t kMinBf16DotRows = 64;  // Sq·Hq from which bf16 inputs use bf16 dot products

struct Split {
  int64_t b = 0, k0 = 0, k1 = 0;  // keys [k0, k1) of batch entry b
};

// The splits in batch order; batch b's are splits[first[b] .. first[b + 1]) (none when L_b = 0).
struct Plan {
  int64_t split_keys = 0;
  std::vector<Split> splits;
  std::vector<int64_t> first;
};

// bf16 dot products (cpu_bf16.cc): true where the CPU has AVX512-BF16, unless the environment
// sets TESSERA_CPU_BF16_DOT=0. Stage 1 then forms the scores of bf16 inputs with vdpbf16ps
// (when Sq·Hq ≥ kMinBf16DotRows)
// (exact products, f32 sums: the same math as the f32 path, summed in another order).
bool have_bf16_dot();
// s[R, n] = scale · Q·Cᵀ. qp: Q as bf16 pairs, [R rounded up to 4][D2] (D2 = ceil(D/2), an odd D's
// last pair and the padding rows zero). ct: the keys as bf16 pairs, transposed: pair d2 of key j
// at ct[d2·stride + j], stride ≥ n rounded up to 32 (the columns past n are read, not used).
void scores_bf16_dot(const uint32_t* qp, int64_t R, int64_t D2, const uint32_t* ct, int64_t stride, int64_t n,
                     float scale, float* s);

// split_keys: p.block_sizes's when given and > 0, else automatic_split_keys.
Plan plan(const Problem& p, int threads);
// Enough (b, split) items for `threads` workers (about 4 per thread) when B alone is not, in
// multiples of kChunk, at least kMinSplitKeys; one split per entry when B already is.
int64_t automatic_split_keys(const Problem& p, int threads);

// Partials: o_part [splits, R, Dv]; lse_part of batch b is [R, n_b] at first[b]·R (row-major:
// the n_b values of one row contiguous, as lse_combine_row reads them).
// Tracked host scratch (core/memory.h: the bench's extra-memory column counts it).
struct Partials {
  memory::HostBuffer o_buf, lse_buf;
  float* o = nullptr;
  float* lse = nullptr;
  static Partials allocate(int64_t splits, int64_t rows, int64_t dv);
};

// Stage 1 over all splits on `threads` workers, and stage 2 over all rows; forward = both.
Partials stage1(const Problem& p, const Plan& plan, int threads);
void stage2(const Problem& p, const Plan& plan, const Partials& part, int threads);

}  // namespace tessera::mla_decode::cpu
