// tessera run KERNEL: a kernel on the user's own .npy arrays, derived from the kernel's declared
// call signature (CallSpec, kernels/registry.h) — the same one the Python bindings use. Flags:
// every input (--kebab-name, plus older spellings), every option, --grad with the upstream
// gradients --grad-<output> the backward declares (a forward output's: ones by default; the last
// states' of mlstm and slstm: zero unless given). The forward (or, with
// --grad, the fused pass) runs on host tensors; outputs are written as NAME.npy (floats as f32).
// Users' files are checked for NaN/Inf before anything runs (ExecOptions::check_finite), and
// nothing is written unless the whole call succeeded.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "common.h"
#include "harness/npy.h"
#include "tessera/error.h"

namespace tessera::cli {
namespace {

struct RunArgs {
  std::map<std::string, std::string> files;  // input name -> path
  std::map<std::string, std::string> compounds;  // compound flag -> "A,B"
  std::string out, impl;
  std::string skip;  // --skip-grads: gradients left out, comma list
  bool grad = false;
  int threads = 0;
  int64_t memory_budget_mib = 0;
};

std::string flag_names(const std::string& name, const std::vector<std::string>& aliases) {
  std::string f = "--" + harness::kebab_case(name);
  for (const std::string& a : aliases) f += ",--" + a;
  return f;
}

bool has_grad(const kernels::KernelSpec& k) {
  return !k.call.forward_outputs.empty() &&
         std::find(k.passes.begin(), k.passes.end(), Pass::kFused) != k.passes.end();
}

// The upstream gradients the backward declares (grad_<output>); its other grad inputs are saved
// forward outputs (lse, o), which the fused pass that --grad runs forms itself: not offered.
std::vector<kernels::CallInput> upstream_gradients(const kernels::KernelSpec& k) {
  std::vector<kernels::CallInput> out;
  for (const kernels::CallInput& g : k.call.grad_inputs)
    if (g.name.rfind("grad_", 0) == 0) out.push_back(g);
  return out;
}

// Whether grad_<output> is that of a forward output (required by the backward: ones by default)
// rather than an optional one (the last states of mlstm and slstm: zero when not given).
bool of_forward_output(const kernels::KernelSpec& k, const kernels::CallInput& g) {
  for (const std::string& f : k.call.forward_outputs)
    if (g.name == "grad_" + f) return true;
  return false;
}

std::string outputs_help(const kernels::KernelSpec& k) {
  std::vector<std::string> names = k.call.forward_outputs;
  for (const std::string& n : k.call.saved_outputs)
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n + ".npy";
  // A forward-only kernel declares no forward outputs (they name what takes a gradient).
  s += s.empty() ? "its outputs as NAME.npy (floats as f32)" : " and the outputs its options ask for (floats as f32)";
  if (has_grad(k)) s += "; with --grad the gradients d<input>.npy, for upstream gradients of ones by default";
  return s;
}

// Splits "A,B" over the options of a compound flag (--window 3,-1 -> window_left, window_right).
void apply_compound(const kernels::CompoundFlag& c, const std::string& text, harness::OptionValues& o) {
  std::vector<std::string> parts(1);
  for (char ch : text) {
    if (ch == ',')
      parts.emplace_back();
    else
      parts.back().push_back(ch);
  }
  check(parts.size() == c.options.size(), ErrorCode::kInvalidArgument,
        "--" + c.flag + " wants " + std::to_string(c.options.size()) + " comma-separated values, got '" + text + "'");
  for (size_t i = 0; i < parts.size(); ++i) o.set(c.options[i], parts[i]);
}

Tensor ones_f32(const Shape& shape) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::fill_n(t.data_as<float>(), t.numel(), 1.0f);
  return t;
}

// The forward output `name`'s shape, as the kernel describes it for these inputs and options.
// The forward output `name`'s shape, as the kernel describes it for these inputs and options (the
// partial form of linear_cross_entropy has no loss, and no fused pass: said so, as a usage error).
Shape forward_output_shape(const kernels::KernelSpec& k, kernels::CallArgs args, const std::string& name) {
  args.pass = Pass::kForward;
  for (const kernels::OutputDesc& d : k.call.outputs(args))
    if (d.name == name) return d.shape;
  throw Error(ErrorCode::kInvalidArgument, k.name + ": --grad: with these options the forward gives no '" + name +
                                               "' to take a gradient of, and the fused pass is not defined for them "
                                               "(run without --grad)");
}

// Element i (row-major order) of a strided view, as an offset in elements.
int64_t offset_of(const TensorView& v, int64_t i) {
  int64_t off = 0;
  for (int64_t d = v.ndim() - 1; d >= 0; --d) {
    off += (i % v.shape[d]) * v.strides[d];
    i /= v.shape[d];
  }
  return off;
}

// A contiguous host copy in f32 (floats) or the tensor's own dtype (integers): what NAME.npy holds.
Tensor for_file(const Tensor& t) {
  const TensorView& v = t.view();
  const DType dt = is_float(v.dtype) ? DType::kF32 : v.dtype;
  if (dt == v.dtype && v.is_contiguous()) return t;
  Tensor o = Tensor::empty(dt, v.shape);
  const size_t esz = dtype_size(v.dtype);
  for (int64_t i = 0; i < o.numel(); ++i) {
    const int64_t off = offset_of(v, i);
    if (dt == DType::kF32)
      o.data_as<float>()[i] = load_as_f32(v.data, v.dtype, off);
    else
      std::memcpy(static_cast<char*>(o.data()) + i * esz, static_cast<const char*>(v.data) + off * esz, esz);
  }
  return o;
}

struct Loaded {
  std::vector<std::pair<std::string, Tensor>> tensors;
  kernels::CallArgs args;
};

Loaded load(const kernels::KernelSpec& k, const RunArgs& a, const harness::OptionValues& options) {
  Loaded l;
  auto take = [&](const std::string& name) {
    auto it = a.files.find(name);
    if (it != a.files.end() && !it->second.empty()) l.tensors.push_back({name, npy::load(it->second)});
  };
  for (const auto& in : k.call.inputs) take(in.name);
  for (const auto& g : upstream_gradients(k)) {  // every upstream gradient declared, each with --grad only
    auto it = a.files.find(g.name);
    check(a.grad || it == a.files.end() || it->second.empty(), ErrorCode::kInvalidArgument,
          "--" + harness::kebab_case(g.name) + " needs --grad");
    take(g.name);
  }
  l.args.pass = a.grad ? Pass::kFused : Pass::kForward;
  check(a.skip.empty() || a.grad, ErrorCode::kInvalidArgument, "--skip-grads needs --grad");
  l.args.skip = kernels::parse_skip(k.call, a.skip, "--skip-grads");
  l.args.options = options;
  l.args.exec.implementation = a.impl;
  l.args.exec.num_threads = a.threads;
  l.args.exec.memory_budget = static_cast<size_t>(a.memory_budget_mib) << 20;
  l.args.exec.check_finite = true;  // users' files: reject NaN/Inf before computing
  for (const auto& [name, t] : l.tensors) l.args.tensors.push_back({name, t.view()});
  if (!a.grad) return l;
  for (const std::string& f : k.call.forward_outputs) {
    if (l.args.tensor("grad_" + f)) continue;
    l.tensors.push_back({"grad_" + f, ones_f32(forward_output_shape(k, l.args, f))});
    l.args.tensors.push_back({"grad_" + f, l.tensors.back().second.view()});
  }
  return l;
}

// Outputs of a forward pass on these arguments (a fused pass writes them, then the gradients).
size_t descs_of_forward(const kernels::KernelSpec& k, kernels::CallArgs args) {
  args.pass = Pass::kForward;
  return k.call.outputs(args).size();
}

// One line: the inputs' shapes and dtypes, the options that differ from their defaults and the
// value of every scalar f32 output (a loss).
std::string summary(const kernels::KernelSpec& k, const Loaded& l,
                    const std::vector<std::pair<std::string, Tensor>>& outs) {
  std::string s;
  for (const auto& [name, t] : l.tensors) s += fmt::format(" {}={}:{}", name, shape_str(t.shape()), dtype_name(t.dtype()));
  const harness::OptionValues defaults = harness::defaults_of(k.call.options);
  for (const auto& [name, v] : l.args.options.all())
    if (defaults.all().count(name) && defaults.str(name) != v) s += " " + name + "=" + v;
  for (const auto& [name, t] : outs)
    if (t.numel() == 1 && t.shape().empty() && t.dtype() == DType::kF32) s += fmt::format(" {}={}", name, t.data_as<float>()[0]);
  return s;
}

std::string file_of(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / (name + ".npy")).string();
}

