// cpu_f32_gemm: the packed layout (both packers, both code paths, bit for bit), and the GEMM
// against a double loop over tails of every dimension (rows past the 6-row block, columns past the
// 16-column vectors and the 64-column panels, K = 1), both A layouts, every causal shape, alpha,
// beta, and NaN sentinels in everything it must not read or write.
#include "primitives/cpu_f32_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/random.h"
#include "tessera/dtype.h"

namespace tessera {
namespace {

namespace g = cpu_f32_gemm;
using g::Tri;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// TESSERA_CPU_F32_GEMM set to `value` (nullptr: unset) for a scope, the caller's value restored.
class Route {
 public:
  explicit Route(const char* value) {
    if (const char* v = std::getenv(kVar)) old_ = v;
    if (value) ::setenv(kVar, value, 1);
    else ::unsetenv(kVar);
  }
  ~Route() {
    if (old_) ::setenv(kVar, old_->c_str(), 1);
    else ::unsetenv(kVar);
  }

 private:
  static constexpr const char* kVar = "TESSERA_CPU_F32_GEMM";
  std::optional<std::string> old_;
};

// The best kernel this CPU has, whatever the environment says.
g::Isa hardware_isa() {
  const Route unset(nullptr);
  return g::isa();
}

// Runs f on every path this CPU has: its best kernel, the AVX2 kernel forced on an AVX-512 CPU,
// and the portable loop forced (f(true)).
template <class F>
void both_paths(F&& f) {
  const g::Isa best = hardware_isa();
  {
    const Route route(nullptr);
    f(false);
  }
  if (best == g::Isa::kAvx512) {
    const Route route("avx2");
    ASSERT_EQ(g::isa(), g::Isa::kAvx2);
    f(false);
  }
  if (best != g::Isa::kPortable) {
    const Route route("0");
    ASSERT_EQ(g::isa(), g::Isa::kPortable);
    f(true);
  }
}

// A row-major matrix [rows × ld] of values in [-1, 1], NaN in the padding columns ≥ cols.
std::vector<float> matrix(int64_t rows, int64_t cols, int64_t ld, uint64_t seed) {
  std::vector<float> m(static_cast<size_t>(rows * ld), kNaN);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) m[size_t(r * ld + c)] = float(random_unit(seed, r * ld + c) * 2 - 1);
  return m;
}

// The layout as the header states it, from B[k][n] = b(k, n).
template <class B>
std::vector<float> layout(int64_t K, int64_t N, B b) {
  const int64_t panels = (N + g::kPanel - 1) / g::kPanel;
  std::vector<float> out(size_t(panels * K * g::kPanel), 0.0f);
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t c = 0; c < g::kPanel && p * g::kPanel + c < N; ++c)
        out[size_t((p * K + k) * g::kPanel + c)] = b(k, p * g::kPanel + c);
  return out;
}

TEST(CpuF32Gemm, PackedLayoutBothPackersBothPaths) {
  for (auto kn : {std::pair<int64_t, int64_t>{1, 1}, {5, 17}, {16, 64}, {17, 65}, {33, 130}, {64, 256}}) {
    const int64_t K = kn.first, N = kn.second;  // not a structured binding: clang 14 cannot capture one
    const int64_t ld = N + 3, ldt = K + 5;
    const std::vector<float> B = matrix(K, N, ld, 11), Bt = matrix(N, K, ldt, 12);
    const auto want = layout(K, N, [&](int64_t k, int64_t n) { return B[size_t(k * ld + n)]; });
    const auto want_t = layout(K, N, [&](int64_t k, int64_t n) { return Bt[size_t(n * ldt + k)]; });
    ASSERT_EQ(int64_t(want.size()), g::packed_floats(K, N));
    both_paths([&](bool portable) {
      std::vector<float> got(want.size(), kNaN), got_t(want.size(), kNaN);
      g::pack(false, K, N, B.data(), ld, got.data());
      g::pack(true, K, N, Bt.data(), ldt, got_t.data());
      // memcmp-like: exact copies, zeros past N.
      for (size_t e = 0; e < want.size(); ++e) {
        ASSERT_EQ(got[e], want[e]) << "K " << K << " N " << N << " e " << e << " portable " << portable;
        ASSERT_EQ(got_t[e], want_t[e]) << "K " << K << " N " << N << " e " << e << " portable " << portable;
      }
    });
  }
}

