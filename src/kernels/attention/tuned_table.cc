// GENERATED FILE: the tuned block sizes of attention.
// Regenerate (do not hand-edit values; review the diff like code):
//   tessera tune attention --emit-table   (from the repository root, on the machine to tune; rebuild first: rows of other machines are kept)
// Last generated 2026-11-29. Each row: implementation, device kind, dtype,
// shape bucket (see tuning.cc), winning parameters; the comment above it says where and
// when it was measured and the winner's median time on the bucket's representative
// shape. Lookup: src/tune/table.h; sanitizing for the actual shape: the kernel's fit (tuning.cc).
#include "tune/table.h"

namespace tessera::attention {

const std::vector<tune::TableEntry>& tuned_table() {
  static const std::vector<tune::TableEntry> rows = {
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,S=1024,H=4,D=128: 54.551 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "d128",
       {{"q", 256}, {"kv", 128}},
       "B=1,S=1024,H=4,D=128", "fused", 54.551, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,S=1024,H=4,D=256: 120.430 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "d256",
       {{"q", 128}, {"kv", 128}},
       "B=1,S=1024,H=4,D=256", "fused", 120.430, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,S=1024,H=4,D=64: 45.005 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "d64",
       {{"q", 64}, {"kv", 512}},
       "B=1,S=1024,H=4,D=64", "fused", 45.005, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,S=1024,H=4,D=128: 65.427 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f16", "d128",
       {{"q", 64}, {"kv", 256}},
       "B=1,S=1024,H=4,D=128", "fused", 65.427, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,S=1024,H=4,D=256: 113.736 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f16", "d256",
       {{"q", 256}, {"kv", 128}},
       "B=1,S=1024,H=4,D=256", "fused", 113.736, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,S=1024,H=4,D=64: 49.200 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f16", "d64",
       {{"q", 64}, {"kv", 256}},
       "B=1,S=1024,H=4,D=64", "fused", 49.200, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,S=1024,H=4,D=128: 49.901 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "d128",
       {{"q", 64}, {"kv", 256}},
       "B=1,S=1024,H=4,D=128", "fused", 49.901, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,S=1024,H=4,D=256: 125.663 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "d256",
       {{"q", 256}, {"kv", 256}},
       "B=1,S=1024,H=4,D=256", "fused", 125.663, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,S=1024,H=4,D=64: 27.338 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "d64",
       {{"q", 64}, {"kv", 256}},
       "B=1,S=1024,H=4,D=64", "fused", 27.338, "2026-11-28"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,S=2048,H=8,D=128: 173.977 ms median, measured 2026-11-29
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "d128",
       {{"q", 256}, {"kv", 128}},
       "B=1,S=2048,H=8,D=128", "fused", 173.977, "2026-11-29"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,S=1024,H=4,D=256: 40.552 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "d256",
       {{"q", 256}, {"kv", 256}},
       "B=1,S=1024,H=4,D=256", "fused", 40.552, "2026-11-22"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,S=1024,H=4,D=64: 10.727 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "d64",
       {{"q", 256}, {"kv", 512}},
       "B=1,S=1024,H=4,D=64", "fused", 10.727, "2026-11-22"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,S=1024,H=4,D=128: 21.662 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f16", "d128",
       {{"q", 64}, {"kv", 256}},
       "B=1,S=1024,H=4,D=128", "fused", 21.662, "2026-11-22"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,S=1024,H=4,D=256: 44.287 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f16", "d256",
       {{"q", 64}, {"kv", 256}},
       "B=1,S=1024,H=4,D=256", "fused", 44.287, "2026-11-22"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,S=1024,H=4,D=64: 11.024 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f16", "d64",
       {{"q", 128}, {"kv", 256}},
       "B=1,S=1024,H=4,D=64", "fused", 11.024, "2026-11-22"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,S=2048,H=8,D=128: 311.435 ms median, measured 2026-11-29
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "d128",
       {{"q", 256}, {"kv", 512}},
       "B=1,S=2048,H=8,D=128", "fused", 311.435, "2026-11-29"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,S=1024,H=4,D=256: 38.322 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "d256",
       {{"q", 256}, {"kv", 256}},
       "B=1,S=1024,H=4,D=256", "fused", 38.322, "2026-11-22"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,S=1024,H=4,D=64: 10.029 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "d64",
       {{"q", 256}, {"kv", 256}},
       "B=1,S=1024,H=4,D=64", "fused", 10.029, "2026-11-22"},
  };
  return rows;
}

}  // namespace tessera::attention
