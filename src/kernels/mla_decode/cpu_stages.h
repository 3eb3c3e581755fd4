// mla_decode cpu: the two stages of the split-KV pipeline, exposed for tests.
//
// Stage 1 (split-KV partial attention): the keys [0, L_b) of each batch entry are cut into
// splits of split_keys keys; each (b, split) computes, for all R = Sq·Hq query rows at once (they
// share the one latent head), its partial softmax-normalized output o_s [R, Dv] and lse_s [R]
// over that split's visible keys. Keys are taken in chunks of kChunk gathered from their pages
// once (as f32 for sgemm, or packed as bf16 pairs for the bf16 dot products); per chunk two GEMMs:
// S = scale·Q·Cᵀ ([R, D]·[D, n]) and, after an online-softmax update, acc += P·C[:, :Dv]
// ([R, n]·[n, Dv]). Each cached entry is read once and used for both products.
// Stage 2 (combine): per (b, row), primitives::lse_combine_row over that batch entry's splits.
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "kernels/mla_decode/impl.h"

namespace tessera::mla_decode::cpu {

inline constexpr int64_t kChunk = 128;        // keys gathered and multiplied at a time
inline constexpr int64_t kMinSplitKeys = 256;  // automatic splits are never shorter
inline constexpr int64_t kMinBf16DotRows = 2;  // Sq·Hq from which bf16 inputs use bf16 dot products

struct Split {
  int64_t b = 0, k0 = 0, k1 = 0;  // keys [k0, k1) of batch entry b
};

// The splits in batch order; batch b's are splits[first[b] .. first[b + 1]) (none when L_b = 0).
struct Plan {
  int64_t split_keys = 0;
  std::vector<Split> splits;
  std::vector<int64_t> first;
};

// bf16 inputs with at least kMinBf16DotRows rows on a CPU with AVX512-BF16
// (primitives/cpu_bf16_gemm.h; TESSERA_CPU_BF16_DOT=0 turns it off): both products run on
// vdpbf16ps, the keys and values of each chunk packed once for all R rows and the weights P
// rounded to bf16 for P·V (as FlashMLA does on the GPU); the rest converts to f32 for sgemm.
bool uses_bf16_dot(const Problem& p);

// The online softmax's row operations (cpu_simd.cc, Highway): max(init, s[0, n)), and
// s[j] = exp(s[j] − m) for j < n returning their f32 sum.
float row_max(const float* s, int64_t n, float init);
float exp_shifted(float* s, int64_t n, float m);

// split_keys: p.block_sizes's when given and > 0, else automatic_split_keys.
Plan plan(const Problem& p, int threads);
// Enough (b, split) items for `threads` workers (about 4 per thread) when B alone is not, in
// multiples of kChunk, at least kMinSplitKeys; one split per entry when B already is.
int64_t automatic_split_keys(const Problem& p, int threads);
// The same rule from the batch size and the longest sequence alone (the tuner's default candidate).
inline int64_t automatic_split_keys(int64_t B, int64_t Lmax, int threads) {
  const int64_t want = 4 * static_cast<int64_t>(threads > 1 ? threads : 1);
  if (Lmax == 0 || B >= want) return Lmax > 1 ? Lmax : 1;
  const int64_t per_batch = (want + B - 1) / B;
  const int64_t keys = (Lmax + per_batch - 1) / per_batch;
  const int64_t rounded = (keys + kChunk - 1) / kChunk * kChunk;
  return rounded > kMinSplitKeys ? rounded : kMinSplitKeys;
}

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
