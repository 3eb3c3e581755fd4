// cpu_bf16_gemm: the packed layout (both packers, both code paths, bit for bit), and the GEMM
// against a double loop over tails of every dimension, odd K, alpha, accumulate, and NaN
// sentinels in everything it must not read or write.
#include "primitives/cpu_bf16_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/random.h"
#include "primitives/both_paths.h"
#include "tessera/dtype.h"

namespace tessera {
namespace {

namespace g = cpu_bf16_gemm;

constexpr uint16_t kNaN = 0x7fc0;  // bf16 quiet NaN

// Runs f with the AVX512-BF16 path and, where the CPU has it, again forced portable.
template <class F>
void both_paths(F&& f) {
  testing::both_paths(g::available(), "TESSERA_CPU_BF16_DOT", f);
}

// A row-major bf16 matrix [rows × ld] of values in [-1, 1], NaN in the padding columns ≥ cols.
std::vector<uint16_t> matrix(int64_t rows, int64_t cols, int64_t ld, uint64_t seed) {
  std::vector<uint16_t> m(static_cast<size_t>(rows * ld), kNaN);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m[static_cast<size_t>(r * ld + c)] = f32_to_bf16(static_cast<float>(random_unit(seed, r * ld + c) * 2 - 1));
  return m;
}

std::vector<const uint16_t*> row_pointers(const std::vector<uint16_t>& m, int64_t rows, int64_t ld) {
  std::vector<const uint16_t*> p(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) p[static_cast<size_t>(r)] = m.data() + r * ld;
  return p;
}

// The layout as the header states it, from B[k][n] = b(k, n).
template <class B>
std::vector<uint32_t> layout(int64_t K, int64_t N, B b) {
  const int64_t K2 = (K + 1) / 2, panels = (N + g::kPanel - 1) / g::kPanel;
  std::vector<uint32_t> out(static_cast<size_t>(panels * K2 * g::kPanel), 0u);
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t k = 0; k < K2; ++k)
      for (int64_t c = 0; c < g::kPanel; ++c) {
        const int64_t n = p * g::kPanel + c;
        if (n >= N) continue;
        const uint32_t lo = b(2 * k, n), hi = 2 * k + 1 < K ? b(2 * k + 1, n) : 0u;
        out[static_cast<size_t>((p * K2 + k) * g::kPanel + c)] = lo | hi << 16;
      }
  return out;
}

TEST(CpuBf16Gemm, PackersWriteTheDocumentedLayout) {
  for (int64_t K : {1, 2, 5, 32, 33, 37, 64}) {
    for (int64_t N : {1, 16, 31, 32, 45, 70}) {
      EXPECT_EQ(g::packed_words(K, N), (N + 31) / 32 * ((K + 1) / 2) * 32);
      // B by rows [K × N] (ld N + 3, NaN past N) and by columns [N × K] (ld K + 1, NaN past K).
      const std::vector<uint16_t> rows = matrix(K, N, N + 3, 11), cols = matrix(N, K, K + 1, 12);
      const auto want_rows = layout(K, N, [&](int64_t k, int64_t n) { return uint32_t{rows[static_cast<size_t>(k * (N + 3) + n)]}; });
      const auto want_cols = layout(K, N, [&](int64_t k, int64_t n) { return uint32_t{cols[static_cast<size_t>(n * (K + 1) + k)]}; });
      both_paths([&](bool portable) {
        std::vector<uint32_t> got(static_cast<size_t>(g::packed_words(K, N)), 0xdeadbeefu);
        g::pack_rows(row_pointers(rows, K, N + 3).data(), K, N, got.data());
        EXPECT_EQ(got, want_rows) << "pack_rows K " << K << " N " << N << (portable ? " portable" : "");
        std::fill(got.begin(), got.end(), 0xdeadbeefu);
        g::pack_cols(row_pointers(cols, N, K + 1).data(), K, N, got.data());
        EXPECT_EQ(got, want_cols) << "pack_cols K " << K << " N " << N << (portable ? " portable" : "");
      });
    }
  }
}

// Products of two bf16 are exact in f32; the f32 sums of K terms err by at most (K + 1)·2^-24 of
// Σ|a·b| (each of ≤ K additions and the alpha scaling rounds once), plus one rounding of C
// when accumulating. A wrong pair, panel or tail is off by a whole product (≥ 2^-16 here).
TEST(CpuBf16Gemm, MatchesADoubleLoop) {
  const float alpha = 0.75f;
  for (int64_t M : {1, 3, 4, 7, 13}) {
    for (int64_t N : {1, 16, 17, 45, 64, 70, 130}) {  // N ≤ 16: the 8-row block
      for (int64_t K : {1, 2, 37, 64, 129}) {
        const int64_t lda = K + 1, ldc = N + 2;  // NaN in A's column K, sentinels in C's padding
        const std::vector<uint16_t> A = matrix(M, K, lda, 21), Bt = matrix(N, K, K, 22);
        std::vector<uint32_t> packed(static_cast<size_t>(g::packed_words(K, N)));
        for (bool accumulate : {false, true}) {
          both_paths([&](bool portable) {
            g::pack_cols(row_pointers(Bt, N, K).data(), K, N, packed.data());
            std::vector<float> C(static_cast<size_t>(M * ldc), -5.0f);
            for (int64_t i = 0; i < M; ++i)
              for (int64_t n = 0; n < N; ++n) C[static_cast<size_t>(i * ldc + n)] = accumulate ? 0.5f : NAN;
            g::gemm(M, N, K, A.data(), lda, packed.data(), alpha, accumulate, C.data(), ldc);
            for (int64_t i = 0; i < M; ++i)
              for (int64_t n = 0; n < ldc; ++n) {
                const float got = C[static_cast<size_t>(i * ldc + n)];
                if (n >= N) {
                  ASSERT_EQ(got, -5.0f) << "wrote past N: " << M << "x" << N << "x" << K;
                  continue;
                }
                double want = 0, mag = 0;
                for (int64_t k = 0; k < K; ++k) {
                  const double p = double(bf16_to_f32(A[static_cast<size_t>(i * lda + k)])) *
                                   bf16_to_f32(Bt[static_cast<size_t>(n * K + k)]);
                  want += p, mag += std::abs(p);
                }
                want = alpha * want + (accumulate ? 0.5 : 0.0);
                const double tol = (K + 1) * std::ldexp(1.0, -24) * alpha * mag + std::ldexp(1.0, -24);
                ASSERT_NEAR(got, want, tol) << M << "x" << N << "x" << K << " [" << i << ", " << n << "]"
                                            << (accumulate ? " accumulate" : "") << (portable ? " portable" : "");
              }
          });
        }
      }
    }
  }
}

TEST(CpuBf16Gemm, EmptyDimensions) {
  std::vector<float> C(6, 3.0f);
  const uint16_t a = 0;
  const uint32_t b = 0;
  g::gemm(0, 3, 2, &a, 2, &b, 1.0f, false, C.data(), 3);
  g::gemm(2, 0, 2, &a, 2, &b, 1.0f, false, C.data(), 3);
  EXPECT_EQ(C, std::vector<float>(6, 3.0f));
  g::gemm(2, 3, 0, &a, 2, &b, 1.0f, true, C.data(), 3);  // K = 0, accumulate: C kept
  EXPECT_EQ(C, std::vector<float>(6, 3.0f));
  g::gemm(1, 2, 0, &a, 2, &b, 1.0f, false, C.data(), 3);  // K = 0: C = 0 in [1 × 2] only
  EXPECT_EQ(C, (std::vector<float>{0, 0, 3, 3, 3, 3}));
}

}  // namespace
}  // namespace tessera
