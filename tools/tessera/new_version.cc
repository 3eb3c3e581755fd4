// tessera new-version KERNEL IMPL: clone the latest version of an implementation into the next
// one (cpu -> cpu_v2), registered as experimental (docs/VERSIONS.md). The edits are made by
// scripts/new_version.py in the source tree: run from the repository root, this checks the names
// against the registry and runs it; anywhere else it says what to run.
#include <fmt/core.h>

#include <cstdlib>
#include <filesystem>
#include <sys/wait.h>

#include "common.h"
#include "tessera/error.h"

namespace tessera::cli {
namespace {

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct NewVersionArgs {
  std::string kernel, impl, what_changed, root = ".";
  bool dry_run = false;
};

void run_new_version(const NewVersionArgs& a) {
  const kernels::KernelSpec& k = kernels::get(a.kernel);
  if (!k.implementations().find(a.impl)) {
    std::string known;
    for (const auto& info : k.implementations().infos()) known += (known.empty() ? "" : ", ") + info.name;
    throw Error(ErrorCode::kNotFound, k.name + ": no implementation named '" + a.impl + "' (have: " + known + ")");
  }
  namespace fs = std::filesystem;
  const fs::path script = fs::path(a.root) / "scripts" / "new_version.py";
  std::string cmd = "python3 " + quoted(script.string()) + " " + quoted(k.name) + " " + quoted(a.impl) +
                    " --root " + quoted(a.root);
  if (!a.what_changed.empty()) cmd += " --what-changed " + quoted(a.what_changed);
  if (a.dry_run) cmd += " --dry-run";
  if (!fs::exists(script) || !fs::is_directory(fs::path(a.root) / "src" / "kernels" / k.name)) {
    fmt::print(stderr,
               "new-version: {} is not a Tessera source tree (no scripts/new_version.py or src/kernels/{}).\n"
               "From the repository root run:\n  python3 scripts/new_version.py {} {}\n",
               fs::absolute(a.root).string(), k.name, k.name, a.impl);
    set_exit_code(1);
    return;
  }
  const int st = std::system(cmd.c_str());
  set_exit_code(st == 0 ? 0 : (WIFEXITED(st) ? WEXITSTATUS(st) : 1));
}

}  // namespace

void register_new_version(CLI::App& app) {
  auto* cmd = app.add_subcommand("new-version",
                                 "Clone an implementation's latest version into the next one (cpu -> cpu_v2), "
                                 "registered as experimental (runs scripts/new_version.py; docs/VERSIONS.md)");
  auto a = std::make_shared<NewVersionArgs>();
  cmd->add_option("kernel", a->kernel, "Kernel (" + kernels::names() + ")")->required();
  cmd->add_option("implementation", a->impl, "Implementation family or version to clone (cpu, cuda, cpu_v2)")
      ->required();
  cmd->add_option("--what-changed", a->what_changed, "One line on what the new version changes");
  cmd->add_option("--root", a->root, "Repository root (default: the current directory)")->capture_default_str();
  cmd->add_flag("--dry-run", a->dry_run, "Say which files would be written; write nothing");
  cmd->callback([a] { run_new_version(*a); });
}

}  // namespace tessera::cli
