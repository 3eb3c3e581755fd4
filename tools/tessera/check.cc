// tessera check [KERNEL]: parity of implementations against the reference over the kernel's
// check grid, with max/mean absolute and relative deviation per case. Exit 1 on a breach, and
// also when nothing could be checked (every case skipped): a check that checked nothing passed
// nothing.
#include <fmt/core.h>

#include <algorithm>
#include <optional>

#include "common.h"
#include "tessera/error.h"

namespace tessera::cli {
namespace {

struct CheckArgs {
  std::string impl;
  bool quick = false, verbose = false;
  std::vector<std::string> passes;
};

struct Counts {
  int passed = 0, failed = 0, skipped = 0;
};

// Per implementation and pass: cases passed / failed and the worst deviations, for the summary
// that puts versions side by side (cpu_v2 beside cpu, with the ratio of their worst max_abs).
struct Summary {
  std::string implementation, pass;
  int passed = 0, failed = 0;
  double max_abs = 0, max_rel = 0;
};

void add_summary(std::vector<Summary>& sums, const harness::ParityReport& r) {
  if (!r.ran) return;
  Summary* s = nullptr;
  for (auto& x : sums)
    if (x.implementation == r.implementation && x.pass == r.pass) s = &x;
  if (!s) s = &sums.emplace_back(Summary{r.implementation, r.pass});
  r.ok() ? ++s->passed : ++s->failed;
  const harness::Deviation w = r.worst();
  s->max_abs = std::max(s->max_abs, w.max_abs);
  s->max_rel = std::max(s->max_rel, w.max_rel);
}

// Printed when the run checked two versions of one family: one line per implementation and pass.
void print_versions_summary(const kernels::KernelSpec& k, const std::vector<Summary>& sums) {
  bool versions = false;
  for (const auto& a : sums)
    for (const auto& b : sums)
      versions |= a.implementation != b.implementation &&
                  kernels::version_family(a.implementation) == kernels::version_family(b.implementation);
  if (!versions) return;
  fmt::print("\n{} versions side by side (worst over the grid):\n", k.name);
  fmt::print("  {:<14} {:<8} {:>6} {:>6} {:>10} {:>10}  {}\n", "implementation", "pass", "passed", "failed", "max_abs",
             "max_rel", "max_abs vs version");
  for (const auto& s : sums) {
    std::string vs = "-";
    const std::string base = kernels::version_base(k.implementations(), s.implementation);
    for (const auto& b : sums)
      if (!base.empty() && b.implementation == base && b.pass == s.pass)
        vs = b.max_abs > 0 ? fmt::format("{:.2f} {}", s.max_abs / b.max_abs, base)
                           : (s.max_abs == 0 ? "1.00 " + base : "inf " + base);
    fmt::print("  {:<14} {:<8} {:>6} {:>6} {:>10.3g} {:>10.3g}  {}\n", s.implementation, s.pass, s.passed, s.failed,
               s.max_abs, s.max_rel, vs);
  }
}

void print_report(const harness::ParityReport& r, bool verbose, Counts& n) {
  if (!r.ran) {
    fmt::print("{} {:<12} {:<8} {}: {}\n", r.skipped ? "SKIP" : "FAIL", r.implementation, r.pass, r.case_name, r.error);
    (r.skipped ? n.skipped : n.failed)++;
    return;
  }
  const bool ok = r.ok();
  ok ? ++n.passed : ++n.failed;
  const harness::Deviation w = r.worst();
  fmt::print("{} {:<12} {:<8} max_abs={:<9.3g} mean_abs={:<9.3g} max_rel={:<9.3g} mean_rel={:<9.3g} {}\n",
             ok ? "ok  " : "FAIL", r.implementation, r.pass, w.max_abs, w.mean_abs, w.max_rel, w.mean_rel, r.case_name);
  for (const auto& f : r.fields)
    if (verbose || !f.dev.ok())
      fmt::print("       {:<7} {}{}\n", f.field, f.dev.str(),
                 f.dev.ok() ? "" : fmt::format("  worst [{}]: got {:.9g} want {:.9g}", f.dev.worst, f.dev.worst_got, f.dev.worst_want));
}

void check_implementation(const kernels::KernelSpec& k, const ImplementationInfo& info,
                          const std::vector<kernels::CheckCase>& grid, const std::vector<Pass>& passes,
                          const CheckArgs& a, Counts& n, std::vector<Summary>& sums) {
  if (!info.available) {
    fmt::print("SKIP {:<12} unavailable here: {}\n", info.name, info.unavailable_reason);
    ++n.skipped;
    return;
  }
  const Device dev = info.device == DeviceType::kCPU ? Device::cpu() : Device{info.device, 0};
  for (Pass pass : passes)
    for (const auto& c : grid) {
      const harness::ParityReport r = c.run(info.name, pass, dev);
      print_report(r, a.verbose, n);
      add_summary(sums, r);
    }
  (void)k;
}

Counts check_kernel(const kernels::KernelSpec& k, const CheckArgs& a) {
  Counts n;
  const auto names = kernels::pick_implementations(k, a.impl);
  const auto passes = parse_passes(a.passes, k);
  if (names.empty()) {
    fmt::print("{}: no implementation besides the reference is built; nothing to check\n", k.name);
    return n;
  }
  const auto grid = k.check_grid(a.quick);
  // info() of the named ones only: asking a CUDA entry loads the CUDA module.
  std::vector<Summary> sums;
  for (const std::string& name : names)
    check_implementation(k, k.implementations().find(name)->info(), grid, passes, a, n, sums);
  print_versions_summary(k, sums);
  return n;
}

// Every kernel when none is named: one that lacks a --pass or an --impl given is skipped with a
// line saying so (`--pass backward` checks the kernels that have one); a name no kernel takes is
// the first kernel's error, before anything runs.
std::vector<const kernels::KernelSpec*> applicable(const CheckArgs& a) {
  std::vector<const kernels::KernelSpec*> out;
  std::vector<std::string> skipped;
  std::optional<Error> first;
  for (const kernels::KernelSpec* k : kernels::all()) {
    try {
      parse_passes(a.passes, *k);
      kernels::pick_implementations(*k, a.impl);
      out.push_back(k);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument && e.code() != ErrorCode::kNotFound) throw;
      if (!first) first = e;
      skipped.push_back(e.what());
    }
  }
  if (out.empty() && first) throw *first;
  for (const std::string& why : skipped) fmt::print("SKIP kernel: {}\n", why);
  return out;
}

// The flags given before the kernel's name and after it, as one set: passes and flags add up; two
// different --impl lists are an error (one silently replaced the other).
CheckArgs merged(const CheckArgs& top, const CheckArgs& sub) {
  check(top.impl.empty() || sub.impl.empty() || top.impl == sub.impl, ErrorCode::kInvalidArgument,
        "--impl " + top.impl + " before the kernel and --impl " + sub.impl + " after it: give one");
  CheckArgs m = sub;
  if (m.impl.empty()) m.impl = top.impl;
  m.quick = top.quick || sub.quick;
  m.verbose = top.verbose || sub.verbose;
  m.passes.insert(m.passes.begin(), top.passes.begin(), top.passes.end());
  return m;
}

void finish(const Counts& n) {
  fmt::print("check: {} passed, {} failed, {} skipped\n", n.passed, n.failed, n.skipped);
  if (n.failed) set_exit_code(1);
  if (n.passed == 0 && n.failed == 0) {
    fmt::print(stderr, "check: nothing was checked (every case skipped or no implementation to check)\n");
    set_exit_code(1);
  }
}

}  // namespace

