// Tessera: ragged paged attention for serving — prefill and decode rows in one batch, forward.
//
// A batch of N sequences whose keys and values live in a paged KV cache:
//   q        [T, Hq, D]        the new tokens of the N sequences, concatenated
//   cu_q_lens [N+1] i32        sequence s owns q rows cu_q_lens[s] .. cu_q_lens[s+1] (q_len_s ≥ 0);
//                              cu_q_lens[0] = 0, non-decreasing, cu_q_lens[N] = T
//   k_cache  [P, page_size, Hkv, D],  v_cache [P, page_size, Hkv, Dv]
//   page_table [N, max_pages] i32, kv_lens [N] i32: kv_len_s tokens of sequence s are in the
//                              cache, its new tokens included (q_len_s ≤ kv_len_s ≤ max_pages·page_size).
// Key position p of sequence s lives in page page_table[s, p / page_size], slot p % page_size.
// Pages may be shared between sequences and appear in any order; slots past kv_len_s, page-table
// entries past ceil(kv_len_s / page_size) and pages nobody references are never read (they may
// hold NaN or garbage).
//
// Query i of sequence s (row t = cu_q_lens[s] + i) sits at position pos = kv_len_s − q_len_s + i.
// Query head h reads kv head h / (Hq / Hkv) (Hq % Hkv == 0: MHA, GQA, MQA). The caches hold q's
// dtype or f8e4m3 (an FP8 KV cache, both caches alike), dequantized by per-tensor scales:
// k_j = k_scale · k_cache[row_j], v_j = v_scale · v_cache[row_j] (both 1 by default). For a key position j:
//   x_j = scale · q_t,h · k_j                    (scale defaults to 1/sqrt(D))
//   if softcap c > 0:  x_j = c · tanh(x_j / c)
//   allowed(j) = j < kv_len_s && (!causal || j ≤ pos) && (window < 0 || j ≥ pos − window)
// With a sink (sinks [Hq] f32, optional) the row's softmax has one more logit σ_h (used as
// given: no scale, no softcap) that carries no value:
//   lse_t,h = log( Σ_{allowed j} exp(x_j) + [sink] exp(σ_h) )
//   o_t,h   = Σ_{allowed j} exp(x_j − lse_t,h) · v_j
// A row that sees no key and has no sink has o = 0 and lse = −inf (never NaN).
// Outputs: o [T, Hq, Dv] (q's dtype or f32), lse [T, Hq] f32. See docs/kernels/paged_attention.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/exec.h"
#include "tessera/tensor.h"

namespace tessera::paged_attention {

inline constexpr const char* kKernelName = "paged_attention";

// Math options; execution options (implementation, threads, ...) are the shared ExecOptions.
struct Options : ExecOptions {
  std::optional<double> scale;  // default 1/sqrt(D); must be finite and > 0
  double softcap = 0.0;         // c > 0 enables c·tanh(x/c); 0 disables; must be finite, >= 0
  bool causal = false;          // a query sees keys at positions <= its own
  int64_t window = -1;          // keys at positions >= own − window only; −1 = unbounded
  double k_scale = 1.0;         // k = k_scale · k_cache (an f8e4m3 cache's dequantization); finite, > 0
  double v_scale = 1.0;         // v = v_scale · v_cache; finite, > 0
};

// q: f32, bf16 or f16; k_cache, v_cache: q's dtype or f8e4m3, the two alike; all contiguous, on
// one device. page_table,
// kv_lens, cu_q_lens: i32, contiguous, in host memory (read by the API to validate them).
// sinks: f32 [Hq], on q's device.
struct Inputs {
  TensorView q, k_cache, v_cache;
  TensorView page_table, kv_lens, cu_q_lens;
  std::optional<TensorView> sinks;
};

struct Outputs {
  TensorView o;    // [T, Hq, Dv], q's dtype or f32
  TensorView lse;  // [T, Hq] f32
};

// Validates everything (each error names the sequence it is about), then runs. Returns the
// implementation that ran ("(empty)" when T = 0). Throws Error(kInvalidArgument) before touching
// any output.
std::string forward(const Inputs& in, const Outputs& out, const Options& opt = {});

struct Result {
  Tensor o, lse;               // o in q's dtype
  std::string implementation;  // which implementation ran
};
Result compute(const Inputs& in, const Options& opt = {});

using tessera::ImplementationInfo;  // tessera/exec.h
std::vector<ImplementationInfo> implementations();

}  // namespace tessera::paged_attention
