// linear_cross_entropy: block-size selection for a call.
#include "kernels/linear_cross_entropy/block_sizes.h"

#include "tessera/error.h"

namespace tessera::linear_cross_entropy {

std::string BlockSizes::str() const {
  return "b=" + std::to_string(b) + ",h=" + std::to_string(h) + ",v=" + std::to_string(v);
}

void validate_block_sizes(const std::string& implementation, const BlockSizes& bs) {
  const Implementation* impl = find_implementation(implementation);
  check(impl != nullptr, ErrorCode::kNotFound,
        std::string(kKernelName) + ": unknown implementation '" + implementation + "'");
  impl->validate_block_sizes(bs);
}

BlockSizeChoice choose_block_sizes(const Implementation& impl, const Problem& p,
                                   const Options& opt) {
  if (opt.block_sizes) {
    impl.validate_block_sizes(*opt.block_sizes);
    return {*opt.block_sizes, "options"};
  }
  // Tuned table and autotune-on-miss plug in here (src/tune).
  return {impl.default_block_sizes(p), "default"};
}

}  // namespace tessera::linear_cross_entropy
