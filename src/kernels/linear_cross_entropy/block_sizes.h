// Tessera internal: how linear_cross_entropy picks block sizes for a call.
#pragma once

#include <string>

#include "kernels/linear_cross_entropy/impl.h"
#include "kernels/linear_cross_entropy/tuning.h"
#include "tune/adapter.h"

namespace tessera::linear_cross_entropy {

struct BlockSizeChoice {
  BlockSizes sizes;
  std::string source;  // "options", "tuned table", "autotune cache", "autotune", "default"
};

using TuningHooks = tune::Hooks;  // test seams (table, cache dir, device kind, timing)

// The generic choice of tune/choose.h (options -> tuned table -> autotune-on-miss -> defaults)
// with this kernel's traits (tuning.h). Logs the choice at debug level (TESSERA_LOG_LEVEL=debug).
BlockSizeChoice choose_block_sizes(const Implementation& impl, const Problem& p, const Options& opt,
                                   Pass op = Pass::kFused, const TuningHooks& hooks = {});

}  // namespace tessera::linear_cross_entropy
