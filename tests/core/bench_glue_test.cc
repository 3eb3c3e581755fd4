// kernels/bench_glue.h: the forward-only baseline list and the shuffled page table of the paged
// kernels' benches.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/bench_glue.h"

namespace tessera::kernels {
namespace {

TEST(BenchGlue, ForwardBaselineOnlyWhenTheForwardIsTimed) {
  harness::BaselineCall c;
  c.name = "plain";
  c.pass = Pass::kBackward;  // set to forward
  const auto both = forward_baseline({Pass::kBackward, Pass::kForward}, c);
  ASSERT_EQ(both.size(), 1u);
  EXPECT_EQ(both[0].name, "plain");
  EXPECT_EQ(both[0].pass, Pass::kForward);
  EXPECT_TRUE(forward_baseline({Pass::kBackward, Pass::kFused}, c).empty());
  EXPECT_TRUE(forward_baseline({}, c).empty());
}

TEST(BenchGlue, ShuffledPageTableIsAPermutationFixedBySeed) {
  const Tensor t = shuffled_page_table(3, 5, 7);
  EXPECT_EQ(t.dtype(), DType::kI32);
  EXPECT_EQ(t.shape(), (Shape{3, 5}));
  std::vector<int32_t> ids(t.data_as<int32_t>(), t.data_as<int32_t>() + 15), sorted = ids, want(15);
  std::sort(sorted.begin(), sorted.end());
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(sorted, want);
  EXPECT_NE(ids, want);  // 1 in 15! to come out in order
  const Tensor again = shuffled_page_table(3, 5, 7);
  EXPECT_TRUE(std::equal(ids.begin(), ids.end(), again.data_as<int32_t>()));
  EXPECT_EQ(shuffled_page_table(0, 4, 1).numel(), 0);
}

}  // namespace
}  // namespace tessera::kernels
