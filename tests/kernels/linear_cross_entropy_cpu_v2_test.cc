// cpu_v2 (experimental): the check grid with tiny blocks (tails everywhere, many token blocks)
// and 1-3 threads on both of its bf16/f16 w paths — the f32 copy of w (gradients, the default)
// and the per-chunk conversion (forward, and gradients whenever Options::memory_budget is set: a
// 16-bit dw then goes through the vocabulary slices, which never take the copy). The default-block grid runs in tests/kernels/parity_test.cc.
#include <gtest/gtest.h>

#include <string>

#include "kernels/linear_cross_entropy/impl.h"
#include "kernels/linear_cross_entropy/testing.h"

namespace tessera::linear_cross_entropy {
namespace {

namespace lt = testing;

void expect_parity(const lt::CaseSpec& spec, const std::string& label) {
  for (Pass pass : {Pass::kForward, Pass::kBackward, Pass::kFused}) {
    const lt::ParityReport r = lt::check_parity(spec, "cpu_v2", pass);
    ASSERT_TRUE(r.ran) << label << " " << r.case_name << " " << pass_name(pass) << ": " << r.error;
    for (const auto& f : r.fields)
      EXPECT_TRUE(f.dev.ok()) << label << " " << r.case_name << " " << pass_name(pass) << " " << f.field << ": "
                              << f.dev.str();
  }
}

TEST(LinearCrossEntropyCpuV2, CheckGridBothWPathsSmallBlocksAndThreads) {
  if (!find_implementation("cpu_v2")) GTEST_SKIP() << "built without the cpu backend";
  int k = 0;
  for (lt::CaseSpec c : lt::check_grid()) {
    c.opt.block_sizes = BlockSizes{3, 8, 16};
    c.opt.num_threads = 1 + (k++ % 3);
    expect_parity(c, "copy of w, threads=" + std::to_string(c.opt.num_threads));
    c.opt.memory_budget = 1;  // a budget: per-chunk conversion with gradients (in slices for a 16-bit dw)
    expect_parity(c, "w by chunks, threads=" + std::to_string(c.opt.num_threads));
  }
}

}  // namespace
}  // namespace tessera::linear_cross_entropy
