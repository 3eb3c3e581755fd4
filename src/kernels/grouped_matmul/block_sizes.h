// Tessera internal: how grouped_matmul picks block sizes for a call.
#pragma once

#include <string>

#include "kernels/grouped_matmul/impl.h"
#include "kernels/grouped_matmul/tuning.h"
#include "tune/adapter.h"

namespace tessera::grouped_matmul {

struct BlockSizeChoice {
  BlockSizes sizes;
  std::string source;  // "options", "tuned table", "autotune cache", "autotune", "default"
};

using TuningHooks = tune::Hooks;  // test seams (table, cache dir, device kind, timing)

// The generic choice of tune/choose.h (options -> tuned table -> autotune-on-miss -> defaults)
// with this kernel's traits (tuning.h).
BlockSizeChoice choose_block_sizes(const Implementation& impl, const Problem& p, const Options& opt,
                                   Pass op = Pass::kFused, const TuningHooks& hooks = {});

}  // namespace tessera::grouped_matmul
