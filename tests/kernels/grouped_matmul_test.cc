// grouped_matmul reference: hand values, the zero rows of the contract, and both gradients
// against central finite differences of the reference's own gmm.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/grouped_matmul/testing.h"
#include "tessera/grouped_matmul.h"

namespace tessera::grouped_matmul {
namespace {

Tensor from(DType dt, const Shape& shape, const std::vector<float>& v) {
  Tensor t = Tensor::empty(dt, shape);
  for (size_t i = 0; i < v.size(); ++i) store_from_f32(t.data(), dt, static_cast<int64_t>(i), v[i]);
  return t;
}
Tensor sizes_of(const std::vector<int32_t>& s) {
  Tensor t = Tensor::empty(DType::kI32, {static_cast<int64_t>(s.size())});
  for (size_t i = 0; i < s.size(); ++i) t.data_as<int32_t>()[i] = s[i];
  return t;
}
float at(const Tensor& t, int64_t i) { return load_as_f32(t.data(), t.dtype(), i); }
Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.dtype(), t.shape());
  std::memcpy(c.data(), t.data(), t.view().nbytes());
  return c;
}

Options ref() {
  Options o;
  o.implementation = "reference";
  return o;
}

// lhs rows 0 | 1, 2 | 3 (past the sum): group 0 = row 0, group 1 = rows 1-2.
TEST(GroupedMatmulReference, HandValues) {
  const Tensor lhs = from(DType::kF32, {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor rhs = from(DType::kF32, {2, 2, 2}, {1, 0, 0, 1, /*g1*/ 0, 1, 2, 0});
  const Tensor gs = sizes_of({1, 2});
  const Result r = compute({lhs.view(), rhs.view(), gs.view()}, ref());
  // row 0 · I = [1, 2]; rows 1, 2 · [[0, 1], [2, 0]] = [2·4, 3] = [8, 3] and [12, 5]; row 3: zero.
  const std::vector<float> want{1, 2, 8, 3, 12, 5, 0, 0};
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(at(r.out, i), want[static_cast<size_t>(i)]) << i;
  EXPECT_EQ(r.implementation, "reference");
}

TEST(GroupedMatmulReference, TransposedRhsAndTgmmHandValues) {
  const Tensor lhs = from(DType::kF32, {3, 2}, {1, 2, 3, 4, 5, 6});
  // rhs[0] stored [N=1, K=2] = [1, 1]; transposed it is the column [1, 1]ᵀ.
  const Tensor rhs = from(DType::kF32, {1, 1, 2}, {1, 1});
  const Tensor gs = sizes_of({2});
  Options o = ref();
  o.transpose_rhs = true;
  const Result r = compute({lhs.view(), rhs.view(), gs.view()}, o);
  EXPECT_EQ(at(r.out, 0), 3.0f);
  EXPECT_EQ(at(r.out, 1), 7.0f);
  EXPECT_EQ(at(r.out, 2), 0.0f);  // past the sum
  // tgmm over the two rows of group 0 with dout = [1; 2; 9]: drhs[0] = [1·1 + 3·2, 2·1 + 4·2]
  // stored [N=1, K=2]; the third row (past the sum) contributes nothing.
  const Tensor dout = from(DType::kF32, {3, 1}, {1, 2, 9});
  Tensor drhs = Tensor::empty(DType::kF32, {1, 1, 2});
  tgmm(lhs.view(), dout.view(), gs.view(), drhs.view(), o);
  EXPECT_EQ(at(drhs, 0), 7.0f);
  EXPECT_EQ(at(drhs, 1), 10.0f);
}

TEST(GroupedMatmulReference, GroupOffsetComputesOnlyTheLocalGroups) {
  const Tensor lhs = from(DType::kF32, {5, 1}, {1, 2, 3, 4, 5});
  const Tensor rhs = from(DType::kF32, {1, 1, 1}, {10});  // the shard holds group 1 only
  const Tensor gs = sizes_of({2, 2, 1});
  Options o = ref();
  o.group_offset = 1;
  const Result r = compute({lhs.view(), rhs.view(), gs.view()}, o);
  const std::vector<float> want{0, 0, 30, 40, 0};
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(at(r.out, i), want[static_cast<size_t>(i)]) << i;
}

// L = Σ out ∘ dout is linear in lhs and in rhs, so a central difference with step h is exact up
// to the f32 rounding of out (relative 2^-24 of Σ|terms|).
void expect_gradients_match_differences(testing::CaseSpec s) {
  s.opt.implementation = "reference";
  const testing::CaseData d = testing::make_case(s);
  const Options opt = testing::options_of(s);
  const Result g = compute_with_grad(d.inputs(), d.dout.view(), opt);
  auto loss = [&](const Tensor& lhs, const Tensor& rhs) {
    const Result r = compute({lhs.view(), rhs.view(), d.group_sizes.view()}, opt);
    double l = 0.0;
    for (int64_t i = 0; i < r.out.numel(); ++i) l += double(at(r.out, i)) * at(d.dout, i);
    return l;
  };
  const double h = 0.25;
  auto check = [&](const Tensor& x, const Tensor& grad, bool is_lhs) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      Tensor xp = copy_of(x), xm = copy_of(x);
      xp.data_as<float>()[i] += static_cast<float>(h);
      xm.data_as<float>()[i] -= static_cast<float>(h);
      const double fd = is_lhs ? (loss(xp, d.rhs) - loss(xm, d.rhs)) / (2 * h) : (loss(d.lhs, xp) - loss(d.lhs, xm)) / (2 * h);
      EXPECT_NEAR(at(grad, i), fd, 1e-4) << (is_lhs ? "dlhs[" : "drhs[") << i << "] of " << s.name();
    }
  };
  check(d.lhs, g.dlhs, true);
  check(d.rhs, g.drhs, false);
}

TEST(GroupedMatmulReference, GradientsMatchFiniteDifferences) {
  testing::CaseSpec s;
  s.M = 9, s.K = 3, s.N = 4, s.sizes = {3, 0, 4};  // a row past the sum, an empty group
  expect_gradients_match_differences(s);
  s.transpose_rhs = true;
  expect_gradients_match_differences(s);
  s.transpose_rhs = false;
  s.sizes = {2, 3, 1, 2}, s.offset = 1, s.local_groups = 2;
  expect_gradients_match_differences(s);
}

}  // namespace
}  // namespace tessera::grouped_matmul