// --out and every NAME.npy in it writable, before anything is computed.
void check_out(const std::string& dir, const std::vector<kernels::OutputDesc>& outs) {
  std::vector<PathArg> files;
  for (const kernels::OutputDesc& d : outs) files.push_back({"--out", file_of(dir, d.name)});
  check_outputs(files, {{"--out", dir}});
}

void write_outputs(const std::vector<std::pair<std::string, Tensor>>& outs, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::kIo, dir + ": cannot create output directory: " + ec.message());
  std::string names;
  std::vector<std::pair<std::string, TensorView>> files;
  for (const auto& [name, t] : outs) {
    files.push_back({file_of(dir, name), t.view()});
    names += (names.empty() ? "" : ",") + name;
  }
  npy::save_all(files);  // all or none: a failure leaves no new file beside old ones
  // dir/{a,b}.npy as a shell expands it; one file by its name (dir/{out}.npy named no file).
  fmt::print("wrote {}\n", outs.size() == 1 ? files.front().first : fmt::format("{}/{{{}}}.npy", dir, names));
}

// A compound flag and a flag of one of its options on one command line: which wins would be an
// accident of the parse order (--window 3,-1 --window-left 2 ran window_left=3).
void refuse_compound_and_parts(const CLI::App* cmd, const kernels::CompoundFlag& c) {
  for (const std::string& o : c.options) {
    const std::string flag = "--" + harness::kebab_case(o);
    check(cmd->get_option_no_throw(flag) == nullptr || cmd->count(flag) == 0, ErrorCode::kInvalidArgument,
          "--" + c.flag + " and " + flag + " both set " + o + ": give one");
  }
}

