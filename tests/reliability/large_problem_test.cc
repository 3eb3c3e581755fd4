// Size: a linear_cross_entropy problem whose logits count B·V passes 2^31, run on the cpu backend
// with gradients and checked against the reference by sampling (reliability/lce_large_check.h,
// shared with the cuda suite); label `large` (tens of seconds on 2 cores).
//
// And an attention forward whose q and o pass 2^31 elements (B·Sq·Hq·D = 2 147 493 120, bf16:
// 4 GiB each; q a sparse mapping with only the checked rows written, so about 4.3 GB resident),
// checked row by row against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "reliability/lce_large_check.h"
#include "reliability/relocated_pages.h"
#include "tessera/attention.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera {
namespace {

namespace lce = linear_cross_entropy;
namespace att = attention;

TEST(LceLarge, LogitCountPast2To31OnCpuMatchesReferenceSamples) {
  bool have_cpu = false;
  for (const auto& info : lce::implementations()) have_cpu |= info.name == "cpu" && info.available;
  if (!have_cpu) GTEST_SKIP() << "no cpu backend in this build";
  expect_lce_large_matches_samples("cpu", Device::cpu());
}

// q [1, Sq, Hq=4, D=64] bf16 with Sq·4·64 > 2^31, GQA onto 2 kv heads of Sk = 9 keys (a tail
// tile), non-causal: every row sees every key, so a reference run on a few sampled rows alone
// gives their exact expected output. The last rows of the last head sit past element 2^31 of q
// and o; an index computed in 32 bits anywhere would land elsewhere. Forward only: the backward
// of this size needs dO and dq too (16 GiB), more than CI can spare beside the other tests.
TEST(AttentionLarge, QueryElementsPast2To31OnCpuMatchReferenceRows) {
  bool have_cpu = false;
  for (const auto& info : att::implementations()) have_cpu |= info.name == "cpu" && info.available;
  if (!have_cpu) GTEST_SKIP() << "no cpu backend in this build";
  const int64_t Hq = 4, Hkv = 2, D = 64, Sk = 9, Sq = (int64_t{1} << 31) / (Hq * D) + 37;
  ASSERT_GT(Sq * Hq * D, int64_t{1} << 31);
  // Values k/128, |k| <= 127: exact in bf16 (8 significant bits), so every backend reads them alike.
  auto bf16_bits = [](uint64_t r) {
    const float f = static_cast<float>(static_cast<int>(r % 255) - 127) / 128.0f;
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return static_cast<uint16_t>(u >> 16);
  };
  auto fill = [&](uint16_t* d, int64_t n, uint64_t seed) {
    uint64_t s = seed;
    for (int64_t i = 0; i < n; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      d[i] = bf16_bits(s >> 33);
    }
  };
  // The checked rows get values; every other row of q stays zero in a sparse mapping (the kernel
  // still reads and computes all of them, but only o costs memory: 4 GiB instead of 8).
  std::vector<int64_t> rows = {0, 1, 4097, Sq / 2};
  for (int64_t i = Sq - 5; i < Sq; ++i) rows.push_back(i);
  ASSERT_GT(((rows.back() * Hq) + Hq - 1) * D, int64_t{1} << 31);
  relocated::SparseHost q_map(static_cast<size_t>(Sq * Hq * D) * sizeof(uint16_t));
  if (!q_map.data()) GTEST_SKIP() << "this system refuses a sparse mapping for q";
  uint16_t* qd = static_cast<uint16_t*>(q_map.data());
  for (int64_t r : rows) fill(qd + r * Hq * D, Hq * D, 1 + static_cast<uint64_t>(r));
  const TensorView q(q_map.data(), DType::kBF16, {1, Sq, Hq, D});
  Tensor k = Tensor::empty(DType::kBF16, {1, Sk, Hkv, D}), v = Tensor::empty(DType::kBF16, {1, Sk, Hkv, D});
  fill(static_cast<uint16_t*>(k.data()), k.numel(), 2), fill(static_cast<uint16_t*>(v.data()), v.numel(), 3);
  att::Options opt;
  opt.implementation = "cpu";
  Tensor o = Tensor::empty(DType::kBF16, {1, Sq, Hq, D}), lse = Tensor::empty(DType::kF32, {1, Hq, Sq});
  auto inputs = [&](const TensorView& qq) {
    return att::Inputs{qq, k.view(), v.view(), std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt};
  };
  ASSERT_EQ(att::forward(inputs(q), {o.view(), lse.view()}, opt), "cpu");

  const int64_t S = static_cast<int64_t>(rows.size());
  Tensor qs = Tensor::empty(DType::kBF16, {1, S, Hq, D});
  for (int64_t r = 0; r < S; ++r)
    std::memcpy(static_cast<uint16_t*>(qs.data()) + r * Hq * D, qd + rows[r] * Hq * D,
                static_cast<size_t>(Hq * D) * sizeof(uint16_t));
  att::Options ref_opt;
  ref_opt.implementation = "reference";
  const att::Result ref = att::compute(inputs(qs.view()), ref_opt);
  for (int64_t r = 0; r < S; ++r)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t i = rows[r];
      EXPECT_NEAR(lse.data_as<float>()[h * Sq + i], ref.lse.data_as<float>()[h * S + r], 1e-4) << "row " << i << " head " << h;
      for (int64_t d = 0; d < D; ++d) {
        const float got = load_as_f32(o.data(), DType::kBF16, (i * Hq + h) * D + d);
        const float want = load_as_f32(ref.o.data(), ref.o.dtype(), (r * Hq + h) * D + d);
        // Both are o rounded to bf16 from f32/f64 accumulations: one bf16 unit (<= 2^-7 relative)
        // apart, plus the cpu backend's bf16 rounding of P before P·V (the contract: <= 2^-9 of
        // each p, so <= 2^-9 · Σp·|v| <= 2^-9 · max|v| = 2^-9 · 127/128 absolute).
        ASSERT_NEAR(got, want, std::ldexp(1.0, -7) * (std::fabs(want) + 1e-2) + std::ldexp(1.0, -9))
            << "row " << i << " head " << h << " d " << d;
      }
    }
}

}  // namespace
}  // namespace tessera
