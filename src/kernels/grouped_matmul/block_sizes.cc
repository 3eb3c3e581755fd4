// grouped_matmul: block-size selection for a call (options -> tuned table -> autotune on miss ->
// defaults). The generic pieces live in src/tune; this file is the policy.
#include "kernels/grouped_matmul/block_sizes.h"

#include "tessera/error.h"

namespace tessera::grouped_matmul {

std::string BlockSizes::str() const { return "m=" + std::to_string(m) + ",n=" + std::to_string(n); }

void validate_block_sizes(const std::string& implementation, const BlockSizes& bs) {
  const Implementation* impl = find_implementation(implementation);
  check(impl != nullptr, ErrorCode::kNotFound,
        std::string(kKernelName) + ": unknown implementation '" + implementation + "'");
  impl->validate_block_sizes(bs);
}

BlockSizeChoice choose_block_sizes(const Implementation& impl, const Problem& p, const Options& opt, Pass op,
                                   const TuningHooks& hooks) {
  const tune::Choice c = tune::choose_for<Tuning>(impl, p, opt.block_sizes, opt.autotune_on_miss, op, hooks);
  return {from_params(c.params), c.source};
}

}  // namespace tessera::grouped_matmul