void run_kernel(const CLI::App* cmd, const kernels::KernelSpec& k, const RunArgs& a, harness::OptionValues options) {
  for (const kernels::CompoundFlag& c : k.call.compound_flags) {
    auto it = a.compounds.find(c.flag);
    if (it == a.compounds.end() || it->second.empty()) continue;
    refuse_compound_and_parts(cmd, c);
    apply_compound(c, it->second, options);
  }
  Loaded l = load(k, a, options);
  std::vector<std::pair<std::string, Tensor>> outs;
  std::vector<TensorView> views;
  const std::vector<kernels::OutputDesc> descs = kernels::outputs_of(k.call, l.args, k.name);
  check_out(a.out, descs);
  for (const kernels::OutputDesc& d : descs) {
    outs.push_back({d.name, kernels::allocate_output(d, Device::cpu())});
    views.push_back(outs.back().second.view());
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string impl = k.call.call(l.args, views);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (auto& [name, t] : outs) t = for_file(t);
  const bool grads = a.grad && outs.size() > descs_of_forward(k, l.args);
  fmt::print("{}: implementation={}{}{} time={:.3f} ms\n", k.name, impl, summary(k, l, outs),
             grads ? " (with gradients)" : a.grad ? " (every gradient skipped)" : "", ms);
  write_outputs(outs, a.out);
}

void add_kernel(CLI::App* run, const kernels::KernelSpec& k) {
  auto* cmd = run->add_subcommand(k.name, k.description + ". Writes " + outputs_help(k));
  auto a = std::make_shared<RunArgs>();
  for (const auto& in : k.call.inputs) {
    auto* o = cmd->add_option(flag_names(in.name, in.aliases), a->files[in.name], in.help);
    if (in.required) o->required();
  }
  auto options = add_kernel_options(cmd, k.call.options);
  for (const auto& c : k.call.compound_flags) cmd->add_option("--" + c.flag, a->compounds[c.flag], c.help);
  if (has_grad(k)) {
    cmd->add_flag("--grad", a->grad, "also write the gradients (as f32)");
    for (const auto& g : upstream_gradients(k))
      cmd->add_option(flag_names(g.name, g.aliases), a->files[g.name],
                      g.help + (of_forward_output(k, g) ? " (with --grad; default ones)" : " (with --grad; default zero)"));
    if (!k.call.skippable.empty()) {
      std::string names;
      for (const std::string& n : k.call.skippable) names += (names.empty() ? "" : ", ") + n;
      cmd->add_option("--skip-grads", a->skip,
                      "with --grad: gradients not to compute or write, a comma list of " + names + " (a frozen input's)");
    }
  }
  cmd->add_option("--impl", a->impl, "implementation name or comma list (default: the dispatch order)");
  cmd->add_option("--threads", a->threads, "CPU threads (default: all cores)")
      ->check(CLI::Range(0, 1024));  // 0: all cores; a negative count meant "all" unseen
  cmd->add_option("--memory-budget-mib", a->memory_budget_mib,
                  "Extra memory the implementation may use, MiB (ExecOptions::memory_budget; 0: its default)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));  // up to 1 PiB: MiB << 20 fits in size_t
  cmd->add_option("--out", a->out, "output directory")->required();
  cmd->callback([cmd, a, options, &k] { run_kernel(cmd, k, *a, options()); });
}

}  // namespace

void register_run(CLI::App& app) {
  auto* run = app.add_subcommand("run", "Run a kernel on your own .npy arrays (`tessera run KERNEL --help`)");
  require_kernel(run);
  for (const kernels::KernelSpec* k : kernels::all()) add_kernel(run, *k);
}

}  // namespace tessera::cli
