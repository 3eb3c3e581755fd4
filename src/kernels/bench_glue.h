// Tessera internal: pieces of bench problems that several kernels share (mla_decode's and
// paged_attention's benches: a forward baseline, a scattered page table).
#pragma once

#include <cstdint>
#include <vector>

#include "harness/bench.h"
#include "tessera/tensor.h"

namespace tessera::kernels {

// A bench problem's one baseline of the forward pass, in the list its `baselines(passes, ...)`
// returns: {c} with c.pass = forward when `passes` holds the forward, else none.
std::vector<harness::BaselineCall> forward_baseline(const std::vector<Pass>& passes, harness::BaselineCall c);

// A page table [rows, pages] (i32, host) holding a random permutation of the page ids
// 0 .. rows·pages − 1: every sequence owns `pages` pages, scattered over the cache.
Tensor shuffled_page_table(int64_t rows, int64_t pages, uint64_t seed);

}  // namespace tessera::kernels
