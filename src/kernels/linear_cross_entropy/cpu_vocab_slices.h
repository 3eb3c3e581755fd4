// linear_cross_entropy: gradients of a 16-bit dw in vocabulary slices, for host backends whose
// dw needs an f32 accumulator of w's size (4·H·V bytes: 128 MiB at H=1024, V=32768; 2.1 GB at
// H=4096, V=128256) when Options::memory_budget is smaller than that.
//
// The backward runs once per slice of vc vocabulary columns, in the vocab-parallel partial form
// (v0.12: the slice's w, labels relative to it, the global lse): each slice's dw is summed in f32
// over every token and rounded once, as without slices (never a bf16 running sum: the peer bug
// LinearCrossEntropyCpu.Bf16DwAccumulatesInF32AcrossTokenBlocks guards), and the slices' shares
// of dx are summed in f32. The lse comes from a forward first (a fused call's, or one run for a
// backward given none): one more GEMM (4 instead of 3), the price of the bounded memory; a
// backward given the forward's lse costs no more GEMMs than without slices. The route's own
// buffers are allocated before anything is written. Extra memory: the backend's accumulator of one
// slice (4·H·vc) and its slab of b tokens (6·b·vc on the bf16 dot route, 4·b'·vc with b rounded
// up to 64 on the packed f32 route, 4·b·vc on OpenBLAS), w's and dw's slice copies for an [H, V] w
// (2·H·vc each), two f32 B×H dx buffers, and the backend's other scratch (estimated: per thread
// an h × v f32 chunk, 8·b·H, on the packed route 8·b'·H and a widened block of w per thread,
// 1 MiB); vc is the widest multiple of 64 that keeps all of it within the budget (at least 64
// columns: a budget below the fixed part is exceeded, and the slices are narrow). The slices, and
// the forward run for their lse, take no optional scratch (Problem::budget_spent).
#pragma once

#include "kernels/linear_cross_entropy/impl.h"

namespace tessera::linear_cross_entropy::vocab_slices {

// Host problem, not the partial form, a 16-bit dw, memory_budget set and below what the route
// without slices needs (the 4·H·V accumulator, the b×V slab, the backend's other scratch).
bool needed(const Problem& p, const BlockSizes& bs, const GradOut& out);
// The slice width vc for this problem and block sizes (the rule above).
int64_t columns(const Problem& p, const BlockSizes& bs);
// backward() through impl, slice by slice (g.lse required: the forward's, as the partial form needs).
void backward(const Implementation& impl, const Problem& p, const BlockSizes& bs, const GradIn& g,
              const GradOut& out);
// forward(), then backward() above with its lse (a scratch lse when fout has none).
void forward_backward(const Implementation& impl, const Problem& p, const BlockSizes& bs, const GradIn& g,
                      const ForwardOut& fout, const GradOut& out);

}  // namespace tessera::linear_cross_entropy::vocab_slices
