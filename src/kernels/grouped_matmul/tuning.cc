// grouped_matmul: its block sizes (m rows of a group, n columns of the output per cpu item),
// declared (tune/declared.h). The call-time choice (api.cc) and `tessera tune grouped_matmul`
// (spec.cc) derive from this declaration.

#include "kernels/grouped_matmul/impl.h"
#include "tune/declared.h"

namespace tessera::grouped_matmul {

namespace {
using tune::kAny;

// The default (m = n = 512) first, then every m in 128..1024 against every n in 256..2048.
std::vector<tune::Params> candidates(const std::vector<int64_t>&, int) {
  const BlockSizes d;
  std::vector<tune::Params> out{{{"m", d.m}, {"n", d.n}}};
  for (int64_t m : {128, 256, 512, 1024})
    for (int64_t n : {256, 512, 1024, 2048})
      if (!(BlockSizes{m, n} == d)) out.push_back({{"m", m}, {"n", n}});
  return out;
}
}  // namespace

const tune::Declared& tuning() {
  static const tune::Declared d{
      .kernel = kKernelName,
      .options = {"m", "n"},
      // The number of groups sets the rows per sgemm call (few large groups: long calls where wide
      // tiles amortize packing; many groups: short calls where the tile width trades packing
      // against parallel items). Representative shapes: 2048 rows, K=512, N=1024 (a few ms per
      // call on the 2-core development machine).
      .buckets = {
          {"g8", "G <= 8: few experts, hundreds of rows each",
           {{"M", 1, kAny, 2048}, {"K", 1, kAny, 512}, {"N", 1, kAny, 1024}, {"G", 1, 8, 8}}},
          {"g64", "G > 8: many experts, tens of rows each (fine-grained MoE)",
           {{"M", 1, kAny, 2048}, {"K", 1, kAny, 512}, {"N", 1, kAny, 1024}, {"G", 9, kAny, 64}}},
      },
      .ragged_dims = {"M"},  // the routed tokens: a serving batch's count changes step by step
      .implementations = {"cpu"},
      .candidates = candidates,
      .carrier = "block_sizes",  // the call's block_sizes option: "m=512,n=512"
      // M·K·N multiply-adds: autotune-on-miss from 2^30 on (~10 ms on one core).
      .work = [](const std::vector<int64_t>& d) { return double(d.at(0)) * double(d.at(1)) * double(d.at(2)); },
      .table = tuned_table};
  return d;
}

}  // namespace tessera::grouped_matmul