void register_check(CLI::App& app) {
  auto* check = app.add_subcommand("check", "Check implementations against the reference over each kernel's grid "
                                            "(every kernel when none is named)");
  auto a = std::make_shared<CheckArgs>();    // flags before a kernel's name (or with none)
  auto sub = std::make_shared<CheckArgs>();  // after it
  auto add_flags = [](CLI::App* cmd, CheckArgs& to) {
    cmd->add_option("--impl", to.impl, "implementation(s), comma-separated (default: all but the reference); "
                                       "an unknown name is an error");
    cmd->add_flag("--quick", to.quick, "a smaller grid");
    cmd->add_flag("-v,--verbose", to.verbose, "print every output's deviation");
    add_pass_option(cmd, to.passes);
  };
  add_flags(check, *a);
  optional_kernel(check);
  for (const kernels::KernelSpec* k : kernels::all()) {
    auto* cmd = check->add_subcommand(k->name, "Parity of " + k->name + " implementations");
    add_flags(cmd, *sub);
    cmd->callback([a, sub, k] { finish(check_kernel(*k, merged(*a, *sub))); });
  }
  check->callback([a, check] {
    if (!check->get_subcommands().empty()) return;  // a kernel's callback ran
    Counts all;
    for (const kernels::KernelSpec* k : applicable(*a)) {
      const Counts n = check_kernel(*k, *a);
      all.passed += n.passed, all.failed += n.failed, all.skipped += n.skipped;
    }
    finish(all);
  });
}

}  // namespace tessera::cli