// pack_half widens a bf16 / f16 B exactly: the packed floats equal, bit for bit, pack of B's f32
// copy (the bits span every exponent: subnormals, infinities and NaN of both formats included),
// over panel tails, both layouts, a strided B, and every path (the trans packer is the SIMD one).
// A NaN matches any NaN: the SIMD widening (F16C) quiets a signalling f16 NaN, dtype.h's keeps it.
bool same(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); }

TEST(CpuF32Gemm, PackHalfIsPackOfTheWidenedCopy) {
  for (bool bf16 : {true, false})
    for (auto kn : {std::pair<int64_t, int64_t>{1, 1}, {5, 17}, {17, 65}, {33, 130}, {64, 256}}) {
      const int64_t K = kn.first, N = kn.second, ld = N + 3, ldt = K + 5;
      std::vector<uint16_t> B(size_t(K * ld)), Bt(size_t(N * ldt));
      for (size_t e = 0; e < B.size(); ++e) B[e] = uint16_t(random_unit(21, int64_t(e)) * 65536.0);
      for (size_t e = 0; e < Bt.size(); ++e) Bt[e] = uint16_t(random_unit(22, int64_t(e)) * 65536.0);
      const auto widen = [&](const std::vector<uint16_t>& h) {
        std::vector<float> f(h.size());
        for (size_t e = 0; e < h.size(); ++e) f[e] = bf16 ? bf16_to_f32(h[e]) : f16_to_f32(h[e]);
        return f;
      };
      const std::vector<float> B32 = widen(B), Bt32 = widen(Bt);
      both_paths([&](bool portable) {
        const size_t n = size_t(g::packed_floats(K, N));
        std::vector<float> want(n), want_t(n), got(n, kNaN), got_t(n, kNaN);
        g::pack(false, K, N, B32.data(), ld, want.data());
        g::pack(true, K, N, Bt32.data(), ldt, want_t.data());
        ASSERT_EQ(g::pack_half_scratch(false, K), 0);
        std::vector<float> scratch(size_t(g::pack_half_scratch(true, K)), kNaN);
        g::pack_half(false, K, N, B.data(), ld, bf16, got.data(), nullptr);
        g::pack_half(true, K, N, Bt.data(), ldt, bf16, got_t.data(), scratch.data());
        for (size_t e = 0; e < n; ++e) {
          ASSERT_TRUE(same(got[e], want[e])) << (bf16 ? "bf16" : "f16") << " K " << K << " N " << N << " e " << e
                                             << " portable " << portable;
          ASSERT_TRUE(same(got_t[e], want_t[e])) << (bf16 ? "bf16" : "f16") << " trans K " << K << " N " << N
                                                 << " e " << e << " portable " << portable;
        }
      });
    }
}

struct Case {
  Tri tri;
  bool trans_a;
  int64_t M, N, K;
  float alpha, beta;
};

// op(A)[i][k] with the causal shape's zeros written in (the contract asks the caller for them).
float op_a(const Case& c, const std::vector<float>& A, int64_t lda, int64_t i, int64_t k) {
  if (c.tri == Tri::kLowerA && k > i) return 0.0f;
  if (c.tri == Tri::kUpperA && k < i) return 0.0f;
  return c.trans_a ? A[size_t(k * lda + i)] : A[size_t(i * lda + k)];
}

