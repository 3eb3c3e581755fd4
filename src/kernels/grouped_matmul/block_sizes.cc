// grouped_matmul: block-size selection for a call (options -> defaults).
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

BlockSizeChoice choose_block_sizes(const Implementation& impl, const Problem& p, const Options& opt, Pass) {
  if (opt.block_sizes) {
    impl.validate_block_sizes(*opt.block_sizes);
    return {*opt.block_sizes, "options"};
  }
  return {impl.default_block_sizes(p), "default"};
}

}  // namespace tessera::grouped_matmul
