// GENERATED FILE: the tuned block sizes of grouped_matmul.
// Regenerate (do not hand-edit values; review the diff like code):
//   tessera tune grouped_matmul --emit-table   (from the repository root, on the machine to tune; rebuild first: rows of other machines are kept)
// Last generated 2026-11-28. Each row: implementation, device kind, dtype,
// shape bucket (see tuning.cc), winning parameters; the comment above it says where and
// when it was measured and the winner's median time on the bucket's representative
// shape. Lookup: src/tune/table.h; sanitizing for the actual shape: the kernel's fit (tuning.cc).
#include "tune/table.h"

namespace tessera::grouped_matmul {

const std::vector<tune::TableEntry>& tuned_table() {
  static const std::vector<tune::TableEntry> rows = {
      // cpu:AMD EPYC:zen3:2c:avx2 | fused M=2048,K=512,N=1024,G=64: 72.337 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "g64",
       {{"m", 512}, {"n", 2048}},
       "M=2048,K=512,N=1024,G=64", "fused", 72.337, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused M=2048,K=512,N=1024,G=8: 47.438 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "g8",
       {{"m", 256}, {"n", 256}},
       "M=2048,K=512,N=1024,G=8", "fused", 47.438, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused M=2048,K=512,N=1024,G=64: 67.344 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f16", "g64",
       {{"m", 256}, {"n", 2048}},
       "M=2048,K=512,N=1024,G=64", "fused", 67.344, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused M=2048,K=512,N=1024,G=8: 48.378 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f16", "g8",
       {{"m", 128}, {"n", 1024}},
       "M=2048,K=512,N=1024,G=8", "fused", 48.378, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused M=2048,K=512,N=1024,G=64: 62.592 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "g64",
       {{"m", 128}, {"n", 2048}},
       "M=2048,K=512,N=1024,G=64", "fused", 62.592, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused M=2048,K=512,N=1024,G=8: 48.205 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "g8",
       {{"m", 1024}, {"n", 2048}},
       "M=2048,K=512,N=1024,G=8", "fused", 48.205, "2026-11-28"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused M=2048,K=512,N=1024,G=64: 48.238 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "g64",
       {{"m", 1024}, {"n", 1024}},
       "M=2048,K=512,N=1024,G=64", "fused", 48.238, "2026-11-22"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused M=2048,K=512,N=1024,G=8: 38.327 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "g8",
       {{"m", 128}, {"n", 2048}},
       "M=2048,K=512,N=1024,G=8", "fused", 38.327, "2026-11-22"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused M=2048,K=512,N=1024,G=64: 42.640 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f16", "g64",
       {{"m", 1024}, {"n", 2048}},
       "M=2048,K=512,N=1024,G=64", "fused", 42.640, "2026-11-22"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused M=2048,K=512,N=1024,G=8: 35.420 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f16", "g8",
       {{"m", 1024}, {"n", 1024}},
       "M=2048,K=512,N=1024,G=8", "fused", 35.420, "2026-11-22"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused M=2048,K=512,N=1024,G=64: 47.289 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "g64",
       {{"m", 1024}, {"n", 1024}},
       "M=2048,K=512,N=1024,G=64", "fused", 47.289, "2026-11-22"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused M=2048,K=512,N=1024,G=8: 35.881 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "g8",
       {{"m", 128}, {"n", 2048}},
       "M=2048,K=512,N=1024,G=8", "fused", 35.881, "2026-11-22"},
  };
  return rows;
}

}  // namespace tessera::grouped_matmul
