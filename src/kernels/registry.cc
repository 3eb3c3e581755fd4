// Tessera: the list of kernels. A new kernel adds one line here (its spec() from spec.cc).
#include "kernels/registry.h"

#include <algorithm>

#include "dispatch/dispatch.h"
#include "tessera/error.h"

#include <cstdio>

namespace tessera {
namespace linear_cross_entropy {
const kernels::KernelSpec& spec();
}
namespace attention {
const kernels::KernelSpec& spec();
}
namespace grouped_matmul {
const kernels::KernelSpec& spec();
}
namespace mlstm {
const kernels::KernelSpec& spec();
}
namespace paged_attention {
const kernels::KernelSpec& spec();
}
namespace slstm {
const kernels::KernelSpec& spec();
}
namespace mla_decode {
const kernels::KernelSpec& spec();
}
}  // namespace tessera

namespace tessera::kernels {

const std::vector<const KernelSpec*>& all() {
  static const std::vector<const KernelSpec*> specs = {
      &linear_cross_entropy::spec(),
      &attention::spec(),
      &grouped_matmul::spec(),
      &mlstm::spec(),
      &paged_attention::spec(),
      &slstm::spec(),
      &mla_decode::spec(),
  };
  return specs;
}

std::string names() {
  std::string s;
  for (const KernelSpec* k : all()) s += (s.empty() ? "" : ", ") + k->name;
  return s;
}

const KernelSpec& get(const std::string& name) {
  for (const KernelSpec* k : all())
    if (k->name == name) return *k;
  throw Error(ErrorCode::kNotFound, "unknown kernel '" + name + "' (kernels: " + names() + ")");
}

const TensorView* CallArgs::tensor(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

TensorView CallArgs::tensor_or_empty(const std::string& name) const {
  const TensorView* t = tensor(name);
  return t ? *t : TensorView{};
}

bool CallArgs::skips(const std::string& name) const { return std::find(skip.begin(), skip.end(), name) != skip.end(); }

void check_skip(const CallSpec& call, const CallArgs& args, const std::string& kernel) {
  if (!args.skip.empty() && args.pass == Pass::kForward)
    throw Error(ErrorCode::kInvalidArgument, kernel + ": forward computes no gradient to skip (skip is for backward and fused)");
  for (const std::string& name : args.skip) {
    if (std::find(call.skippable.begin(), call.skippable.end(), name) != call.skippable.end()) continue;
    std::string list;
    for (const std::string& s : call.skippable) list += (list.empty() ? "" : ", ") + s;
    throw Error(ErrorCode::kInvalidArgument,
                kernel + ": cannot skip '" + name + "' (skippable: " + (list.empty() ? "none" : list) + ")");
  }
}

std::vector<std::string> parse_skip(const CallSpec& call, const std::string& text, const std::string& flag) {
  std::vector<std::string> out;
  std::string list;
  for (const std::string& s : call.skippable) list += (list.empty() ? "" : ", ") + s;
  for (size_t b = 0; !text.empty() && b <= text.size();) {
    const size_t e = std::min(text.find(',', b), text.size());
    const std::string name = text.substr(b, e - b);
    check(std::find(call.skippable.begin(), call.skippable.end(), name) != call.skippable.end(),
          ErrorCode::kInvalidArgument,
          flag + " takes a comma list of " + (list.empty() ? "nothing (no gradient can be skipped)" : list) +
              ", got '" + text + "'");
    check(std::find(out.begin(), out.end(), name) == out.end(), ErrorCode::kInvalidArgument,
          flag + " names " + name + " twice");
    out.push_back(name);
    b = e + 1;
  }
  return out;
}

std::vector<OutputDesc> outputs_of(const CallSpec& call, const CallArgs& args, const std::string& kernel) {
  check_skip(call, args, kernel);
  std::vector<OutputDesc> out = call.outputs(args);
  std::erase_if(out, [&](const OutputDesc& d) { return args.skips(d.name); });
  return out;
}

CallOutputs::CallOutputs(const std::vector<OutputDesc>& want, const std::vector<TensorView>& out, const CallArgs& a,
                         const std::string& kernel) {
  for (const OutputDesc& d : want)
    if (!a.skips(d.name)) names_.push_back(d.name);
  check(out.size() == names_.size(), ErrorCode::kInvalidArgument,
        kernel + ": " + pass_name(a.pass) + " writes " + std::to_string(names_.size()) + " outputs, got " +
            std::to_string(out.size()));
  out_ = out;
}

TensorView CallOutputs::operator[](const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return out_[i];
  return {};
}

const TensorView& required(const CallArgs& a, const std::string& kernel, const char* name) {
  const TensorView* t = a.tensor(name);
  if (!t) throw Error(ErrorCode::kInvalidArgument, kernel + ": " + name + " is required");
  return *t;
}

OutputDesc output_of(const dispatch::Dims& d, const std::string& name, const std::string& dims, const std::string& dtype) {
  const Shape shape = d.shape(dims);
  return {name, d.dtype(dtype), shape, contiguous_strides(shape)};
}

Tensor allocate_output(const OutputDesc& d, Device device) {
  if (d.strides.empty() || d.strides == contiguous_strides(d.shape)) return Tensor::zeros(d.dtype, d.shape, device);
  int64_t n = 1;
  for (int64_t v : d.shape) n *= v;
  return Tensor::zeros(d.dtype, {n}, device).as_strided(d.shape, d.strides);
}

namespace {

// One pass through a call, its inputs and outputs kept alive by the BenchCall's closures.
struct BoundPass {
  CallArgs args;
  std::vector<Tensor> outputs;
  std::vector<TensorView> views;
  std::vector<OutputDesc> descs;
  void allocate(const CallSpec& call, Device device) {
    descs = call.outputs(args);
    std::erase_if(descs, [&](const OutputDesc& d) { return args.skips(d.name); });
    for (const OutputDesc& d : descs) outputs.push_back(allocate_output(d, device));
    for (const Tensor& t : outputs) views.push_back(t.view());
  }
};

struct BoundCall {
  std::vector<std::pair<std::string, Tensor>> held;  // the inputs on the device
  BoundPass forward, pass;                          // forward: a backward pass's saved outputs
  std::string ran;
};

bool host_only(const CallSpec& call, const std::string& name) {
  for (const CallInput& in : call.inputs)
    if (in.name == name) return in.host_only;
  return false;
}

}  // namespace

harness::BenchCall bind_call(const CallSpec& call, const std::vector<std::pair<std::string, Tensor>>& inputs,
                             const harness::OptionValues& options, const std::string& implementation, Device device,
                             Pass pass, const ExecOptions& exec, const std::vector<std::string>& skip) {
  auto b = std::make_shared<BoundCall>();
  for (const auto& [name, t] : inputs) b->held.push_back({name, host_only(call, name) ? t : t.to(device)});
  CallArgs base;
  base.options = harness::defaults_of(call.options);
  for (const auto& [name, value] : options.all()) base.options.set(name, value);
  base.exec = exec;
  base.exec.implementation = implementation;
  for (const auto& [name, t] : b->held) base.tensors.push_back({name, t.view()});
  b->pass.args = base;
  b->pass.args.pass = pass;
  if (pass != Pass::kForward) b->pass.args.skip = skip;
  harness::BenchCall c;
  if (pass == Pass::kBackward && !call.saved_outputs.empty()) {
    b->forward.args = base;
    b->forward.args.pass = Pass::kForward;
    b->forward.allocate(call, device);
    for (size_t i = 0; i < b->forward.descs.size(); ++i)
      for (const std::string& saved : call.saved_outputs)
        if (b->forward.descs[i].name == saved) b->pass.args.tensors.push_back({saved, b->forward.views[i]});
    c.prepare = [b, &call] { call.call(b->forward.args, b->forward.views); };
  }
  b->pass.allocate(call, device);
  c.run = [b, &call] { b->ran = call.call(b->pass.args, b->pass.views); };
  c.ran = [b] { return b->ran; };
  c.outputs = [b] {
    std::vector<std::pair<std::string, Tensor>> o;
    for (size_t i = 0; i < b->pass.descs.size(); ++i) o.push_back({b->pass.descs[i].name, b->pass.outputs[i]});
    return o;
  };
  const bool has_loss = pass != Pass::kBackward && !b->pass.descs.empty() && b->pass.descs[0].shape.empty() &&
                        b->pass.descs[0].dtype == DType::kF32;
  if (has_loss)
    c.loss = [b]() -> std::optional<double> { return b->pass.outputs[0].to(Device::cpu()).data_as<float>()[0]; };
  return c;
}

std::string option_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

harness::OptionSpec block_sizes_option_spec(const std::string& example) {
  return {"block_sizes", harness::OptionSpec::Kind::kString,
          "block sizes, e.g. " + example + " (every field; empty: tuned table, autotune on a miss or defaults)", "", {}};
}

std::vector<std::string> pick_implementations(const KernelSpec& k, const std::string& list,
                                              bool include_reference) {
  const dispatch::RegistryView& reg = k.implementations();
  std::vector<std::string> out;
  if (list.find_first_not_of(" \t,") == std::string::npos) {
    for (const auto& info : reg.infos())
      if (include_reference || info.name != "reference") out.push_back(info.name);
    return out;
  }
  for (const std::string& n : dispatch::split_names(list)) {
    if (!reg.find(n)) {
      std::string known;
      for (const auto& info : reg.infos()) known += (known.empty() ? "" : ", ") + info.name;
      throw Error(ErrorCode::kNotFound,
                  k.name + ": no implementation named '" + n + "' (have: " + known + ")");
    }
    out.push_back(n);
  }
  return out;
}

std::string version_family(const std::string& name) {
  const size_t u = name.rfind("_v");
  if (u == std::string::npos || u == 0 || u + 2 >= name.size()) return name;
  for (size_t i = u + 2; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return name;
  return name.substr(0, u);
}

std::string version_base(const dispatch::RegistryView& reg, const std::string& name) {
  const std::string family = version_family(name);
  std::vector<const dispatch::ImplementationBase*> members;
  for (const dispatch::ImplementationBase* impl : reg.implementations())
    if (version_family(impl->name()) == family) members.push_back(impl);
  if (members.size() < 2) return {};
  // The family's current version (statuses of module placeholders not loaded read "current").
  for (const dispatch::ImplementationBase* impl : members)
    if (impl->name() != name && impl->status() == VersionStatus::kCurrent) return impl->name();
  return name == family ? std::string() : family;
}

harness::BenchCall CallBenchProblem::bind(const std::string& implementation, Device dev, Pass pass,
                                          const ExecOptions& exec) {
  const CallData c = call_data();
  return bind_call(kernel_().call, c.tensors, c.options, implementation, dev, pass, exec, c.skip);
}

BenchSpec bench_spec_of(std::vector<harness::OptionSpec> options, BenchFactory make) {
  BenchSpec b;
  b.options = std::move(options);
  b.make_problem = [make](const harness::GridShape& shape, DType dt, const harness::OptionValues& o, uint64_t seed) {
    return make(shape, dt, o, seed, true);
  };
  b.make_cost_model = [make](const harness::GridShape& shape, DType dt, const harness::OptionValues& o) {
    return make(shape, dt, o, 0, false);
  };
  return b;
}

harness::BenchConfig bench_config(const KernelSpec& k, const std::string& implementations,
                                  const std::vector<harness::GridShape>& shapes,
                                  const std::vector<DType>& dtypes,
                                  const harness::OptionValues& given, uint64_t seed,
                                  std::vector<std::string>* messages) {
  harness::BenchConfig cfg;
  cfg.kernel = k.name;
  const dispatch::RegistryView& reg = k.implementations();
  for (const std::string& name : pick_implementations(k, implementations, true)) {
    const dispatch::ImplementationBase* impl = reg.find(name);
    const dispatch::Availability a = impl->available();
    if (!a.ok) {
      if (messages) messages->push_back("implementation '" + name + "' unavailable here: " + a.reason);
      continue;
    }
    cfg.implementations.push_back(name);
    cfg.devices.push_back(impl->device_type());
    cfg.version_bases.push_back(version_base(reg, name));
  }
  harness::OptionValues options = harness::defaults_of(k.bench.options);
  for (const auto& [name, value] : given.all()) options.set(name, value);
  for (const auto& shape : shapes)
    for (DType dt : dtypes) {
      const std::string label = (shape.name.empty() ? "" : shape.name + " ") + dtype_name(dt);
      cfg.cases.push_back({shape.name, label, [&k, shape, dt, options, seed] {
                             return k.bench.make_problem(shape, dt, options, seed);
                           }});
      for (const std::string& d : k.dims)
        if (shape.dims.count(d)) cfg.cases.back().fields[d] = shape.dims.at(d);
      cfg.cases.back().fields["dtype"] = dtype_name(dt);
      if (k.bench.make_cost_model)
        cfg.cases.back().make_cost_model = [&k, shape, dt, options] { return k.bench.make_cost_model(shape, dt, options); };
    }
  cfg.passes = k.passes;
  cfg.stages = k.stages;
  return cfg;
}

}  // namespace tessera::kernels
