#include "tune/declared.h"

#include <algorithm>
#include <chrono>

#include "core/env.h"
#include "tessera/error.h"
#include "tessera/version.h"
#include "tune/device_kind.h"

namespace tessera::tune {

bool Declared::tunable(const std::string& implementation) const {
  return std::find(implementations.begin(), implementations.end(), implementation) != implementations.end();
}

std::string declared_key(const Declared& d, const DeclaredCall& c, const std::string& device_kind) {
  std::string k = d.kernel + "|impl=" + c.implementation + "|device=" + device_kind + "|dtype=" + dtype_name(c.dtype);
  for (size_t i = 0; i < c.dims.size() && i < d.buckets.front().dims.size(); ++i)
    k += "|" + d.buckets.front().dims[i].name + "=" + std::to_string(c.dims[i]);
  k += std::string("|op=") + pass_name(c.pass);
  if (c.device == DeviceType::kCPU) k += "|threads=" + std::to_string(c.threads);
  return k + "|version=" + TESSERA_VERSION;
}

namespace {

// The call's options when it gave every one (> 0), else nullopt; a partial set keeps the given
// values over the default candidate.
std::optional<Params> given_options(const Declared& d, const DeclaredCall& c, const Params& dflt) {
  Params out;
  bool all = true, any = false;
  for (const std::string& name : d.options) {
    const auto v = param(c.given, name);
    const bool set = v && *v > 0;
    all = all && set, any = any || set;
    out.push_back({name, set ? *v : param(dflt, name).value_or(0)});
  }
  if (all || any) return out;
  return std::nullopt;
}

}  // namespace

Choice choose_declared(const Declared& d, const DeclaredCall& c, const std::function<void(const Params&)>& run_once) {
  check(!d.buckets.empty() && d.candidates, ErrorCode::kInternal, d.kernel + ": tuning declared without buckets");
  const std::vector<Params> cands = d.candidates(c.dims);
  check(!cands.empty(), ErrorCode::kInternal, d.kernel + ": no tuning candidates");
  ChoiceRequest r;
  r.kernel = d.kernel;
  r.implementation = c.implementation;
  r.what = d.kernel + " " + c.implementation + " " + dtype_name(c.dtype) + " " + pass_name(c.pass);
  r.explicit_sizes = given_options(d, c, cands.front());
  r.defaults = cands.front();
  r.tunable = d.tunable(c.implementation);
  r.validate = [](const Params&) {};  // the implementation validates when it runs
  r.table = d.table ? &d.table() : nullptr;
  r.device_kind = default_device_kind(c.device);
  r.dtype = dtype_name(c.dtype);
  r.bucket = match_bucket(d.buckets, c.dims);
  r.autotune = c.autotune_on_miss && bool(run_once) && env::flag("TESSERA_AUTOTUNE", true);
  r.worth_autotuning = d.work && d.work(c.dims) >= d.min_work;
  if (r.tunable && !r.explicit_sizes) r.cache_key = declared_key(d, c, r.device_kind);
  r.candidates = [cands] { return cands; };
  r.make_run = [&run_once]() -> Runner {
    return RunFn([&run_once](const Params& p) {
      const auto t0 = std::chrono::steady_clock::now();
      run_once(p);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  };
  return choose(r);
}

}  // namespace tessera::tune
