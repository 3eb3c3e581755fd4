// Tessera internal: the decode row of the paged_attention CPU backend for bf16 caches on CPUs with
// AVX512-BF16 (cpu_decode_bf16.cc). One query row of one sequence, every kv head, keys [k0, k1):
// each cache row is read once, straight from the cache (no f32 copy), for all the query heads of
// its GQA group:
//   scores  q·k by vdpbf16ps (q and k are bf16: exact products, f32 sums), 4 keys × 4 heads at a
//           time, reduced across lanes by one shuffle tree for all 16 dot products;
//   softmax online, in f32, 16 keys a block, the 4 heads' state in lanes (own exp: Cody–Waite
//           + Cephes polynomial + vscalefps, ≈ 1 ulp);
//   P·V     f32 FMAs; bf16 is widened by a shift (even elements) and a mask (odd ones), so o is
//           accumulated with even and odd dimensions apart and put back in order at the end.
// A block is ≤ 16 keys of one page: the scores of every kv head are formed 4 cache rows at a time
// (K read in memory order), then the softmax step, then P·V kv head by kv head. The next block's
// V rows are prefetched a few lines per key during P·V (pages are in any order, so the hardware
// prefetcher stops at a page's end; the K rows, read in memory order, it follows), and the K and
// V rows of the block two ahead are asked into L2 (prefetcht1) in shares spread over this block's
// score steps and P·V: the loads of later blocks then overlap the compute (v3;
// TESSERA_PAGED_DECODE_L2_PREFETCH=0 turns that off, for side-by-side timing).
#pragma once

#include <cstdint>

#include "kernels/paged_attention/impl.h"

namespace tessera::paged_attention::cpu_bf16 {

// x86-64 with AVX512-F/BW/BF16, unless the environment sets TESSERA_CPU_BF16_DOT=0 (then the
// generic f32 path runs: the switch the tests use to compare the two).
bool available();
// The shapes this path takes: bf16 q and caches, D and Dv multiples of 32.
bool fits(const Problem& p);

// Floats of scratch decode_row needs.
int64_t scratch_floats(const Problem& p);

// Query row tq (of sequence s, which decodes one token) against keys [k0, k1) for every query
// head h: m[h], l[h] hold the online softmax state (in: the start, e.g. a sink; out: the state
// after these keys); o[h·Dv ..] receives Σ_j exp(s_j − m[h])·v_j (not yet divided by l).
// `scale` multiplies q·k before the soft cap.
void decode_row(const Problem& p, int64_t s, int64_t tq, int64_t k0, int64_t k1, float* m, float* l, float* o,
                float* scratch);

}  // namespace tessera::paged_attention::cpu_bf16
