#include "kernels/declared_tune.h"

#include <chrono>
#include <map>
#include <memory>

#include "harness/device_hooks.h"
#include "tessera/error.h"
#include "tune/device_kind.h"

namespace tessera::kernels {
namespace {

harness::GridShape grid_shape(const KernelSpec& k, const std::vector<int64_t>& shape) {
  check(shape.size() == k.dims.size(), ErrorCode::kInvalidArgument,
        k.name + ": a tuning shape has " + std::to_string(k.dims.size()) + " dims, got " + std::to_string(shape.size()));
  harness::GridShape g;
  for (size_t i = 0; i < shape.size(); ++i) g.dims[k.dims[i]] = shape[i];
  return g;
}

// The bench problem and one bound call per candidate, bound on first use.
struct Bound {
  std::unique_ptr<harness::BenchProblem> problem;
  std::map<std::string, harness::BenchCall> calls;  // by params_str
  std::string current;                              // the candidate that ran last
};

tune::Runner make_runner(const tune::Declared& d, const KernelSpec& k, const std::vector<int64_t>& shape, DType dtype,
                         Pass pass, const std::string& impl, DeviceType type) {
  auto b = std::make_shared<Bound>();
  b->problem = k.bench.make_problem(grid_shape(k, shape), dtype, harness::defaults_of(k.bench.options), 1);
  check(!b->problem->call_data().tensors.empty(), ErrorCode::kInternal,
        k.name + ": its bench problem does not expose call_data (declared tuning needs it)");
  const Device dev = type == DeviceType::kCPU ? Device::cpu() : Device{type, 0};
  const harness::DeviceHooks* hooks = type == DeviceType::kCPU ? nullptr : harness::device_hooks(type);
  const KernelSpec* kp = &k;
  tune::RunFn run = [b, kp, &d, shape, pass, impl, dev, hooks](const tune::Params& params) {
    if (d.validate) d.validate(params, shape);  // a candidate that breaks the joint check fails
    const std::string key = tune::params_str(params);
    auto it = b->calls.find(key);
    if (it == b->calls.end()) {
      harness::BenchProblem::CallData data = b->problem->call_data();
      if (d.carrier.empty())
        for (const auto& [name, value] : params) data.options.set(name, std::to_string(value));
      else
        data.options.set(d.carrier, tune::params_str(params));
      ExecOptions exec;
      exec.autotune_on_miss = false;  // the candidate is given: nothing to choose
      it = b->calls.emplace(key, bind_call(kp->call, data.tensors, data.options, impl, dev, pass, exec, data.skip)).first;
      if (it->second.prepare) it->second.prepare();
    }
    b->current = key;
    const auto t0 = std::chrono::steady_clock::now();
    it->second.run();
    if (hooks && hooks->synchronize) hooks->synchronize(dev.index);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double rtol = d.rtol ? d.rtol(dtype) : 0.0;
  tune::OutputsFn outputs = [b, rtol] {
    std::vector<tune::Output> o;
    const auto it = b->calls.find(b->current);
    if (it == b->calls.end() || !it->second.outputs) return o;
    for (auto& [name, t] : it->second.outputs()) o.push_back({name, t, rtol});
    return o;
  };
  return {std::move(run), std::move(outputs)};
}

}  // namespace

TuneSpec declared_tune_spec(const tune::Declared& d, const KernelSpec& (*kernel)()) {
  TuneSpec t;
  t.buckets = [&d]() -> const std::vector<tune::Bucket>& { return d.buckets; };
  t.table = [&d]() -> const std::vector<tune::TableEntry>& { return d.table(); };
  t.tunable = [&d](const std::string& impl) { return d.tunable(impl); };
  t.job = [&d, kernel](const std::string& impl, const std::vector<int64_t>& shape, DType dtype, Pass pass,
                      bool with_data) {
    const KernelSpec& k = kernel();
    const dispatch::ImplementationBase* ip = k.implementations().find(impl);
    check(ip != nullptr, ErrorCode::kNotFound, k.name + ": unknown implementation '" + impl + "'");
    TuneJob job;
    const DeviceType type = ip->device_type();
    job.device_kind = tune::default_device_kind(type);
    job.candidates = d.candidates(shape, resolve_num_threads(0));
    job.support = ip->available();
    if (with_data)
      job.make_run = [&d, kernel, shape, dtype, pass, impl, type] {
        return make_runner(d, kernel(), shape, dtype, pass, impl, type);
      };
    return job;
  };
  t.source.kernel = d.kernel;
  t.source.include = d.table_header();
  t.source.cpp_namespace = d.table_ns();
  t.source.function = "tuned_table";
  t.source.regenerate = "tessera tune " + d.kernel +
                        " --emit-table   (from the repository root, on the machine to tune; rebuild first: rows of "
                        "other machines are kept)";
  t.source.empty_note = "No rows: no tunable implementation was measured yet. Every lookup misses and falls to "
                        "autotune-on-miss or the defaults.";
  t.table_path = d.table_file();
  return t;
}

}  // namespace tessera::kernels
