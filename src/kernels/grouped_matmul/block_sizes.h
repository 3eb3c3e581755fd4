// Tessera internal: how grouped_matmul picks block sizes for a call.
#pragma once

#include <string>

#include "kernels/grouped_matmul/impl.h"

namespace tessera::grouped_matmul {

struct BlockSizeChoice {
  BlockSizes sizes;
  std::string source;  // "options" or "default"
};

// Options' block sizes (validated by the implementation), else the implementation's defaults.
// Not tuned yet: the kernel has no tuned table or autotune-on-miss (docs/kernels/grouped_matmul.md).
BlockSizeChoice choose_block_sizes(const Implementation& impl, const Problem& p, const Options& opt, Pass op);

}  // namespace tessera::grouped_matmul
