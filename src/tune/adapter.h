// Tessera internal (tuning): the glue between a kernel and the generic choice (tune/choose.h),
// written once for every kernel.
//
// A kernel describes its tuning with a traits struct K (its tuning.h):
//   using Impl, Problem, Sizes;                     its implementation base, problem, block sizes
//   static constexpr const char* kKernel;           "attention"
//   static constexpr int64_t kMinWork;              default autotune-on-miss threshold
//   static Params to_params(const Sizes&);          Sizes from_params(const Params&);
//   static Sizes fit(const Sizes&, const Problem&); tuned sizes fitted to the actual shape
//   static const std::vector<TableEntry>& table();  the checked-in tuned table
//   static const Bucket* bucket(const Problem&);    nullptr when no bucket matches
//   static bool worth(const Problem&, int64_t min_work);
//   static std::string key(const Impl&, const Problem&, Pass, const std::string& device_kind);
//   static Runner timed_run(const Impl&, const Problem&, Pass);  times one call on scratch outputs,
//                                                                 and hands them back (verify.h)
//   static std::string describe(const Impl&, const Problem&, Pass);  for logs
// Impl provides default_block_sizes, candidate_block_sizes, validate_block_sizes, tunable and
// device_kind (every kernel's implementation base does).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/log.h"
#include "tessera/error.h"
#include "tessera/exec.h"
#include "tune/choose.h"

namespace tessera::tune {

// Test seams. Production calls pass nothing and get the checked-in table, the default cache
// directory, real timing and the implementation's device kind.
struct Hooks {
  const std::vector<TableEntry>* table = nullptr;  // nullptr: the kernel's table
  std::optional<std::string> cache_dir;            // default: default_cache_dir()
  std::optional<std::string> device_kind;          // default: impl.device_kind(p)
  RunFn run;                                       // default: K::timed_run(impl, p, op)
  std::optional<int64_t> min_autotune_work;        // default: K::kMinWork
};

// The implementation's default first, then its candidates (duplicates dropped).
template <class K>
std::vector<typename K::Sizes> candidates_for(const typename K::Impl& impl, const typename K::Problem& p) {
  std::vector<typename K::Sizes> out{impl.default_block_sizes(p)};
  for (const auto& c : impl.candidate_block_sizes(p))
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  return out;
}

// What K::timed_run returns, written once: each run validates the candidate
// (impl.validate_block_sizes), runs `prepare(sizes)` untimed when given (a backward timed on a
// forward's saved outputs), then times `run(sizes)` up to impl.synchronize(p). `outputs` hands
// back what `run` wrote, for the sweep's check against the default's (tune/verify.h).
template <class K>
Runner timed_runner(const typename K::Impl& impl, const typename K::Problem& p,
                    std::function<void(const typename K::Sizes&)> run, OutputsFn outputs,
                    std::function<void(const typename K::Sizes&)> prepare = nullptr) {
  const typename K::Impl* ip = &impl;
  RunFn timed = [ip, p, run = std::move(run), prepare = std::move(prepare)](const Params& params) -> double {
    const typename K::Sizes bs = K::from_params(params);
    ip->validate_block_sizes(bs);
    if (prepare) {
      prepare(bs);
      ip->synchronize(p);
    }
    const auto t0 = std::chrono::steady_clock::now();
    run(bs);
    ip->synchronize(p);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  return {std::move(timed), std::move(outputs)};
}

// The generic choice (options -> tuned table -> autotune on miss -> defaults) for one call.
template <class K>
Choice choose_for(const typename K::Impl& impl, const typename K::Problem& p,
                  const std::optional<typename K::Sizes>& explicit_sizes, bool autotune_on_miss, Pass op,
                  const Hooks& hooks) {
  ChoiceRequest r;
  r.kernel = K::kKernel;
  r.implementation = impl.name();
  r.what = K::describe(impl, p, op);
  if (explicit_sizes) r.explicit_sizes = K::to_params(*explicit_sizes);
  r.defaults = K::to_params(impl.default_block_sizes(p));
  r.tunable = impl.tunable();
  r.validate = [&](const Params& q) { impl.validate_block_sizes(K::from_params(q)); };
  r.fit_to_shape = [&](const Params& q) { return K::to_params(K::fit(K::from_params(q), p)); };
  r.table = hooks.table ? hooks.table : &K::table();
  r.device_kind = hooks.device_kind ? *hooks.device_kind : impl.device_kind(p);
  r.dtype = dtype_name(p.dtype);
  r.bucket = K::bucket(p);
  r.autotune = autotune_on_miss && env::flag("TESSERA_AUTOTUNE", true);
  r.worth_autotuning = K::worth(p, hooks.min_autotune_work.value_or(K::kMinWork));
  if (r.tunable && !explicit_sizes) r.cache_key = K::key(impl, p, op, r.device_kind);
  r.cache_dir = hooks.cache_dir.value_or("");
  r.candidates = [&] {
    std::vector<Params> c;
    for (const auto& s : candidates_for<K>(impl, p)) c.push_back(K::to_params(s));
    return c;
  };
  r.make_run = [&]() -> Runner { return hooks.run ? Runner(hooks.run) : K::timed_run(impl, p, op); };
  return choose(r);
}

// The block sizes of one call and where they came from ("options", "tuned table", "autotune
// cache", "autotune", "default"): choose_for with the caller's options, converted back to Sizes.
template <class Sizes>
struct SizesChoice {
  Sizes sizes;
  std::string source;
};
template <class K, class Options>
SizesChoice<typename K::Sizes> choose_sizes(const typename K::Impl& impl, const typename K::Problem& p,
                                            const Options& opt, Pass op, const Hooks& hooks) {
  const Choice c = choose_for<K>(impl, p, opt.block_sizes, opt.autotune_on_miss, op, hooks);
  return {K::from_params(c.params), c.source};
}

// One call of a kernel with traits K, dispatched: on the implementation `registry` picks (its
// dispatch_problem), body(impl, sizes) with the block sizes choose_sizes gives that implementation
// (logged at debug with where they came from). Returns the implementation that ran.
template <class K, class Registry, class Options, class Body>
std::string dispatch_sized(const Registry& registry, const typename K::Problem& p, const Options& opt, Pass op,
                           Body&& body) {
  return registry.dispatch_problem(opt.implementation, p, [&](const typename K::Impl& impl) {
    const SizesChoice<typename K::Sizes> bs = choose_sizes<K>(impl, p, opt, op, Hooks{});
    log::debug(std::string(K::kKernel) + ": " + impl.name() + " with block sizes " + bs.sizes.str() + " (" + bs.source +
               ")");
    body(impl, bs.sizes);
  });
}

// A kernel's public validate_block_sizes(implementation, sizes): Error(kNotFound) for an unknown
// name, else the implementation's own check (Error(kInvalidArgument) naming the constraint).
template <class K>
void validate_named(const std::string& implementation, const typename K::Sizes& sizes) {
  const typename K::Impl* impl = K::find(implementation);
  check(impl != nullptr, ErrorCode::kNotFound,
        std::string(K::kKernel) + ": unknown implementation '" + implementation + "'");
  impl->validate_block_sizes(sizes);
}

}  // namespace tessera::tune
