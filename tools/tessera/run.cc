// tessera run KERNEL: a kernel on the user's own .npy arrays. Inputs, options and outputs come
// from the kernel's RunSpec; `tessera run KERNEL --help` lists them. Users' files are checked for
// NaN/Inf before anything runs (ExecOptions::check_finite).
#include <fmt/core.h>

#include <chrono>
#include <filesystem>

#include "common.h"
#include "harness/npy.h"
#include "tessera/error.h"

namespace tessera::cli {
namespace {

struct RunArgs {
  std::map<std::string, std::string> files;  // input name -> path
  std::string out, impl;
  bool grad = false;
  int threads = 0;
};

kernels::RunRequest load_request(const kernels::RunSpec& spec, const RunArgs& a) {
  kernels::RunRequest req;
  auto load = [&](const kernels::TensorArg& arg) {
    auto it = a.files.find(arg.name);
    if (it != a.files.end() && !it->second.empty()) req.tensors.push_back({arg.name, npy::load(it->second)});
  };
  for (const auto& arg : spec.inputs) load(arg);
  if (a.grad)
    for (const auto& arg : spec.grad_inputs) load(arg);
  req.exec.implementation = a.impl;
  req.exec.num_threads = a.threads;
  req.exec.check_finite = true;  // users' files: reject NaN/Inf before computing
  req.grad = a.grad;
  return req;
}

void write_outputs(const kernels::RunOutput& out, const std::string& dir) {
  std::string names;
  for (const auto& [name, t] : out.outputs) {
    npy::save((std::filesystem::path(dir) / (name + ".npy")).string(), t);
    names += (names.empty() ? "" : ",") + name;
  }
  fmt::print("wrote {}/{{{}}}.npy\n", dir, names);
}

void run_kernel(const kernels::KernelSpec& k, const RunArgs& a, const harness::OptionValues& options) {
  kernels::RunRequest req = load_request(k.run, a);
  req.options = options;
  const auto t0 = std::chrono::steady_clock::now();
  const kernels::RunOutput out = k.run.run(req);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::error_code ec;  // only now: a call that fails creates no directory
  std::filesystem::create_directories(a.out, ec);
  if (ec) throw Error(ErrorCode::kIo, a.out + ": cannot create output directory: " + ec.message());
  fmt::print("{}: implementation={} {}{} time={:.3f} ms\n", k.name, out.implementation, out.summary,
             a.grad ? " (with gradients)" : "", ms);
  write_outputs(out, a.out);
}

void add_kernel(CLI::App* run, const kernels::KernelSpec& k) {
  auto* cmd = run->add_subcommand(k.name, k.description + ". Writes " + k.run.outputs_help);
  auto a = std::make_shared<RunArgs>();
  for (const auto& arg : k.run.inputs) {
    auto* o = cmd->add_option("--" + arg.name, a->files[arg.name], arg.help);
    if (arg.required) o->required();
  }
  for (const auto& arg : k.run.grad_inputs)
    cmd->add_option("--" + arg.name, a->files[arg.name], arg.help + " (with --grad; default ones)")
        ;
  auto options = add_kernel_options(cmd, k.run.options);
  if (k.run.has_grad) cmd->add_flag("--grad", a->grad, "also write the gradients (as f32)");
  cmd->add_option("--impl", a->impl, "implementation name or comma list (default: the dispatch order)");
  cmd->add_option("--threads", a->threads, "CPU threads (default: all cores)");
  cmd->add_option("--out", a->out, "output directory")->required();
  cmd->callback([a, options, &k] { run_kernel(k, *a, options()); });
}

}  // namespace

void register_run(CLI::App& app) {
  auto* run = app.add_subcommand("run", "Run a kernel on your own .npy arrays (`tessera run KERNEL --help`)");
  require_kernel(run);
  for (const kernels::KernelSpec* k : kernels::all()) add_kernel(run, *k);
}

}  // namespace tessera::cli