void check(const Case& c, uint64_t seed) {
  const int64_t lda = (c.trans_a ? c.M : c.K) + 2, ldb = c.N + 1, ldc = c.N + 3;
  std::vector<float> A = matrix(c.trans_a ? c.K : c.M, c.trans_a ? c.M : c.K, lda, seed);
  for (int64_t i = 0; i < c.M; ++i)  // the zeros of the causal shapes, in A itself
    for (int64_t k = 0; k < c.K; ++k) (c.trans_a ? A[size_t(k * lda + i)] : A[size_t(i * lda + k)]) = op_a(c, A, lda, i, k);
  const std::vector<float> B = matrix(c.K, c.N, ldb, seed + 1), C0 = matrix(c.M, c.N, ldc, seed + 2);
  both_paths([&](bool portable) {
    std::vector<float> packed(size_t(g::packed_floats(c.K, c.N)));
    g::pack(false, c.K, c.N, B.data(), ldb, packed.data());
    std::vector<float> C = C0;
    g::gemm(c.tri, c.trans_a, c.M, c.N, c.K, c.alpha, A.data(), lda, packed.data(), c.beta, C.data(), ldc);
    for (int64_t i = 0; i < c.M; ++i) {
      for (int64_t n = 0; n < c.N; ++n) {
        double want = 0.0, mag = 0.0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double t = double(op_a(c, A, lda, i, k)) * B[size_t(k * ldb + n)];
          want += t, mag += std::fabs(t);
        }
        const double old = C0[size_t(i * ldc + n)];
        want = c.alpha * want + (c.beta != 0.0f ? c.beta * old : 0.0);
        if (c.tri == Tri::kLowerC && n > i) want = 0.0;
        // f32 sums of K products in some order: each partial sum rounds once (≤ 2^-24 relative),
        // so |error| ≤ K·2^-24·Σ|a b|·|alpha| (+ the beta term's rounding); 2× for slack.
        const double tol = 2.0 * (double(c.K) * 0x1p-24 * mag * std::fabs(c.alpha) + 0x1p-24 * std::fabs(c.beta * old)) + 1e-30;
        const float got = C[size_t(i * ldc + n)];
        ASSERT_NEAR(got, want, tol) << "tri " << int(c.tri) << " trans_a " << c.trans_a << " M " << c.M << " N " << c.N
                                    << " K " << c.K << " i " << i << " n " << n << " portable " << portable;
      }
      for (int64_t n = c.N; n < ldc; ++n) ASSERT_TRUE(std::isnan(C[size_t(i * ldc + n)])) << "padding written";
    }
  });
}

TEST(CpuF32Gemm, MatchesADoubleLoopOverTailsAndShapes) {
  uint64_t seed = 100;
  for (Tri tri : {Tri::kNone, Tri::kLowerA, Tri::kUpperA, Tri::kLowerC})
    for (bool ta : {false, true})
      // N = 13 and 75: a 16-column block with 9-15 live columns (AVX2's two-vector edge tile).
      for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {5, 7, 3}, {6, 16, 6}, {7, 17, 7}, {13, 33, 13},
                             {12, 48, 12}, {64, 64, 64}, {65, 65, 65}, {70, 130, 70}, {20, 200, 20}, {7, 13, 9},
                             {11, 75, 11}}) {
        // The causal shapes are square in (i, k) (L × L tiles); kNone also takes K ≠ M.
        const int64_t Kc = tri == Tri::kNone ? K + 9 : tri == Tri::kLowerC ? K + 1 : M;
        const int64_t Nc = tri == Tri::kLowerC ? M + N % 5 : N;  // kLowerC: L × L outputs, and wider
        check({tri, ta, M, Nc, Kc, 1.0f, 0.0f}, seed++);
        if (tri != Tri::kLowerC) {
          check({tri, ta, M, Nc, Kc, 0.5f, 1.0f}, seed++);
          check({tri, ta, M, Nc, Kc, -1.5f, 0.25f}, seed++);
        }
      }
}

TEST(CpuF32Gemm, MlstmShapes) {
  // The products of an mlstm chunk (L = 64, D = 256) and a tail chunk (L = 40).
  check({Tri::kNone, true, 256, 256, 64, 0.7f, 1.0f}, 1);   // C += b Kᵀ diag(A) V
  check({Tri::kNone, false, 64, 256, 256, 1.0f, 1.0f}, 2);  // h += Q̂ C
  check({Tri::kLowerA, false, 64, 256, 64, 1.0f, 0.0f}, 3);  // P V
  check({Tri::kUpperA, true, 64, 256, 64, 1.0f, 0.0f}, 4);   // Pᵀ dNum
  check({Tri::kLowerC, false, 64, 64, 256, 0.0625f, 0.0f}, 5);  // Q̂ Kᵀ
  check({Tri::kLowerA, false, 40, 256, 40, 1.0f, 1.0f}, 6);
  check({Tri::kUpperA, true, 40, 256, 40, 1.0f, 0.0f}, 7);
}

