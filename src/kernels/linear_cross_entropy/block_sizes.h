// Tessera internal: how linear_cross_entropy picks block sizes for a call.
#pragma once

#include <string>

#include "kernels/linear_cross_entropy/impl.h"

namespace tessera::linear_cross_entropy {

struct BlockSizeChoice {
  BlockSizes sizes;
  std::string source;  // "options", "tuned table", "autotune cache", "autotune", "default"
};

// options.block_sizes if set (validated for `impl`, never silently changed), else the tuned
// table / autotune-on-miss (tunable implementations only), else impl.default_block_sizes(p).
BlockSizeChoice choose_block_sizes(const Implementation& impl, const Problem& p,
                                   const Options& opt);

}  // namespace tessera::linear_cross_entropy
