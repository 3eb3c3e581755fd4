// Tessera: mla_decode — DeepSeek multi-head latent attention decode over a paged latent cache,
// in the FlashMLA contract (the absorbed form), forward only.
//
// Inputs
//   q             [B, Sq, Hq, D]            f32, bf16 or f16 (D ≤ 1024; 576 in DeepSeek V2/V3)
//   kv_cache      [P, page_size, 1, D]      q's dtype, or f8e4m3 (an FP8 latent cache dequantized
//                                           by kv_scale): one latent head per cached entry
//   page_table    [B, max_pages]  int32     host memory; entry p of batch b is the page that holds
//                                           that sequence's keys p·page_size … (p+1)·page_size − 1
//   cache_seqlens [B]             int32     host memory; L_b keys in the cache for batch b
//
// For batch b, query row i (0 ≤ i < Sq) of head h, and key position j (0 ≤ j < L_b), with
//   c_j = kv_scale · kv_cache[page_table[b, j / page_size], j % page_size, 0, :]   (D values)
//   s_j = scale · q[b, i, h, :] · c_j
//   visible(i, j) = !causal || j ≤ L_b − Sq + i        (query i sits at position L_b − Sq + i)
//   lse[b, i, h] = log Σ_{visible j} exp(s_j)
//   o[b, i, h, :] = Σ_{visible j} exp(s_j − lse) · c_j[0 : Dv]
// A row that sees no key (L_b = 0, or causal with L_b − Sq + i < 0) has o = 0 and lse = −inf.
// Every Hq head shares the one latent head (multi-query over the latent).
//
// Limits: only the first ceil(L_b / page_size) entries of page_table's row b are read (the rest
// may hold anything); they must be page ids in [0, P). L_b ≤ max_pages · page_size. Cache
// entries past L_b in a page are never read (they may hold NaN). Pages may be shared between
// sequences and appear in any order. Entries j < L_b must be finite: with causal and Sq > 1 a
// non-finite key that a row cannot see still reaches that row on cpu (its weight 0 times Inf in
// P·V is NaN), where the reference reads only what a row sees. o and lse must not share memory
// with an input or with each other (refused).
// Every check (shapes, dtypes, page ids, lengths, Dv ≤ D) runs before anything is written: a
// rejected call is Error(kInvalidArgument) naming the batch index where one is at fault.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/exec.h"
#include "tessera/tensor.h"

namespace tessera::mla_decode {

inline constexpr const char* kKernelName = "mla_decode";

// The split-KV pipeline's choice (cpu, cuda): keys per stage-1 split. 0: chosen from B, L and
// the thread count. The reference ignores it.
struct BlockSizes {
  int64_t split_keys = 0;
  bool operator==(const BlockSizes& o) const { return split_keys == o.split_keys; }
  std::string str() const;  // "split_keys=0"
};

struct Options : ExecOptions {
  int64_t dv = 512;             // value dims: the first dv of the D cached dims, 1 ≤ dv ≤ D
  bool causal = false;          // query i at position L_b − Sq + i sees keys ≤ that position
  std::optional<double> scale;  // default 1/√D; finite and > 0
  std::optional<BlockSizes> block_sizes;
  double kv_scale = 1.0;        // c = kv_scale · kv_cache (an f8e4m3 cache's dequantization); finite, > 0
};

struct Inputs {
  TensorView q, kv_cache, page_table, cache_seqlens;
};

struct Outputs {
  TensorView o;    // [B, Sq, Hq, Dv], f32 or q's dtype
  TensorView lse;  // [B, Sq, Hq], f32 (FlashMLA's softmax_lse is [B, Hq, Sq]: the transpose)
};

// Returns the name of the implementation that ran ("(empty)" when there was nothing to compute).
std::string forward(const Inputs& in, const Outputs& out, const Options& opt = {});

std::vector<ImplementationInfo> implementations();

}  // namespace tessera::mla_decode
