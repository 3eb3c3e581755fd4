// Tessera: grouped matmul for mixture-of-experts layers (gmm and its weight gradient tgmm).
//
// lhs [M, K] holds tokens sorted by expert: group g owns the consecutive rows
// [start_g, start_g + size_g) with start_g = size_0 + … + size_{g−1}. One matrix per group:
//   rhs [G, K, N]  (or [G, N, K] with transpose_rhs: rhs[g] is then used transposed).
//
//   gmm:   out[r, :] = lhs[r, :] · rhs[g]          for every row r of a local group g
//          out[r, :] = 0                           for every other row (rows past Σ size, rows of
//                                                   groups another shard holds)
//   tgmm:  drhs[g]   = lhs[rows of g]ᵀ · dout[rows of g]     ([K, N]; [N, K] with transpose_rhs;
//                                                   zero for an empty group)
//   backward of gmm from dout [M, N]: dlhs = gmm(dout, rhs transposed), drhs = tgmm(lhs, dout)
//   in rhs's layout.
//
// group_sizes: int32 or int64 [G_total], host memory, each ≥ 0, Σ ≤ M (rows past the sum are
// zero: the megablox capacity-padding convention). Expert parallelism: with `group_offset` set,
// rhs holds the G_local = rhs.shape[0] groups [offset, offset + G_local) of the G_total in
// group_sizes, and only their rows are computed (megablox `group_offset`); without it,
// G_total must equal G_local.
// dtypes: lhs, rhs, dout share one of f32, bf16, f16; accumulation in f32 (the reference: double);
// outputs in the input dtype or f32. See docs/kernels/grouped_matmul.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/exec.h"
#include "tessera/tensor.h"

namespace tessera::grouped_matmul {

inline constexpr const char* kKernelName = "grouped_matmul";

// CPU tiles: a work item is (group, rows ≤ m, columns ≤ n) of the output; tgmm items are
// (group, k rows ≤ m of drhs[g], columns ≤ n). A backend documents and validates its use.
struct BlockSizes {
  int64_t m = 512;
  int64_t n = 512;
  bool operator==(const BlockSizes& o) const { return m == o.m && n == o.n; }
  std::string str() const;  // "m=512,n=512"
};

// Math options; execution options (implementation, threads, ...) are the shared ExecOptions.
struct Options : ExecOptions {
  bool transpose_rhs = false;          // rhs (and drhs) are [G, N, K]
  std::optional<int64_t> group_offset;  // expert parallelism: first group of rhs in group_sizes
  std::optional<BlockSizes> block_sizes;  // unset: the implementation's (tuned) choice
};

// lhs [M, K], rhs [G_local, K, N] (or [G_local, N, K]), group_sizes [G_total] int32/int64 (host).
struct Inputs {
  TensorView lhs, rhs, group_sizes;
};

// out [M, N] (input dtype or f32). Throws Error(kInvalidArgument) before touching out when a
// shape, dtype, device or group size is wrong.
// Each returns the name of the implementation that ran.
std::string gmm(const Inputs& in, const TensorView& out, const Options& opt = {});
// drhs [G_local, K, N] (or [G_local, N, K] with transpose_rhs) from lhs and dout [M, N]; G_local,
// K and N come from drhs's shape.
std::string tgmm(const TensorView& lhs, const TensorView& dout, const TensorView& group_sizes,
                 const TensorView& drhs, const Options& opt = {});
// Both gradients of gmm: dlhs [M, K] (rows outside the local groups are zero), drhs like rhs.
// Either may be left out (an empty TensorView{}: a frozen rhs, e.g. frozen experts under LoRA):
// its product is not computed and nothing is written there.
std::string backward(const Inputs& in, const TensorView& dout, const TensorView& dlhs,
                     const TensorView& drhs, const Options& opt = {});
// gmm, then its backward (training).
std::string forward_backward(const Inputs& in, const TensorView& dout, const TensorView& out,
                             const TensorView& dlhs, const TensorView& drhs, const Options& opt = {});

// Allocating wrappers: outputs in the inputs' dtype on their device.
struct Result {
  Tensor out;
  Tensor dlhs, drhs;           // undefined unless gradients were asked for
  std::string implementation;  // which implementation ran
};
Result compute(const Inputs& in, const Options& opt = {});
Result compute_with_grad(const Inputs& in, const TensorView& dout, const Options& opt = {});

// ---- introspection ----
using tessera::ImplementationInfo;  // tessera/exec.h
std::vector<ImplementationInfo> implementations();
// Throws Error(kInvalidArgument) naming the broken constraint (kNotFound for an unknown name).
void validate_block_sizes(const std::string& implementation, const BlockSizes& bs);

}  // namespace tessera::grouped_matmul
