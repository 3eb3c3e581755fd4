// attention: block-size selection for a call (options -> tuned table -> autotune on miss ->
// defaults). The generic pieces live in src/tune; this file is the policy.
#include "kernels/attention/block_sizes.h"

#include "core/env.h"
#include "tessera/error.h"
#include "tune/choose.h"

namespace tessera::attention {

std::string BlockSizes::str() const { return "q=" + std::to_string(q) + ",kv=" + std::to_string(kv); }

void validate_block_sizes(const std::string& implementation, const BlockSizes& bs) {
  const Implementation* impl = find_implementation(implementation);
  check(impl != nullptr, ErrorCode::kNotFound,
        std::string(kKernelName) + ": unknown implementation '" + implementation + "'");
  impl->validate_block_sizes(bs);
}

namespace {

std::string describe(const Implementation& impl, const Problem& p, Pass op) {
  return std::string(kKernelName) + " " + impl.name() + " " + dtype_name(p.dtype) + " " + pass_name(op) +
         " N=" + std::to_string(p.N) + ",Sq=" + std::to_string(p.Sq) + ",Sk=" + std::to_string(p.Sk) +
         ",Hq=" + std::to_string(p.Hq) + ",D=" + std::to_string(p.D);
}

}  // namespace

BlockSizeChoice choose_block_sizes(const Implementation& impl, const Problem& p, const Options& opt, Pass op,
                                   const TuningHooks& hooks) {
  tune::ChoiceRequest r;
  r.kernel = kKernelName;
  r.implementation = impl.name();
  r.what = describe(impl, p, op);
  if (opt.block_sizes) r.explicit_sizes = to_params(*opt.block_sizes);
  r.defaults = to_params(impl.default_block_sizes(p));
  r.tunable = impl.tunable();
  r.validate = [&](const tune::Params& q) { impl.validate_block_sizes(from_params(q)); };
  r.fit_to_shape = [&](const tune::Params& q) { return to_params(sanitize_for_shape(from_params(q), p)); };
  r.table = hooks.table ? hooks.table : &tuned_table();
  r.device_kind = hooks.device_kind ? *hooks.device_kind : impl.device_kind(p);
  r.dtype = dtype_name(p.dtype);
  r.bucket = bucket_for(p);
  r.autotune = opt.autotune_on_miss && env::flag("TESSERA_AUTOTUNE", true);
  r.worth_autotuning = worth_autotuning(p, hooks.min_autotune_work);
  if (r.tunable && !opt.block_sizes) r.cache_key = autotune_key(impl, p, op, r.device_kind);
  r.cache_dir = hooks.cache_dir.value_or("");
  r.candidates = [&] {
    std::vector<tune::Params> c;
    for (const BlockSizes& b : tuning_candidates(impl, p)) c.push_back(to_params(b));
    return c;
  };
  r.make_run = [&]() -> tune::RunFn { return hooks.run ? hooks.run : make_timed_run(impl, p, op); };
  const tune::Choice c = tune::choose(r);
  return {from_params(c.params), c.source};
}

}  // namespace tessera::attention
