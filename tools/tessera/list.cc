// tessera list: kernels, their implementations (with versions and their status), and which can
// run here. --verbose adds what each version changed and what the compiler did: the SIMD
// targets Highway compiled and the one dispatched on this machine (CPU backends), and for every
// CUDA kernel of the build its registers, spills, stack (local), shared and constant memory per
// architecture, with spills not declared CUDA_MAY_SPILL flagged (docs/VERSIONS.md).
#include <fmt/core.h>

#include "common.h"
#include "core/build_info.h"
#include "harness/compiler_report.h"

namespace tessera::cli {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s.empty() ? "-" : s;
}

void print_cuda_kernels(const harness::CudaCompilerReport& r, const std::string& prefix, const char* indent) {
  for (const auto& k : r.kernels) {
    if (k.source.rfind(prefix, 0) != 0) continue;
    fmt::print("{}{} [{}] {}\n{}    {}\n", indent, k.source.substr(prefix.size()), k.arch, k.name, indent,
               harness::resources_line(k));
  }
}

void print_kernel(const kernels::KernelSpec& k, bool verbose, const harness::CudaCompilerReport* cuda) {
  fmt::print("{}  ({})\n", k.name, k.description);
  if (verbose) {
    std::string dims, passes;
    for (const auto& d : k.dims) dims += (dims.empty() ? "" : ",") + d;
    for (Pass p : k.passes) passes += std::string(passes.empty() ? "" : ",") + pass_name(p);
    fmt::print("  dims {}; passes {}\n", dims, passes);
  }
  for (const auto& info : k.implementations().infos()) {
    // Every version says its status ("cpu_v2 ... [experimental]"); a lone implementation is
    // current, which goes without saying.
    const std::string family = kernels::version_family(info.name);
    bool versioned = false;
    for (const auto& other : k.implementations().infos())
      versioned |= other.name != info.name && kernels::version_family(other.name) == family;
    const std::string status = info.status != VersionStatus::kCurrent || versioned
                                   ? std::string(" [") + version_status_name(info.status) + "]"
                                   : "";
    fmt::print("  {:<14} {:<12} {}{}\n", info.name, info.available ? "available" : "unavailable",
               info.available ? info.description : info.unavailable_reason, status);
    if (verbose && !info.what_changed.empty()) fmt::print("  {:<14} what changed: {}\n", "", info.what_changed);
  }
  if (verbose && cuda) {
    fmt::print("  CUDA kernels (compiled; ptxas resource usage per thread):\n");
    print_cuda_kernels(*cuda, "src/kernels/" + k.name + "/", "    ");
  }
}

void print_build(bool verbose, const harness::CudaCompilerReport* cuda, const std::string& cuda_why) {
  if (!verbose) return;
  const build_info::SimdTargets t = build_info::simd_targets();
  if (t.built)
    fmt::print("CPU SIMD (Highway): compiled {}; supported here {}; dispatched here {} (static baseline {})\n",
               join(t.compiled), join(t.supported), t.dispatched.empty() ? "-" : t.dispatched, t.static_target);
  else
    fmt::print("CPU SIMD (Highway): not built (TESSERA_CPU_BACKEND=OFF)\n");
  if (cuda) {
    fmt::print("CUDA compiler report: {} ({}, architectures {}, {} kernels, {} flagged spills)\n", cuda->path,
               cuda->compiler, cuda->architectures, cuda->kernels.size(), cuda->flagged());
  } else {
    fmt::print("CUDA compiler report: none ({})\n", cuda_why);
  }
}

}  // namespace

void register_list(CLI::App& app) {
  auto* cmd = app.add_subcommand("list", "List kernels and implementations, and which can run on this machine");
  auto verbose = std::make_shared<bool>(false);
  cmd->add_flag("-v,--verbose", *verbose,
                "Also dims, passes, what each version changed, SIMD targets and CUDA registers/spills/memory");
  cmd->callback([verbose] {
    std::string why;
    std::optional<harness::CudaCompilerReport> cuda;
    if (*verbose) cuda = harness::load_cuda_compiler_report({}, &why);
    print_build(*verbose, cuda ? &*cuda : nullptr, why);
    for (const kernels::KernelSpec* k : kernels::all()) print_kernel(*k, *verbose, cuda ? &*cuda : nullptr);
    if (*verbose && cuda) {
      fmt::print("framework CUDA kernels:\n");
      print_cuda_kernels(*cuda, "src/core/", "  ");
    }
  });
}

}  // namespace tessera::cli
