// resolve_num_threads: the one thread-count rule, and its cap.
#include <gtest/gtest.h>

#include <climits>
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

}  // namespace
}  // namespace tessera
