// Size: a linear_cross_entropy problem whose logits count B·V passes 2^31 (B = 65536,
// V = 32771, H = 16: 2 147 680 256 logits, never materialized), run on the cpu backend with
// gradients and checked against the reference by sampling: whole rows (loss, lse, dx) from a
// reference run on those rows alone, the last rows included (their flat logit index t·V + v is
// past 2^31), and whole columns of dw recomputed in double from the inputs and the checked lse.
// About 25 MiB of memory; label `large` (tens of seconds on 2 cores).
//
// And an attention forward whose q and o pass 2^31 elements (B·Sq·Hq·D = 2 147 493 120, bf16:
// 4 GiB each; q a sparse mapping with only the checked rows written, so about 4.3 GB resident),
// checked row by row against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

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
  const int64_t B = 65536, H = 16, V = 32771;
  ASSERT_GT(B * V, int64_t{1} << 31);
  Tensor x = Tensor::empty(DType::kF32, {B, H}), w = Tensor::empty(DType::kF32, {H, V});
  Tensor labels = Tensor::empty(DType::kI64, {B});
  uint64_t s = 12345;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<double>(s >> 40) / 16777216.0 - 0.5);
  };
  for (int64_t i = 0; i < B * H; ++i) x.data_as<float>()[i] = next();
  for (int64_t i = 0; i < H * V; ++i) w.data_as<float>()[i] = 2.0f * next();
  for (int64_t t = 0; t < B; ++t) labels.data_as<int64_t>()[t] = (t * 7919) % V;
  labels.data_as<int64_t>()[B - 1] = V - 1;  // the very last logit of the problem
  labels.data_as<int64_t>()[100] = -100;     // an ignored row

  lce::Options opt;
  opt.implementation = "cpu";
  opt.reduction = lce::Reduction::kNone;
  opt.skip_ignored = false;  // every row computed: lse of the ignored row is compared too
  lce::Inputs in{x.view(), w.view(), std::nullopt, labels.view(), std::nullopt};
  const lce::Result r = lce::compute_with_grad(in, opt);
  ASSERT_EQ(r.implementation, "cpu");

  // Rows: the first, an ignored one, the middle, and the last ten (t·V past 2^31).
  std::vector<int64_t> rows = {0, 1, 100, 4097, B / 2};
  for (int64_t t = B - 10; t < B; ++t) rows.push_back(t);
  ASSERT_GT(rows.back() * V, int64_t{1} << 31);
  const int64_t S = static_cast<int64_t>(rows.size());
  Tensor xs = Tensor::empty(DType::kF32, {S, H}), ls = Tensor::empty(DType::kI64, {S});
  for (int64_t i = 0; i < S; ++i) {
    std::memcpy(xs.data_as<float>() + i * H, x.data_as<float>() + rows[i] * H, H * sizeof(float));
    ls.data_as<int64_t>()[i] = labels.data_as<int64_t>()[rows[i]];
  }
  lce::Options ref_opt = opt;
  ref_opt.implementation = "reference";
  const lce::Result ref = lce::compute_with_grad({xs.view(), w.view(), std::nullopt, ls.view(), std::nullopt}, ref_opt);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t t = rows[i];
    EXPECT_NEAR(r.loss.data_as<float>()[t], ref.loss.data_as<float>()[i], 2e-5 * (1 + std::fabs(ref.loss.data_as<float>()[i])))
        << "row " << t;
    EXPECT_NEAR(r.lse.data_as<float>()[t], ref.lse.data_as<float>()[i], 2e-5 * (1 + std::fabs(ref.lse.data_as<float>()[i])))
        << "row " << t;
    for (int64_t h = 0; h < H; ++h)
      EXPECT_NEAR(r.dx.data_as<float>()[t * H + h], ref.dx.data_as<float>()[i * H + h], 1e-5) << "dx row " << t;
  }

  // Columns of dw: dw[h, v] = Σ_t x[t, h] · (softmax(z_t)_v − [y_t = v]), in double, with
  // z_tv recomputed from x and w and the row's lse from the (sample-checked) kernel.
  for (int64_t v : {int64_t{0}, int64_t{7919}, V / 2, V - 1}) {
    std::vector<double> col(H, 0.0);
    for (int64_t t = 0; t < B; ++t) {
      const int64_t y = labels.data_as<int64_t>()[t];
      if (y == -100) continue;
      const float* xt = x.data_as<float>() + t * H;
      double z = 0;
      for (int64_t h = 0; h < H; ++h) z += static_cast<double>(xt[h]) * w.data_as<float>()[h * V + v];
      const double g = std::exp(z - r.lse.data_as<float>()[t]) - (y == v ? 1.0 : 0.0);
      for (int64_t h = 0; h < H; ++h) col[h] += xt[h] * g;
    }
    for (int64_t h = 0; h < H; ++h)
      EXPECT_NEAR(r.dw.data_as<float>()[h * V + v], col[h], 1e-4 * (1 + std::fabs(col[h]))) << "dw[" << h << ", " << v << "]";
  }
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
