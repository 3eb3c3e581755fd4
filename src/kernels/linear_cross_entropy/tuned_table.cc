// GENERATED FILE: the tuned block sizes of linear_cross_entropy.
// Regenerate (do not hand-edit values; review the diff like code):
//   tessera tune linear_cross_entropy --emit-table   (from the repository root, on the machine to tune; rebuild first: rows of other machines are kept)
// Last generated 2026-11-29. Each row: implementation, device kind, dtype,
// shape bucket (see tuning.cc), winning parameters; the comment above it says where and
// when it was measured and the winner's median time on the bucket's representative
// shape. Lookup: src/tune/table.h; sanitizing for the actual shape: the kernel's fit (tuning.cc).
#include "tune/table.h"

namespace tessera::linear_cross_entropy {

const std::vector<tune::TableEntry>& tuned_table() {
  static const std::vector<tune::TableEntry> rows = {
      // cpu:AMD EPYC:2c:avx2 | forward_backward B=64,H=512,V=256000: 648.216 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx2", "bf16", "gemma-ish",
       {{"b", 64}, {"h", 512}, {"v", 4096}},
       "B=64,H=512,V=256000", "forward_backward", 648.216, "2026-11-22"},
      // cpu:AMD EPYC:2c:avx2 | forward_backward B=256,H=512,V=32000: 188.609 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx2", "bf16", "llama2-ish",
       {{"b", 256}, {"h", 512}, {"v", 4096}},
       "B=256,H=512,V=32000", "forward_backward", 188.609, "2026-11-22"},
      // cpu:AMD EPYC:2c:avx2 | forward_backward B=128,H=512,V=128256: 482.528 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx2", "bf16", "llama3-ish",
       {{"b", 128}, {"h", 512}, {"v", 2048}},
       "B=128,H=512,V=128256", "forward_backward", 482.528, "2026-11-22"},
      // cpu:AMD EPYC:2c:avx2 | forward_backward B=512,H=256,V=8192: 42.810 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx2", "bf16", "small",
       {{"b", 256}, {"h", 512}, {"v", 4096}},
       "B=512,H=256,V=8192", "forward_backward", 42.810, "2026-11-22"},
      // cpu:AMD EPYC:2c:avx2 | forward_backward B=64,H=512,V=256000: 371.972 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx2", "f32", "gemma-ish",
       {{"b", 64}, {"h", 512}, {"v", 1024}},
       "B=64,H=512,V=256000", "forward_backward", 371.972, "2026-11-22"},
      // cpu:AMD EPYC:2c:avx2 | forward_backward B=256,H=512,V=32000: 150.807 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx2", "f32", "llama2-ish",
       {{"b", 256}, {"h", 512}, {"v", 4096}},
       "B=256,H=512,V=32000", "forward_backward", 150.807, "2026-11-22"},
      // cpu:AMD EPYC:2c:avx2 | forward_backward B=128,H=512,V=128256: 338.155 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx2", "f32", "llama3-ish",
       {{"b", 128}, {"h", 512}, {"v", 4096}},
       "B=128,H=512,V=128256", "forward_backward", 338.155, "2026-11-22"},
      // cpu:AMD EPYC:2c:avx2 | forward_backward B=512,H=256,V=8192: 40.453 ms median, measured 2026-11-22
      {"cpu", "cpu:AMD EPYC:2c:avx2", "f32", "small",
       {{"b", 256}, {"h", 512}, {"v", 1024}},
       "B=512,H=256,V=8192", "forward_backward", 40.453, "2026-11-22"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=64,H=512,V=256000: 809.911 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "gemma-ish",
       {{"b", 64}, {"h", 512}, {"v", 1024}},
       "B=64,H=512,V=256000", "fused", 809.911, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=256,H=512,V=32000: 243.543 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "llama2-ish",
       {{"b", 256}, {"h", 512}, {"v", 4096}},
       "B=256,H=512,V=32000", "fused", 243.543, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=128,H=512,V=128256: 521.172 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "llama3-ish",
       {{"b", 128}, {"h", 512}, {"v", 1024}},
       "B=128,H=512,V=128256", "fused", 521.172, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=512,H=256,V=8192: 57.257 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "bf16", "small",
       {{"b", 256}, {"h", 1024}, {"v", 2048}},
       "B=512,H=256,V=8192", "fused", 57.257, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=64,H=512,V=256000: 798.315 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f16", "gemma-ish",
       {{"b", 64}, {"h", 512}, {"v", 2048}},
       "B=64,H=512,V=256000", "fused", 798.315, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=256,H=512,V=32000: 225.801 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f16", "llama2-ish",
       {{"b", 256}, {"h", 256}, {"v", 2048}},
       "B=256,H=512,V=32000", "fused", 225.801, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=128,H=512,V=128256: 609.331 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f16", "llama3-ish",
       {{"b", 128}, {"h", 512}, {"v", 2048}},
       "B=128,H=512,V=128256", "fused", 609.331, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=512,H=256,V=8192: 53.694 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f16", "small",
       {{"b", 256}, {"h", 512}, {"v", 4096}},
       "B=512,H=256,V=8192", "fused", 53.694, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=64,H=512,V=256000: 457.070 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "gemma-ish",
       {{"b", 64}, {"h", 512}, {"v", 1024}},
       "B=64,H=512,V=256000", "fused", 457.070, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=256,H=512,V=32000: 189.133 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "llama2-ish",
       {{"b", 256}, {"h", 256}, {"v", 2048}},
       "B=256,H=512,V=32000", "fused", 189.133, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=128,H=512,V=128256: 411.379 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "llama3-ish",
       {{"b", 64}, {"h", 1024}, {"v", 2048}},
       "B=128,H=512,V=128256", "fused", 411.379, "2026-11-28"},
      // cpu:AMD EPYC:zen3:2c:avx2 | fused B=512,H=256,V=8192: 54.872 ms median, measured 2026-11-28
      {"cpu", "cpu:AMD EPYC:zen3:2c:avx2", "f32", "small",
       {{"b", 256}, {"h", 1024}, {"v", 2048}},
       "B=512,H=256,V=8192", "fused", 54.872, "2026-11-28"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=64,H=512,V=256000: 659.267 ms median, measured 2026-11-24
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "gemma-ish",
       {{"b", 64}, {"h", 512}, {"v", 1024}},
       "B=64,H=512,V=256000", "fused", 659.267, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=256,H=512,V=32000: 169.450 ms median, measured 2026-11-24
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "llama2-ish",
       {{"b", 256}, {"h", 256}, {"v", 2048}},
       "B=256,H=512,V=32000", "fused", 169.450, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=128,H=512,V=128256: 466.348 ms median, measured 2026-11-24
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "llama3-ish",
       {{"b", 64}, {"h", 512}, {"v", 1024}},
       "B=128,H=512,V=128256", "fused", 466.348, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=512,H=256,V=8192: 39.230 ms median, measured 2026-11-24
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "small",
       {{"b", 256}, {"h", 512}, {"v", 1024}},
       "B=512,H=256,V=8192", "fused", 39.230, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=64,H=512,V=256000: 494.645 ms median, measured 2026-11-29
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f16", "gemma-ish",
       {{"b", 64}, {"h", 512}, {"v", 1024}},
       "B=64,H=512,V=256000", "fused", 494.645, "2026-11-29"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=128,H=512,V=128256: 362.346 ms median, measured 2026-11-29
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f16", "llama3-ish",
       {{"b", 128}, {"h", 512}, {"v", 4096}},
       "B=128,H=512,V=128256", "fused", 362.346, "2026-11-29"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=64,H=512,V=256000: 374.673 ms median, measured 2026-11-24
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "gemma-ish",
       {{"b", 64}, {"h", 512}, {"v", 2048}},
       "B=64,H=512,V=256000", "fused", 374.673, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=256,H=512,V=32000: 135.366 ms median, measured 2026-11-24
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "llama2-ish",
       {{"b", 256}, {"h", 512}, {"v", 4096}},
       "B=256,H=512,V=32000", "fused", 135.366, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=128,H=512,V=128256: 311.866 ms median, measured 2026-11-24
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "llama3-ish",
       {{"b", 128}, {"h", 512}, {"v", 4096}},
       "B=128,H=512,V=128256", "fused", 311.866, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=512,H=256,V=8192: 43.029 ms median, measured 2026-11-24
      {"cpu", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "small",
       {{"b", 256}, {"h", 512}, {"v", 1024}},
       "B=512,H=256,V=8192", "fused", 43.029, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=64,H=512,V=256000: 669.029 ms median, measured 2026-11-24
      {"cpu_v2", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "gemma-ish",
       {{"b", 64}, {"h", 512}, {"v", 4096}},
       "B=64,H=512,V=256000", "fused", 669.029, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=256,H=512,V=32000: 178.432 ms median, measured 2026-11-24
      {"cpu_v2", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "llama2-ish",
       {{"b", 256}, {"h", 512}, {"v", 2048}},
       "B=256,H=512,V=32000", "fused", 178.432, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=128,H=512,V=128256: 445.533 ms median, measured 2026-11-24
      {"cpu_v2", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "llama3-ish",
       {{"b", 128}, {"h", 512}, {"v", 1024}},
       "B=128,H=512,V=128256", "fused", 445.533, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=512,H=256,V=8192: 38.153 ms median, measured 2026-11-24
      {"cpu_v2", "cpu:AMD EPYC:zen4:2c:avx512", "bf16", "small",
       {{"b", 256}, {"h", 256}, {"v", 2048}},
       "B=512,H=256,V=8192", "fused", 38.153, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=64,H=512,V=256000: 375.492 ms median, measured 2026-11-24
      {"cpu_v2", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "gemma-ish",
       {{"b", 64}, {"h", 512}, {"v", 2048}},
       "B=64,H=512,V=256000", "fused", 375.492, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=256,H=512,V=32000: 134.402 ms median, measured 2026-11-24
      {"cpu_v2", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "llama2-ish",
       {{"b", 256}, {"h", 512}, {"v", 4096}},
       "B=256,H=512,V=32000", "fused", 134.402, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=128,H=512,V=128256: 320.568 ms median, measured 2026-11-24
      {"cpu_v2", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "llama3-ish",
       {{"b", 128}, {"h", 512}, {"v", 1024}},
       "B=128,H=512,V=128256", "fused", 320.568, "2026-11-24"},
      // cpu:AMD EPYC:zen4:2c:avx512 | fused B=512,H=256,V=8192: 48.476 ms median, measured 2026-11-24
      {"cpu_v2", "cpu:AMD EPYC:zen4:2c:avx512", "f32", "small",
       {{"b", 256}, {"h", 512}, {"v", 4096}},
       "B=512,H=256,V=8192", "fused", 48.476, "2026-11-24"},
      // cuda:NVIDIA H200:132sm | fused B=8192,H=2304,V=256000: 61.883 ms median, measured 2026-11-26
      {"cuda", "cuda:NVIDIA H200:132sm", "bf16", "gemma-ish",
       {{"b", 1032}, {"h", 2304}, {"v", 256000}},
       "B=8192,H=2304,V=256000", "fused", 61.883, "2026-11-26"},
      // cuda:NVIDIA H200:132sm | fused B=8192,H=4096,V=128256: 46.852 ms median, measured 2026-11-26
      {"cuda", "cuda:NVIDIA H200:132sm", "bf16", "llama3-ish",
       {{"b", 2060}, {"h", 4096}, {"v", 128256}},
       "B=8192,H=4096,V=128256", "fused", 46.852, "2026-11-26"},
  };
  return rows;
}

}  // namespace tessera::linear_cross_entropy
