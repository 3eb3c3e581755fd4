// The BLAS guard shared by the CPU backends: one process-wide count, so that overlapping calls
// of different kernels (on different threads) keep OpenBLAS single-threaded until the last one
// ends and then restore the caller's setting — and the K = 0 edge of the sgemm wrapper.
#include <gtest/gtest.h>

#include <optional>

#include "primitives/cpu_blas.h"

namespace tessera::cpu_blas {
namespace {

TEST(CpuBlas, GuardsNestAcrossBackendsAndRestoreTheSetting) {
  const int before = threads();
  set_threads(2);
  if (threads() != 2) GTEST_SKIP() << "this OpenBLAS cannot run 2 threads";
  {
    std::optional<SingleThreaded> a(std::in_place);  // e.g. attention's call
    EXPECT_EQ(threads(), 1);
    {
      SingleThreaded b;  // linear_cross_entropy's call, overlapping
      a.reset();         // the first call ends while the second still runs
      EXPECT_EQ(threads(), 1);
    }
    EXPECT_EQ(threads(), 2);
  }
  set_threads(before);
}

TEST(CpuBlas, EmptyInnerDimensionScalesC) {
  float c[4] = {1, 2, 3, 4};
  sgemm(false, false, 2, 2, 0, 1.f, nullptr, 1, nullptr, 1, 0.5f, c, 2);
  EXPECT_FLOAT_EQ(c[0], 0.5f);
  EXPECT_FLOAT_EQ(c[3], 2.0f);
  sgemm(false, false, 2, 2, 0, 1.f, nullptr, 1, nullptr, 1, 0.0f, c, 2);
  EXPECT_FLOAT_EQ(c[1], 0.0f);
  float a[2] = {1, 2}, b[2] = {3, 4}, d[1] = {10};
  sgemm(false, false, 1, 1, 2, 2.f, a, 2, b, 1, 1.f, d, 1);  // 2·(1·3 + 2·4) + 10
  EXPECT_FLOAT_EQ(d[0], 32.0f);
}

}  // namespace
}  // namespace tessera::cpu_blas
