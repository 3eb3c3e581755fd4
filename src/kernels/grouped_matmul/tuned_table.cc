// GENERATED FILE: the tuned block sizes of grouped_matmul.
// Regenerate (do not hand-edit values; review the diff like code):
//   tessera tune grouped_matmul --emit-table   (from the repository root, on the machine to tune; rebuild first: rows of other machines are kept)
// Last generated 2026-11-22. Each row: implementation, device kind, dtype,
// shape bucket (see tuning.cc), winning parameters; the comment above it says where and
// when it was measured and the winner's median time on the bucket's representative
// shape. Lookup: src/tune/table.h; sanitizing for the actual shape: block_sizes.cc.
#include "kernels/grouped_matmul/tuning.h"

namespace tessera::grouped_matmul {

const std::vector<tune::TableEntry>& tuned_table() {
  static const std::vector<tune::TableEntry> rows = {
      // cpu:AMD EPYC:2c:avx512 | fused M=2048,K=512,N=1024,G=64: 54.094 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx512", "bf16", "g64",
       {{"m", 1024}, {"n", 1024}},
       "M=2048,K=512,N=1024,G=64", "fused", 54.094, "2026-11-22"},
      // cpu:AMD EPYC:2c:avx512 | fused M=2048,K=512,N=1024,G=8: 37.044 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx512", "bf16", "g8",
       {{"m", 128}, {"n", 1024}},
       "M=2048,K=512,N=1024,G=8", "fused", 37.044, "2026-11-22"},
      // cpu:AMD EPYC:2c:avx512 | fused M=2048,K=512,N=1024,G=64: 122.626 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx512", "f16", "g64",
       {{"m", 256}, {"n", 2048}},
       "M=2048,K=512,N=1024,G=64", "fused", 122.626, "2026-11-22"},
      // cpu:AMD EPYC:2c:avx512 | fused M=2048,K=512,N=1024,G=8: 53.438 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx512", "f16", "g8",
       {{"m", 1024}, {"n", 1024}},
       "M=2048,K=512,N=1024,G=8", "fused", 53.438, "2026-11-22"},
      // cpu:AMD EPYC:2c:avx512 | fused M=2048,K=512,N=1024,G=64: 45.074 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx512", "f32", "g64",
       {{"m", 128}, {"n", 2048}},
       "M=2048,K=512,N=1024,G=64", "fused", 45.074, "2026-11-22"},
      // cpu:AMD EPYC:2c:avx512 | fused M=2048,K=512,N=1024,G=8: 31.694 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx512", "f32", "g8",
       {{"m", 512}, {"n", 2048}},
       "M=2048,K=512,N=1024,G=8", "fused", 31.694, "2026-11-22"},
  };
  return rows;
}

}  // namespace tessera::grouped_matmul