// gemm_from: the beta term read from Cin, C only written — the same bits as gemm on a copy of Cin
// (the contract: each element formed the same way), C's old values (NaN) never read, Cin never
// written; beta = 0 reads nothing of Cin (NaN there too); K = 0 is beta·Cin.
TEST(CpuF32Gemm, GemmFromTakesTheBetaTermFromCin) {
  uint64_t seed = 300;
  for (Tri tri : {Tri::kNone, Tri::kLowerA, Tri::kUpperA, Tri::kLowerC})
    for (bool ta : {false, true})
      for (auto mnk : {std::tuple<int64_t, int64_t, int64_t>{7, 17, 7}, {13, 70, 13}, {64, 256, 64}, {5, 3, 0}})
        for (float beta : {0.0f, 0.75f}) {
          const int64_t M = std::get<0>(mnk), N = std::get<1>(mnk), K = std::get<2>(mnk);  // clang 14 cannot capture a binding
          if (tri == Tri::kLowerC && beta != 0.0f) continue;  // kLowerC takes beta = 0 only
          const int64_t Kc = tri == Tri::kNone ? K + 3 : K == 0 ? 0 : M, lda = (ta ? M : Kc) + 1, ldc = N + 2, ldi = N + 5;
          std::vector<float> A = matrix(ta ? Kc : M, ta ? M : Kc, lda, seed++);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t k = 0; k < Kc; ++k)
              (ta ? A[size_t(k * lda + i)] : A[size_t(i * lda + k)]) = op_a({tri, ta, M, N, Kc, 1.0f, 0.0f}, A, lda, i, k);
          const std::vector<float> B = matrix(Kc, N, N, seed++);
          const std::vector<float> Cin = beta != 0.0f ? matrix(M, N, ldi, seed++) : std::vector<float>(size_t(M * ldi), kNaN);
          both_paths([&](bool portable) {
            std::vector<float> packed(size_t(std::max<int64_t>(1, g::packed_floats(Kc, N))));
            g::pack(false, Kc, N, B.data(), N, packed.data());
            std::vector<float> want(size_t(M * ldc), kNaN), got(size_t(M * ldc), kNaN), in = Cin;
            for (int64_t i = 0; i < M; ++i)
              for (int64_t n = 0; n < N; ++n) want[size_t(i * ldc + n)] = Cin[size_t(i * ldi + n)];
            g::gemm(tri, ta, M, N, Kc, -0.5f, A.data(), lda, packed.data(), beta, want.data(), ldc);
            g::gemm_from(tri, ta, M, N, Kc, -0.5f, A.data(), lda, packed.data(), beta, in.data(), ldi, got.data(), ldc);
            for (size_t e = 0; e < got.size(); ++e)
              if (!(std::isnan(want[e]) && std::isnan(got[e])))
                ASSERT_EQ(got[e], want[e]) << "tri " << int(tri) << " ta " << ta << " M " << M << " N " << N << " K " << Kc
                                           << " beta " << beta << " e " << e << " portable " << portable;
            for (size_t e = 0; e < in.size(); ++e)
              if (!(std::isnan(in[e]) && std::isnan(Cin[e]))) ASSERT_EQ(in[e], Cin[e]) << "Cin written";
            for (int64_t i = 0; i < M; ++i)
              for (int64_t n = N; n < ldc; ++n) ASSERT_TRUE(std::isnan(got[size_t(i * ldc + n)])) << "padding written";
          });
        }
}

TEST(CpuF32Gemm, TransposeOverTailsBothPaths) {
  for (auto rc : {std::pair<int64_t, int64_t>{1, 1}, {5, 17}, {16, 16}, {17, 33}, {64, 256}, {256, 40}}) {
    const int64_t R = rc.first, C = rc.second;  // not a structured binding: clang 14 cannot capture one
    const int64_t lds = C + 3, ldd = R + 2;
    const std::vector<float> src = matrix(R, C, lds, 21);
    both_paths([&](bool portable) {
      std::vector<float> dst(size_t(C * ldd), kNaN);
      g::transpose(R, C, src.data(), lds, dst.data(), ldd);
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t r = 0; r < R; ++r) ASSERT_EQ(dst[size_t(c * ldd + r)], src[size_t(r * lds + c)]) << R << "x" << C << " portable " << portable;
        for (int64_t r = R; r < ldd; ++r) ASSERT_TRUE(std::isnan(dst[size_t(c * ldd + r)])) << "padding written";
      }
    });
  }
}

