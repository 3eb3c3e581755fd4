// resolve_num_threads: the one thread-count rule, its cap, and its work-sized form.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>

#include "tessera/exec.h"

namespace tessera {
namespace {

TEST(Exec, ThreadCountsAreCapped) {
  EXPECT_EQ(resolve_num_threads(3), 3);
  EXPECT_EQ(resolve_num_threads(1024), 1024);
  // A CPU backend keeps per-thread state: INT_MAX threads once asked mla_decode for 9 GB.
  EXPECT_EQ(resolve_num_threads(INT_MAX), 1024);
  const char* saved = std::getenv("TESSERA_NUM_THREADS");
  const std::string keep = saved ? saved : "";
  setenv("TESSERA_NUM_THREADS", "2000000", 1);
  EXPECT_EQ(resolve_num_threads(0), 1024);
  setenv("TESSERA_NUM_THREADS", "5", 1);
  EXPECT_EQ(resolve_num_threads(0), 5);
  if (saved) setenv("TESSERA_NUM_THREADS", keep.c_str(), 1); else unsetenv("TESSERA_NUM_THREADS");
  const int d = resolve_num_threads(0);
  EXPECT_GE(d, 1);
  EXPECT_LE(d, 1024);
}

// A call of known work gets one thread per kMinWorkPerThread flops (at least 1, at most the
// machine's) unless a count was asked for, by the call or TESSERA_NUM_THREADS.
TEST(Exec, ThreadCountsFollowTheWorkUnlessAskedFor) {
  const char* saved = std::getenv("TESSERA_NUM_THREADS");
  const std::string keep = saved ? saved : "";
  unsetenv("TESSERA_NUM_THREADS");
  const int machine = resolve_num_threads(0);
  const double k = kMinWorkPerThread;
  for (double tiny : {0.0, -1.0, 1e3, std::nan(""), 1.9 * k}) EXPECT_EQ(resolve_num_threads(0, tiny), 1) << tiny;
  EXPECT_EQ(resolve_num_threads(0, 2 * k), std::min(2, machine));
  EXPECT_EQ(resolve_num_threads(0, 1e30), machine);
  EXPECT_EQ(resolve_num_threads(0, INFINITY), machine);
  EXPECT_EQ(resolve_num_threads(3, 1e3), 3);  // asked for: as given
  setenv("TESSERA_NUM_THREADS", "5", 1);
  EXPECT_EQ(resolve_num_threads(0, 1e3), 5);
  if (saved) setenv("TESSERA_NUM_THREADS", keep.c_str(), 1); else unsetenv("TESSERA_NUM_THREADS");
}

}  // namespace
}  // namespace tessera
