// GENERATED FILE: the tuned block sizes of mla_decode.
// Regenerate (do not hand-edit values; review the diff like code):
//   tessera tune mla_decode --emit-table   (from the repository root, on the machine to tune; rebuild first: rows of other machines are kept)
// Last generated 2026-11-28. Each row: implementation, device kind, dtype,
// shape bucket (see tuning.cc), winning parameters; the comment above it says where and
// when it was measured and the winner's median time on the bucket's representative
// shape. Lookup: src/tune/table.h; sanitizing for the actual shape: the kernel's fit (tuning.cc).
#include "tune/table.h"

namespace tessera::mla_decode {

const std::vector<tune::TableEntry>& tuned_table() {
  static const std::vector<tune::TableEntry> rows = {
      // cpu:AMD EPYC:zen3:2c:avx2 | forward B=32,Sq=1,Hq=16,T=4096: 56.460 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "decode",
       {{"split_keys", 2048}},
       "B=32,Sq=1,Hq=16,T=4096", "forward", 56.460, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | forward B=32,Sq=16,Hq=16,T=4096: 534.837 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "wide",
       {{"split_keys", 4096}},
       "B=32,Sq=16,Hq=16,T=4096", "forward", 534.837, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | forward B=32,Sq=1,Hq=16,T=4096: 54.804 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "decode",
       {{"split_keys", 1024}},
       "B=32,Sq=1,Hq=16,T=4096", "forward", 54.804, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | forward B=32,Sq=16,Hq=16,T=4096: 532.690 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "wide",
       {{"split_keys", 4096}},
       "B=32,Sq=16,Hq=16,T=4096", "forward", 532.690, "2026-11-28"},
      // cpu:AMD EPYC:zen4:2c:avx512 | forward B=32,Sq=1,Hq=16,T=4096: 20.829 ms median, measured 2026-11-25
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "decode",
       {{"split_keys", 4096}},
       "B=32,Sq=1,Hq=16,T=4096", "forward", 20.829, "2026-11-25"},
      // cpu:AMD EPYC:zen4:2c:avx512 | forward B=32,Sq=16,Hq=16,T=4096: 186.703 ms median, measured 2026-11-25
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "wide",
       {{"split_keys", 4096}},
       "B=32,Sq=16,Hq=16,T=4096", "forward", 186.703, "2026-11-25"},
      // cpu:AMD EPYC:zen4:2c:avx512 | forward B=32,Sq=1,Hq=16,T=4096: 44.322 ms median, measured 2026-11-25
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "decode",
       {{"split_keys", 2048}},
       "B=32,Sq=1,Hq=16,T=4096", "forward", 44.322, "2026-11-25"},
      // cpu:AMD EPYC:zen4:2c:avx512 | forward B=32,Sq=16,Hq=16,T=4096: 410.134 ms median, measured 2026-11-25
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "wide",
       {{"split_keys", 4096}},
       "B=32,Sq=16,Hq=16,T=4096", "forward", 410.134, "2026-11-25"},
  };
  return rows;
}

}  // namespace tessera::mla_decode