// The AVX2 and AVX-512 kernels form each element the same way (one FMA chain over k in order,
// the same epilogue), so a result does not depend on which of them the CPU runs: the same bits
// over tails of every dimension, every causal shape, both A layouts, beta. Needs an AVX-512 CPU
// (where TESSERA_CPU_F32_GEMM=avx2 forces the other); the portable path is checked above.
TEST(CpuF32Gemm, Avx2AndAvx512GiveTheSameBits) {
  if (hardware_isa() != g::Isa::kAvx512) GTEST_SKIP() << "needs AVX-512F (this CPU has " << g::isa_name(hardware_isa()) << ")";
  uint64_t seed = 500;
  for (Tri tri : {Tri::kNone, Tri::kLowerA, Tri::kUpperA, Tri::kLowerC})
    for (bool ta : {false, true})
      for (auto mnk : {std::tuple<int64_t, int64_t, int64_t>{7, 17, 7}, {13, 70, 13}, {64, 256, 64}, {25, 130, 300},
                       {9, 75, 11}}) {
        const int64_t M = std::get<0>(mnk), N = std::get<1>(mnk);
        const int64_t K = tri == Tri::kNone ? std::get<2>(mnk) : M, lda = (ta ? M : K) + 1, ldc = N + 2;
        const float beta = tri == Tri::kLowerC ? 0.0f : 0.5f;
        std::vector<float> A = matrix(ta ? K : M, ta ? M : K, lda, seed++);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t k = 0; k < K; ++k)
            (ta ? A[size_t(k * lda + i)] : A[size_t(i * lda + k)]) = op_a({tri, ta, M, N, K, 1.0f, 0.0f}, A, lda, i, k);
        const std::vector<float> B = matrix(K, N, N, seed++), C0 = matrix(M, N, ldc, seed++);
        std::vector<float> packed(size_t(g::packed_floats(K, N)));
        g::pack(false, K, N, B.data(), N, packed.data());
        std::vector<float> wide = C0, narrow = C0;
        {
          const Route route(nullptr);
          ASSERT_EQ(g::isa(), g::Isa::kAvx512);
          g::gemm(tri, ta, M, N, K, 0.75f, A.data(), lda, packed.data(), beta, wide.data(), ldc);
        }
        {
          const Route route("avx2");
          ASSERT_EQ(g::isa(), g::Isa::kAvx2);
          g::gemm(tri, ta, M, N, K, 0.75f, A.data(), lda, packed.data(), beta, narrow.data(), ldc);
        }
        for (size_t e = 0; e < wide.size(); ++e)
          if (!(std::isnan(wide[e]) && std::isnan(narrow[e])))
            ASSERT_EQ(narrow[e], wide[e]) << "tri " << int(tri) << " ta " << ta << " M " << M << " N " << N << " K " << K
                                          << " e " << e;
      }
}

TEST(CpuF32Gemm, IsaFollowsTheEnvironment) {
  const g::Isa best = hardware_isa();
  for (const char* off : {"0", "off", "portable", "Portable"}) {
    const Route route(off);
    EXPECT_EQ(g::isa(), g::Isa::kPortable) << off;
    EXPECT_FALSE(g::available()) << off;
  }
  for (const char* cap : {"avx2", "AVX2"}) {
    const Route route(cap);
    EXPECT_EQ(g::isa(), std::min(best, g::Isa::kAvx2)) << cap;
    EXPECT_FALSE(g::available()) << "available() is the AVX-512 kernel only";
  }
  for (const char* any : {"1", "avx512", static_cast<const char*>(nullptr)}) {
    const Route route(any);
    EXPECT_EQ(g::isa(), best) << (any ? any : "unset");
    EXPECT_EQ(g::available(), best == g::Isa::kAvx512);
  }
  EXPECT_STREQ(g::isa_name(g::Isa::kAvx2), "avx2");
  EXPECT_STREQ(g::isa_name(g::Isa::kPortable), "portable");
}

TEST(CpuF32Gemm, EmptyDimensions) {
  std::vector<float> C = {1.0f, 2.0f, 3.0f, 4.0f};
  const float packed[1] = {kNaN};
  g::gemm(Tri::kNone, false, 0, 2, 3, 1.0f, nullptr, 1, packed, 0.0f, C.data(), 2);  // M = 0: nothing
  g::gemm(Tri::kNone, false, 2, 0, 3, 1.0f, nullptr, 1, packed, 0.0f, C.data(), 2);  // N = 0: nothing
  EXPECT_EQ(C, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
  g::gemm(Tri::kNone, false, 2, 2, 0, 1.0f, nullptr, 1, packed, 0.5f, C.data(), 2);  // K = 0: beta·C
  EXPECT_EQ(C, (std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f}));
  g::gemm(Tri::kNone, false, 2, 2, 0, 1.0f, nullptr, 1, packed, 0.0f, C.data(), 2);  // beta = 0: zeros
  EXPECT_EQ(C, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));
}

}  // namespace
}  // namespace tessera
