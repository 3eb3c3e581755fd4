// GENERATED FILE: the tuned block sizes of slstm.
// Regenerate (do not hand-edit values; review the diff like code):
//   tessera tune slstm --emit-table   (from the repository root, on the machine to tune; rebuild first: rows of other machines are kept)
// Last generated 2026-11-28. Each row: implementation, device kind, dtype,
// shape bucket (see tuning.cc), winning parameters; the comment above it says where and
// when it was measured and the winner's median time on the bucket's representative
// shape. Lookup: src/tune/table.h; sanitizing for the actual shape: the kernel's fit (tuning.cc).
#include "tune/table.h"

namespace tessera::slstm {

const std::vector<tune::TableEntry>& tuned_table() {
  static const std::vector<tune::TableEntry> rows = {
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=16,S=256,NH=4,DH=128: 121.658 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "dh128",
       {{"batch_block", 32}},
       "B=16,S=256,NH=4,DH=128", "fused", 121.658, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=64,S=256,NH=4,DH=64: 155.532 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "dh64",
       {{"batch_block", 8}},
       "B=64,S=256,NH=4,DH=64", "fused", 155.532, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=16,S=256,NH=4,DH=128: 113.854 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "dh128",
       {{"batch_block", 8}},
       "B=16,S=256,NH=4,DH=128", "fused", 113.854, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=64,S=256,NH=4,DH=64: 146.657 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "dh64",
       {{"batch_block", 8}},
       "B=64,S=256,NH=4,DH=64", "fused", 146.657, "2026-11-28"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=16,S=256,NH=4,DH=128: 53.564 ms median, measured 2026-11-25
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "dh128",
       {{"batch_block", 8}},
       "B=16,S=256,NH=4,DH=128", "fused", 53.564, "2026-11-25"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=64,S=256,NH=4,DH=64: 75.379 ms median, measured 2026-11-25
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "dh64",
       {{"batch_block", 8}},
       "B=64,S=256,NH=4,DH=64", "fused", 75.379, "2026-11-25"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=16,S=256,NH=4,DH=128: 56.537 ms median, measured 2026-11-25
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "dh128",
       {{"batch_block", 128}},
       "B=16,S=256,NH=4,DH=128", "fused", 56.537, "2026-11-25"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=64,S=256,NH=4,DH=64: 72.080 ms median, measured 2026-11-25
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "dh64",
       {{"batch_block", 8}},
       "B=64,S=256,NH=4,DH=64", "fused", 72.080, "2026-11-25"},
  };
  return rows;
}

}  // namespace tessera::slstm
