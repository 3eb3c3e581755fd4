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
  for (size_t i = 0; i < c.dims.size() && i < d.buckets.front().dims.size(); ++i) {
    const std::string& name = d.buckets.front().dims[i].name;
    const bool ragged = std::find(d.ragged_dims.begin(), d.ragged_dims.end(), name) != d.ragged_dims.end();
    k += "|" + name + (ragged ? "<=" + std::to_string(pow2_class(c.dims[i])) : "=" + std::to_string(c.dims[i]));
  }
  if (!c.variant.empty()) k += "|" + c.variant;
  k += std::string("|op=") + pass_name(c.pass);
  if (c.device == DeviceType::kCPU) k += "|threads=" + std::to_string(c.threads);
  return k + "|version=" + TESSERA_VERSION;
}

OutputsFn borrowed_outputs(std::vector<Buffer> buffers) {
  return [buffers = std::move(buffers)] {
    std::vector<Output> out;
    for (const Buffer& b : buffers)
      if (b.data)
        out.push_back({b.name, Tensor::borrow(TensorView(b.data, b.dtype, b.shape, contiguous_strides(b.shape), Device::cpu()))});
    return out;
  };
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

// A set of options (a call's, a tuned-table row, a cache entry) names each declared option once
// and nothing else: a cache file written by hand or by another build without one was read as an
// empty value.
void check_names(const Declared& d, const Params& p) {
  bool ok = p.size() == d.options.size();
  for (const std::string& name : d.options) ok = ok && param(p, name).has_value();
  check(ok, ErrorCode::kInvalidArgument, d.kernel + ": block sizes " + params_str(p) + " do not name each of its options once");
}

}  // namespace

Choice choose_declared(const Declared& d, const DeclaredCall& c, const std::function<void(const Params&)>& run_once,
                       const OutputsFn& outputs) {
  check(!d.buckets.empty() && d.candidates, ErrorCode::kInternal, d.kernel + ": tuning declared without buckets");
  const std::vector<Params> cands = d.candidates(c.dims, c.threads);
  check(!cands.empty(), ErrorCode::kInternal, d.kernel + ": no tuning candidates");
  ChoiceRequest r;
  r.kernel = d.kernel;
  r.implementation = c.implementation;
  r.what = d.kernel + " " + c.implementation + " " + dtype_name(c.dtype) + " " + pass_name(c.pass);
  const bool own_default = d.default_of && !d.tunable(c.implementation);
  r.defaults = c.default_sizes ? *c.default_sizes : own_default ? d.default_of(c.implementation) : cands.front();
  r.explicit_sizes = given_options(d, c, r.defaults);
  r.tunable = d.tunable(c.implementation);
  // The names, then the joint check where declared; each implementation validates its own limits
  // when it runs.
  r.validate = [&d, &c](const Params& p) {
    check_names(d, p);
    if (d.validate) d.validate(p, c.dims);
  };
  r.table = d.table ? &d.table() : nullptr;
  r.device_kind = default_device_kind(c.device);
  r.dtype = dtype_name(c.dtype);
  r.bucket = match_bucket(d.buckets, c.dims);
  r.autotune = c.autotune_on_miss && bool(run_once) && c.device == DeviceType::kCPU && env::flag("TESSERA_AUTOTUNE", true);
  r.worth_autotuning = d.work && d.work(c.dims) >= d.min_work;
  if (r.tunable && !r.explicit_sizes) r.cache_key = declared_key(d, c, r.device_kind);
  r.candidates = [cands] { return cands; };
  r.make_run = [&]() -> Runner {
    RunFn run = [&](const Params& p) {
      if (d.validate) d.validate(p, c.dims);  // a candidate that breaks the joint check fails here
      const auto t0 = std::chrono::steady_clock::now();
      run_once(p);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    const double rtol = d.rtol ? d.rtol(c.dtype) : 0.0;
    OutputsFn outs = outputs ? OutputsFn([&outputs, rtol] {
      std::vector<Output> o = outputs();
      for (Output& x : o) x.rtol = rtol;
      return o;
    })
                             : OutputsFn();
    return {std::move(run), std::move(outs)};
  };
  return choose(r);
}

}  // namespace tessera::tune
