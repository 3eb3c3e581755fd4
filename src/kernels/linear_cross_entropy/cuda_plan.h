// linear_cross_entropy, cuda backend: the host arithmetic of a call's plan — the logits row
// stride, the scratch layout and how many token rows per chunk fit the memory budget, the cuBLAS
// workspace, and the scale of the stored f16 logit gradient. Plain C++ (no CUDA headers), so
// the CPU test suite checks it (LceCudaPlan.* in tests/kernels/linear_cross_entropy_cuda_test.cc)
// and cuda.cu uses exactly what was tested. Design: docs/kernels/linear_cross_entropy.md,
// "cuda backend".
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define TESSERA_HD __host__ __device__
#else
#define TESSERA_HD
#endif

namespace tessera::linear_cross_entropy::cuda_plan {

constexpr size_t kDefaultBudget = size_t{1} << 30;  // 1 GiB
constexpr size_t kAlign = 256;                      // every scratch region starts 256-byte aligned
constexpr size_t kScalarsBytes = 256;               // room for cuda_kernels::Scalars (static_assert in cuda.cu)

inline size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Row stride, in f32 elements, of the logits chunk: V rounded up to a multiple of 8. Every row
// then starts 32-byte aligned, as f32 logits and as the bf16/f16 gradient stored over them (row
// stride 2·stride elements). With an odd V (GPT-2's 50,257) unpadded rows after the first lose
// 16-byte alignment, which sends cuBLAS to slower kernels and the row kernel to scalar loads.
inline int64_t logits_row_stride(int64_t V) { return (V + 7) / 8 * 8; }

// Bytes of cuBLAS workspace carved out of the budget and handed to cuBLAS (cublasSetWorkspace),
// so that the GEMMs' workspace is counted like every other byte of scratch: budget / 64, at
// least 16 KiB (below that cuBLAS may fail with ALLOC_FAILED), a multiple of 256, and at most
// what cuBLAS itself uses by default: 32 MiB on Hopper and newer (compute capability >= 9,
// NVIDIA's recommendation; split-K and stream-K kernels need it), 4 MiB before. At the default
// 1 GiB budget that is 16 MiB on Hopper (32 MiB from a 2 GiB budget), which keeps the chunk
// sizes the docs quote.
inline size_t blas_workspace_bytes(size_t budget, int cc_major) {
  const size_t lo = size_t{16} << 10, hi = (cc_major >= 9 ? size_t{32} : size_t{4}) << 20;
  return std::clamp(budget / 64, lo, hi) / kAlign * kAlign;
}

// What a call needs besides the logits chunk.
struct ScratchNeeds {
  int64_t B = 0, V = 0;
  bool row_losses = false;  // forward with reduction sum / mean: B floats of per-row losses
  bool dbias_acc = false;   // gradients with a bf16/f16 dbias: an f32 accumulator of V floats
  int cc_major = 0;         // the device's compute capability (sizes the cuBLAS workspace)
};

// The most any call on a problem can need, for checks that know neither the pass nor the
// gradient dtypes (supports(), default block sizes): row losses for sum / mean, and an f32 dbias
// accumulator whenever there is a bias (it is needed when dbias is bf16 / f16).
inline ScratchNeeds worst_case_needs(int64_t B, int64_t V, bool sum_or_mean, bool has_bias) {
  ScratchNeeds n;
  n.B = B;
  n.V = V;
  n.row_losses = sum_or_mean;
  n.dbias_acc = has_bias;
  return n;
}

// Byte offsets of the scratch regions from the 256-byte aligned base, and the bytes to allocate
// (kAlign of slack included, to align the base). The logits chunk comes last, unpadded, so that
// `bytes` never exceeds the budget that sized `rows`.
struct ScratchLayout {
  size_t scalars = 0, row_loss = 0, dbias = 0, workspace = 0, logits = 0;
  size_t workspace_bytes = 0;
  size_t bytes = 0;
};

inline ScratchLayout scratch_layout(const ScratchNeeds& n, size_t budget, int64_t rows) {
  ScratchLayout l;
  size_t off = 0;
  l.scalars = off;
  off += align_up(kScalarsBytes);
  l.row_loss = off;
  if (n.row_losses) off += align_up(static_cast<size_t>(n.B) * sizeof(float));
  l.dbias = off;
  if (n.dbias_acc) off += align_up(static_cast<size_t>(n.V) * sizeof(float));
  l.workspace = off;
  l.workspace_bytes = blas_workspace_bytes(budget, n.cc_major);
  off += l.workspace_bytes;
  l.logits = off;
  off += static_cast<size_t>(rows) * static_cast<size_t>(logits_row_stride(n.V)) * sizeof(float);
  l.bytes = off + kAlign;
  return l;
}

// Rows of f32 logits that `budget` holds next to the fixed regions (0: not even one). Not
// clamped to B or to block b.
inline int64_t budget_rows(const ScratchNeeds& n, size_t budget) {
  const size_t fixed = scratch_layout(n, budget, 0).bytes;
  const size_t per_row = static_cast<size_t>(logits_row_stride(n.V)) * sizeof(float);
  if (budget <= fixed) return 0;
  return static_cast<int64_t>(std::min<size_t>((budget - fixed) / per_row, INT64_MAX));
}

// Rows per chunk: the budget's rows, at most B, block b and INT_MAX (one thread block per row
// and the GEMMs' n are ints), rounded down to a multiple of 128 (GEMM-friendly n) when at least
// 256 and fewer than B. 0 when the budget does not hold one row.
inline int64_t chunk_rows(int64_t budget_rows, int64_t B, int64_t b) {
  int64_t rows = std::min({budget_rows, B, std::max<int64_t>(b, 1), int64_t{INT_MAX}});
  if (rows <= 0) return 0;
  if (rows < B && rows >= 256) rows = rows / 128 * 128;
  return rows;
}

// The tuner's candidates for the chunk size b besides the default (every row the budget holds,
// at most B, as chunk_rows rounds it): the powers of two from 512 to 32768 that are smaller than
// that chunk, so each one gives a different chunk (larger values would all clamp to it). Fewer rows per
// chunk mean smaller GEMMs but a logits chunk that stays in L2 between the GEMM and the
// row-wise pass.
inline std::vector<int64_t> chunk_candidates(int64_t B, int64_t budget_rows) {
  const int64_t most = chunk_rows(budget_rows, B, B);  // the default's chunk
  std::vector<int64_t> out;
  for (int64_t b = 512; b <= 32768 && b < most; b *= 2) out.push_back(b);
  return out;
}

// The power of two S that the f16 logit gradient is stored multiplied by (divided out again
// through the GEMMs' alpha). A stored value is S·r_t·d_tj with r_t = weight_t·upstream_t (the
// row factor; upstream_t = 1 for sum / mean, whose scalar goes into alpha) and
// |d_tj| ≤ |1 + 2λ·lse_t| + 1 + ε. S is chosen per call from the largest |r_t| over the rows
// that get a gradient, so that S·max|r_t| lies in [2^9, 2^10):
//  - overflow (f16's largest finite value is 65504 < 2^16) needs |d| > 64, i.e. a z-loss term
//    2λ·lse above ~62, whatever the weights and upstream gradient (an AMP loss scale of 2^16
//    included);
//  - the row with the largest factor keeps probabilities down to 2^-23 (1.2e-7) inside f16's
//    normal range (≥ 2^-14), whatever the factor (a per-token upstream of 1/8192 included);
//    a row whose factor is 2^k smaller keeps them down to 2^(k−23).
// A fixed S (the old 256) did neither: 256·(1/V)/8192 is subnormal (biased rounding in every
// column), 256·2^16 overflows. max_row_factor ≤ 0 (no gradient at all) or not finite gives 1;
// the exponent is clamped to ±100 so that S and 1/S stay normal f32 numbers.
TESSERA_HD inline float f16_grad_scale(float max_row_factor) {
  if (!(max_row_factor > 0.f) || !(max_row_factor <= 3.0e38f)) return 1.f;
  int e = 0;
  (void)frexpf(max_row_factor, &e);  // max_row_factor ∈ [2^(e−1), 2^e)
  int k = 10 - e;
  k = k > 100 ? 100 : (k < -100 ? -100 : k);
  return ldexpf(1.f, k);
}

}  // namespace tessera::linear_cross_entropy::cuda_plan
