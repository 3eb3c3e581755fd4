// GENERATED FILE: the tuned block sizes of mlstm.
// Regenerate (do not hand-edit values; review the diff like code):
//   tessera tune mlstm --emit-table   (from the repository root, on the machine to tune; rebuild first: rows of other machines are kept)
// Last generated 2026-11-28. Each row: implementation, device kind, dtype,
// shape bucket (see tuning.cc), winning parameters; the comment above it says where and
// when it was measured and the winner's median time on the bucket's representative
// shape. Lookup: src/tune/table.h; sanitizing for the actual shape: the kernel's fit (tuning.cc).
#include "tune/table.h"

namespace tessera::mlstm {

const std::vector<tune::TableEntry>& tuned_table() {
  static const std::vector<tune::TableEntry> rows = {
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,NH=8,S=2048,DHQK=128,DHV=128: 143.150 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "d128",
       {{"chunk_size", 64}},
       "B=1,NH=8,S=2048,DHQK=128,DHV=128", "fused", 143.150, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,NH=4,S=2048,DHQK=256,DHV=256: 218.073 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "d256",
       {{"chunk_size", 64}},
       "B=1,NH=4,S=2048,DHQK=256,DHV=256", "fused", 218.073, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,NH=8,S=2048,DHQK=128,DHV=128: 55.160 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "d128",
       {{"chunk_size", 64}},
       "B=1,NH=8,S=2048,DHQK=128,DHV=128", "fused", 55.160, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=1,NH=4,S=2048,DHQK=256,DHV=256: 72.697 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "d256",
       {{"chunk_size", 64}},
       "B=1,NH=4,S=2048,DHQK=256,DHV=256", "fused", 72.697, "2026-11-28"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,NH=8,S=2048,DHQK=128,DHV=128: 139.817 ms median, measured 2026-11-25
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "d128",
       {{"chunk_size", 64}},
       "B=1,NH=8,S=2048,DHQK=128,DHV=128", "fused", 139.817, "2026-11-25"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,NH=4,S=2048,DHQK=256,DHV=256: 195.989 ms median, measured 2026-11-25
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "d256",
       {{"chunk_size", 64}},
       "B=1,NH=4,S=2048,DHQK=256,DHV=256", "fused", 195.989, "2026-11-25"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,NH=8,S=2048,DHQK=128,DHV=128: 38.144 ms median, measured 2026-11-25
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "d128",
       {{"chunk_size", 32}},
       "B=1,NH=8,S=2048,DHQK=128,DHV=128", "fused", 38.144, "2026-11-25"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=1,NH=4,S=2048,DHQK=256,DHV=256: 71.650 ms median, measured 2026-11-25
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "d256",
       {{"chunk_size", 64}},
       "B=1,NH=4,S=2048,DHQK=256,DHV=256", "fused", 71.650, "2026-11-25"},
  };
  return rows;
}

}  // namespace tessera::mlstm
