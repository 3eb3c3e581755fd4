// Tessera internal: how attention picks block sizes for a call.
//
// Today: Options::block_sizes (validated for the implementation, used as given), else the
// implementation's defaults. The generic tuner (tuned table, autotune-on-miss) plugs in here.
#pragma once

#include <string>

#include "kernels/attention/impl.h"

namespace tessera::attention {

struct BlockSizeChoice {
  BlockSizes sizes;
  std::string source;  // "options", "default"
};

BlockSizeChoice choose_block_sizes(const Implementation& impl, const Problem& p, const Options& opt);

}  // namespace tessera::attention
