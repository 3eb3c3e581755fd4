// tessera list: kernels, their implementations (with versions), and which can run here.
#include <fmt/core.h>

#include "common.h"

namespace tessera::cli {
namespace {

void print_kernel(const kernels::KernelSpec& k, bool verbose) {
  fmt::print("{}  ({})\n", k.name, k.description);
  if (verbose) {
    std::string dims, passes;
    for (const auto& d : k.dims) dims += (dims.empty() ? "" : ",") + d;
    for (Pass p : k.passes) passes += std::string(passes.empty() ? "" : ",") + pass_name(p);
    fmt::print("  dims {}; passes {}\n", dims, passes);
  }
  for (const auto& info : k.implementations().infos()) {
    const std::string status =
        info.status == VersionStatus::kCurrent ? "" : std::string(" [") + version_status_name(info.status) + "]";
    fmt::print("  {:<14} {:<12} {}{}\n", info.name, info.available ? "available" : "unavailable",
               info.available ? info.description : info.unavailable_reason, status);
    if (verbose && !info.what_changed.empty()) fmt::print("  {:<14} what changed: {}\n", "", info.what_changed);
  }
}

}  // namespace

void register_list(CLI::App& app) {
  auto* cmd = app.add_subcommand("list", "List kernels and implementations, and which can run on this machine");
  auto verbose = std::make_shared<bool>(false);
  cmd->add_flag("-v,--verbose", *verbose, "Also dims, passes and what each version changed");
  cmd->callback([verbose] {
    for (const kernels::KernelSpec* k : kernels::all()) print_kernel(*k, *verbose);
  });
}

}  // namespace tessera::cli
