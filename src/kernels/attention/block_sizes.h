// Tessera internal: how attention picks block sizes for a call.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attention/impl.h"
#include "kernels/attention/tuning.h"

namespace tessera::attention {

struct BlockSizeChoice {
  BlockSizes sizes;
  std::string source;  // "options", "tuned table", "autotune cache", "autotune", "default"
};

// Test seams. Production calls pass nothing and get the checked-in table, the default cache
// directory, real timing and the implementation's device kind.
struct TuningHooks {
  const std::vector<tune::TableEntry>* table = nullptr;  // nullptr: tuned_table()
  std::optional<std::string> cache_dir;                  // default: tune::default_cache_dir()
  std::optional<std::string> device_kind;                // default: impl.device_kind(p)
  tune::RunFn run;                                       // default: make_timed_run(impl, p, op)
  int64_t min_autotune_work = kMinAutotuneWork;
};

// The generic choice of tune/choose.h (options -> tuned table -> autotune-on-miss -> defaults)
// with this kernel's adapter.
BlockSizeChoice choose_block_sizes(const Implementation& impl, const Problem& p, const Options& opt,
                                   Pass op = Pass::kFused, const TuningHooks& hooks = {});

}  // namespace tessera::attention
