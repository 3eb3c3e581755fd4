// primitives::lse_combine_row against one softmax over all the keys, in double.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "primitives/lse_combine.h"

namespace tessera {
namespace {

using primitives::lse_combine_row;
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Row {
  std::vector<double> score;              // one per key
  std::vector<std::vector<double>> value;  // [keys][dv]
};

// Softmax-weighted values of keys [a, b) and their lse, in double (lse -inf, o NaN when empty:
// an empty split's output is garbage the combine must never read).
void attend(const Row& r, size_t a, size_t b, size_t dv, float* o, float* lse) {
  if (a == b) {
    *lse = -kInf;
    for (size_t j = 0; j < dv; ++j) o[j] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  double m = -INFINITY, s = 0;
  for (size_t i = a; i < b; ++i) m = std::max(m, r.score[i]);
  for (size_t i = a; i < b; ++i) s += std::exp(r.score[i] - m);
  for (size_t j = 0; j < dv; ++j) {
    double acc = 0;
    for (size_t i = a; i < b; ++i) acc += std::exp(r.score[i] - m) / s * r.value[i][j];
    o[j] = static_cast<float>(acc);
  }
  *lse = static_cast<float>(m + std::log(s));
}

Row random_row(size_t keys, size_t dv, double scale, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> n;
  Row r;
  for (size_t i = 0; i < keys; ++i) {
    r.score.push_back(scale * n(g));
    r.value.emplace_back();
    for (size_t j = 0; j < dv; ++j) r.value.back().push_back(n(g));
  }
  return r;
}

// Splitting the keys at `cuts` and combining equals attending over all of them.
void expect_split_equals_whole(const Row& r, size_t dv, const std::vector<size_t>& cuts, double tol) {
  const size_t S = cuts.size() - 1;
  std::vector<float> part(S * dv), lse(S), whole(dv), o(dv);
  for (size_t s = 0; s < S; ++s) attend(r, cuts[s], cuts[s + 1], dv, &part[s * dv], &lse[s]);
  float lse_whole = 0, lse_got = 0;
  attend(r, 0, r.score.size(), dv, whole.data(), &lse_whole);
  lse_combine_row(static_cast<int64_t>(S), static_cast<int64_t>(dv), part.data(), static_cast<int64_t>(dv), lse.data(),
                  o.data(), &lse_got);
  EXPECT_NEAR(lse_got, lse_whole, tol * std::max(1.0f, std::abs(lse_whole)));
  for (size_t j = 0; j < dv; ++j) EXPECT_NEAR(o[j], whole[j], tol) << j;
}

TEST(LseCombine, SplitsOfAnySizeEqualTheWholeRow) {
  const Row r = random_row(40, 5, 2.0, 1);
  // f32 weights and sums over <= 7 partials of values |v| < ~4: a few ulps of 4.
  for (const auto& cuts : std::vector<std::vector<size_t>>{{0, 40}, {0, 20, 40}, {0, 1, 39, 40}, {0, 7, 13, 20, 26, 33, 39, 40}})
    expect_split_equals_whole(r, 5, cuts, 2e-6);
}

TEST(LseCombine, EmptySplitsHoldingNaNAreNeverRead) {
  const Row r = random_row(10, 3, 1.0, 2);
  expect_split_equals_whole(r, 3, {0, 0, 4, 4, 10, 10}, 2e-6);
}

TEST(LseCombine, HugeScoresDoNotOverflow) {
  const Row r = random_row(12, 4, 1e4, 3);  // lse of order 1e4: exp would overflow unshifted
  expect_split_equals_whole(r, 4, {0, 3, 9, 12}, 2e-6);
}

TEST(LseCombine, NoKeyAnywhereGivesZeroAndMinusInfinity) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> part = {nan, nan, nan, nan}, lse = {-kInf, -kInf}, o(2, 7.0f);
  float l = 0;
  lse_combine_row(2, 2, part.data(), 2, lse.data(), o.data(), &l);
  EXPECT_EQ(l, -kInf);
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_EQ(o[1], 0.0f);
}

TEST(LseCombine, NaNInAnLsePropagates) {
  std::vector<float> part = {1, 2, 3, 4}, lse = {0.5f, std::numeric_limits<float>::quiet_NaN()}, o(2);
  float l = 0;
  lse_combine_row(2, 2, part.data(), 2, lse.data(), o.data(), &l);
  EXPECT_TRUE(std::isnan(l));
  EXPECT_TRUE(std::isnan(o[0]));
}

TEST(LseCombine, StridedPartials) {
  // Two partials of dv = 2 stored 5 floats apart; equal lse: the plain mean.
  std::vector<float> part = {1, 3, 99, 99, 99, 5, 7}, lse = {0.25f, 0.25f}, o(2);
  float l = 0;
  lse_combine_row(2, 2, part.data(), 5, lse.data(), o.data(), &l);
  EXPECT_FLOAT_EQ(o[0], 3.0f);
  EXPECT_FLOAT_EQ(o[1], 5.0f);
  EXPECT_FLOAT_EQ(l, 0.25f + std::log(2.0f));
}

}  // namespace
}  // namespace tessera
