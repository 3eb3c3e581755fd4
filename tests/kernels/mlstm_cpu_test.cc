// mlstm cpu: the chunkwise form against the reference over the full check grid (the parity suite
// runs the quick one), thread counts, and determinism.
#include <gtest/gtest.h>

#include "kernels/mlstm/testing.h"

namespace tessera {
namespace {

using mlstm::testing::CaseSpec;

void expect_parity(const CaseSpec& c, Pass pass) {
  const harness::ParityReport r = mlstm::testing::check_parity(c, "cpu", pass);
  ASSERT_TRUE(r.ran) << c.name() << ": " << r.error;
  for (const auto& f : r.fields) EXPECT_TRUE(f.dev.ok()) << c.name() << " " << pass_name(pass) << " " << f.field << ": " << f.dev.str();
}

TEST(MlstmCpu, FullGridForwardAndBackward) {
  for (const CaseSpec& c : mlstm::testing::check_grid(false)) {
    expect_parity(c, Pass::kForward);
    expect_parity(c, Pass::kBackward);
  }
}

// Chunk sizes that divide S and that do not, down to 1 (every step its own chunk) and past S.
TEST(MlstmCpu, ChunkSizes) {
  for (int64_t chunk : {1, 2, 3, 5, 8, 16, 40}) {
    CaseSpec c;
    c.S = 16, c.B = 2, c.DK = 6, c.DV = 10, c.resets = "random", c.initial_state = true;
    c.opt.chunk_size = chunk;
    c.seed = 40 + chunk;
    expect_parity(c, Pass::kFused);
  }
}

TEST(MlstmCpu, ThreadCounts) {
  for (int threads : {1, 2, 3, 7}) {
    CaseSpec c;
    c.B = 3, c.NH = 3, c.S = 19, c.resets = "inside";
    c.opt.chunk_size = 4, c.opt.num_threads = threads;
    expect_parity(c, Pass::kFused);
  }
}

}  // namespace
}  // namespace tessera
