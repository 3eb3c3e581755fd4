// linear_cross_entropy: block-size selection for a call (options -> tuned table -> autotune on
// miss -> defaults). The generic pieces live in src/tune; this file is the policy.
#include "kernels/linear_cross_entropy/block_sizes.h"

#include "core/env.h"
#include "core/log.h"
#include "tessera/error.h"
#include "tune/autotune.h"
#include "tune/cache.h"

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

double autotune_budget_seconds() {
  const int ms = env::integer("TESSERA_AUTOTUNE_BUDGET_MS", 2000);
  return ms > 0 ? ms / 1000.0 : 2.0;
}

namespace {

bool is_valid(const Implementation& impl, const BlockSizes& bs) {
  try {
    impl.validate_block_sizes(bs);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Tuned sizes fitted to the shape; the unfitted sizes if fitting breaks a backend constraint;
// nullopt if neither is valid for this backend.
std::optional<BlockSizes> fit(const Implementation& impl, const Problem& p, const BlockSizes& tuned) {
  const BlockSizes s = sanitize_for_shape(tuned, p);
  if (is_valid(impl, s)) return s;
  if (is_valid(impl, tuned)) return tuned;
  return std::nullopt;
}

std::string describe(const Implementation& impl, const Problem& p, Pass op) {
  return std::string(kKernelName) + " " + impl.name() + " " + dtype_name(p.dtype) + " " +
         pass_name(op) + " B=" + std::to_string(p.B) + ",H=" + std::to_string(p.H) + ",V=" +
         std::to_string(p.V);
}

}  // namespace

BlockSizeChoice choose_block_sizes(const Implementation& impl, const Problem& p,
                                   const Options& opt, Pass op, const TuningHooks& hooks) {
  if (opt.block_sizes) {
    impl.validate_block_sizes(*opt.block_sizes);
    return {*opt.block_sizes, "options"};
  }
  const BlockSizes defaults = impl.default_block_sizes(p);
  if (!impl.tunable()) return {defaults, "default"};

  const std::string what = describe(impl, p, op);
  const std::string kind = hooks.device_kind ? *hooks.device_kind : impl.device_kind(p);
  const tune::Bucket* bucket = bucket_for(p);

  // 1. The checked-in table.
  if (bucket && env::flag("TESSERA_TUNED_TABLE", true)) {
    const auto& table = hooks.table ? *hooks.table : tuned_table();
    if (const tune::TableEntry* row =
            tune::lookup(table, impl.name(), kind, dtype_name(p.dtype), bucket->name)) {
      if (auto bs = fit(impl, p, from_params(row->params))) {
        log::debug(what + ": tuned table hit (" + kind + ", bucket " + bucket->name + "): " +
                   bs->str());
        return {*bs, "tuned table"};
      }
      log::warn_once(std::string(kKernelName) + ": tuned table row " + tune::params_str(row->params) +
                     " for " + impl.name() + " / " + kind + " / " + bucket->name +
                     " is not valid for the backend; ignoring it");
    }
  }
  log::debug(what + ": tuned table miss (" + kind + ", bucket " +
             (bucket ? bucket->name : std::string("none")) + ")");

  // 2. Autotune on miss.
  const bool enabled = opt.autotune_on_miss && env::flag("TESSERA_AUTOTUNE", true);
  if (enabled && worth_autotuning(p, hooks.min_autotune_work)) {
    tune::AutotuneRequest req;
    req.prefix = std::string(kKernelName) + "." + impl.name();
    req.key = autotune_key(impl, p, op, kind);
    for (const BlockSizes& c : tuning_candidates(impl, p)) req.candidates.push_back(to_params(c));
    req.policy.warmup = 1;
    req.policy.repeats = 3;
    req.policy.min_repeats = 1;
    req.policy.budget_s = autotune_budget_seconds();
    const tune::DiskCache cache(hooks.cache_dir ? *hooks.cache_dir : tune::default_cache_dir());
    tune::AutotuneResult r;
    try {
      req.make_run = [&]() -> tune::RunFn {
        if (hooks.run) return hooks.run;
        return make_timed_run(impl, p, op);
      };
      r = tune::lookup_or_autotune(cache, req);
    } catch (const Error& e) {  // scratch could not be allocated: no autotune, not the candidates' fault
      log::warn_once(what + ": autotune skipped (" + e.what() + ")");
      return {defaults, "default"};
    }
    switch (r.kind) {
      case tune::AutotuneResult::Kind::kFound:
        if (auto bs = fit(impl, p, from_params(r.params))) {
          log::debug(what + ": " + r.source + " (" + r.path + "): " + bs->str() +
                     (r.detail.empty() ? "" : " [" + r.detail + "]"));
          return {*bs, r.source};
        }
        break;
      case tune::AutotuneResult::Kind::kNegative:
        throw Error(ErrorCode::kUnsupported,
                    std::string(kKernelName) + ": implementation '" + impl.name() +
                        "' has no block sizes that run this problem (" + r.source + " " + r.path +
                        ": " + r.detail + ")");
      case tune::AutotuneResult::Kind::kInconclusive:
        log::debug(what + ": autotune inconclusive (" + r.detail + ")");
        break;
    }
  } else if (enabled) {
    log::debug(what + ": too small to autotune (B*H*V < " + std::to_string(hooks.min_autotune_work) + ")");
  }
  log::debug(what + ": default block sizes " + defaults.str());
  return {defaults, "default"};
}

}  // namespace tessera::linear_cross_entropy
