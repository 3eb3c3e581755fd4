// tessera check <kernel>: parity of every available implementation against the reference over
// the built-in grid, with max/mean absolute and relative deviation per case. Exit 1 on a breach.
#include <fmt/core.h>

#include <algorithm>

#include "kernels/linear_cross_entropy/impl.h"
#include "kernels/linear_cross_entropy/testing.h"
#include "tessera/commands.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::cli {
namespace {

namespace lce = tessera::linear_cross_entropy;
namespace lt = tessera::linear_cross_entropy::testing;

struct CheckArgs {
  std::string impl;
  bool quick = false, verbose = false;
  std::vector<std::string> passes = {"forward", "backward", "fused"};
};

int check_lce(const CheckArgs& a) {
  std::vector<lce::ImplementationInfo> todo;
  // Selected by name first: info() asks available(), which loads a device module (--impl cpu
  // must not load the CUDA runtime).
  for (const auto* impl : lce::registry().implementations()) {
    const std::string name = impl->name();
    if (!a.impl.empty()) {
      const std::string want = "," + a.impl + ",";
      if (want.find("," + name + ",") == std::string::npos) continue;
    } else if (name == "reference") {
      continue;  // the oracle against itself says nothing
    }
    todo.push_back(impl->info());
  }
  if (todo.empty()) {
    if (!a.impl.empty()) throw Error(ErrorCode::kNotFound, "check: no implementation named '" + a.impl + "'");
    fmt::print("linear_cross_entropy: no implementation besides the reference is built; nothing to check\n");
    return 0;
  }
  const auto grid = lt::check_grid(a.quick);
  int failures = 0, skipped = 0, passed = 0;
  for (const auto& info : todo) {
    if (!info.available) {
      fmt::print("SKIP {:<10} unavailable here: {}\n", info.name, info.unavailable_reason);
      ++skipped;
      continue;
    }
    const Device dev = info.device == DeviceType::kCUDA ? Device::cuda() : Device::cpu();
    for (const auto& pass_name : a.passes) {
      const lt::Pass pass = pass_name == "forward" ? lt::Pass::kForward
                            : pass_name == "backward" ? lt::Pass::kBackward : lt::Pass::kFused;
      for (const auto& spec : grid) {
        const lt::ParityReport r = lt::check_parity(spec, info.name, pass, dev);
        if (!r.ran) {
          fmt::print("{} {:<10} {:<8} {}: {}\n", r.skipped ? "SKIP" : "FAIL", info.name, pass_name, r.case_name, r.error);
          (r.skipped ? skipped : failures)++;
          continue;
        }
        harness::Deviation worst;
        for (const auto& f : r.fields) {
          worst.max_abs = std::max(worst.max_abs, f.dev.max_abs);
          worst.mean_abs = std::max(worst.mean_abs, f.dev.mean_abs);
          worst.max_rel = std::max(worst.max_rel, f.dev.max_rel);
          worst.mean_rel = std::max(worst.mean_rel, f.dev.mean_rel);
        }
        const bool ok = r.ok();
        ok ? ++passed : ++failures;
        fmt::print("{} {:<10} {:<8} max_abs={:<9.3g} mean_abs={:<9.3g} max_rel={:<9.3g} mean_rel={:<9.3g} {}\n",
                   ok ? "ok  " : "FAIL", info.name, pass_name, worst.max_abs, worst.mean_abs, worst.max_rel,
                   worst.mean_rel, r.case_name);
        for (const auto& f : r.fields)
          if (a.verbose || !f.dev.ok())
            fmt::print("       {:<7} {}{}\n", f.field, f.dev.str(),
                       f.dev.ok() ? "" : fmt::format("  worst [{}]: got {:.9g} want {:.9g}", f.dev.worst, f.dev.worst_got, f.dev.worst_want));
      }
    }
  }
  fmt::print("check: {} passed, {} failed, {} skipped\n", passed, failures, skipped);
  return failures ? 1 : 0;
}

}  // namespace

void register_check(CLI::App& app) {
  auto* check = app.add_subcommand("check", "Check implementations against the reference over a built-in grid");
  check->require_subcommand(1);
  auto* cmd = check->add_subcommand("linear_cross_entropy", "Parity of linear_cross_entropy implementations");
  auto a = std::make_shared<CheckArgs>();
  cmd->add_option("--impl", a->impl, "implementation(s) to check, comma-separated (default: all but the reference)");
  cmd->add_flag("--quick", a->quick, "a smaller grid");
  cmd->add_flag("-v,--verbose", a->verbose, "print every output's deviation");
  cmd->add_option("--pass", a->passes, "forward, backward, fused (default: all)")
      ->check(CLI::IsMember({"forward", "backward", "fused"}))->delimiter(',');
  cmd->callback([a] { set_exit_code(check_lce(*a)); });
}

}  // namespace tessera::cli
