// tessera CLI: what the subcommands share. Each subcommand lives in its own file and registers
// itself with the app (build_app in common.cc); a subcommand's callback sets the process exit code with
// set_exit_code (0 ok, 1 a check or benchmark target failed or nothing was done, 2 bad
// arguments / input files). Nothing here names a kernel: kernels come from the registry.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/options.h"
#include "kernels/registry.h"
#include "tessera/exec.h"

namespace tessera::cli {

void set_exit_code(int code);
int exit_code();

// Builds the whole app: every subcommand, one sub-subcommand per registered kernel.
void build_app(CLI::App& app);

void register_list(CLI::App& app);
void register_roofline(CLI::App& app);
void register_bench(CLI::App& app);
void register_report(CLI::App& app);
void register_check(CLI::App& app);
void register_run(CLI::App& app);
void register_tune(CLI::App& app);
void register_new_version(CLI::App& app);

// Makes `parent` (bench, run, tune) take exactly one kernel subcommand: a word that names no
// kernel is Error(kNotFound) "unknown kernel 'X' (kernels: ...)", none at all says which exist.
// Any other word `parent` does not know is a CLI::ExtrasError. Both are raised once `parent` has
// parsed, before any callback runs: a refused command line runs nothing and writes nothing.
// Every subcommand refuses unknown options and stray words (CLI11's default; never allow_extras).
void require_kernel(CLI::App* parent);
// The same for `check`, whose kernel is optional (none: every kernel).
void optional_kernel(CLI::App* parent);

// Adds a kernel's declared options as flags of `cmd` (--kebab-case of the declared name, plus its
// aliases); the returned getter gives their values by declared name (defaults where a flag was
// not given) once CLI11 has parsed.
std::function<harness::OptionValues()> add_kernel_options(CLI::App* cmd,
                                                          const std::vector<harness::OptionSpec>& specs);

// --pass forward,backward,fused (also fwd, bwd; "all"); the kernel's passes by default.
void add_pass_option(CLI::App* cmd, std::vector<std::string>& storage);
std::vector<Pass> parse_passes(const std::vector<std::string>& names, const kernels::KernelSpec& k);
// "f32,bf16" -> float dtypes the kernel takes (error naming the bad one).
std::vector<DType> parse_float_dtypes(const std::string& list, const kernels::KernelSpec& k);

// A path a command writes or reads, by the flag that names it ("" when not given: skipped).
struct PathArg {
  std::string flag, path;
};
// The output paths, checked before any work (a long bench or sweep must not end in "cannot
// write"): each file can be written (not a directory; its nearest existing ancestor is a writable
// directory), each directory exists or can be made, no two outputs are one file and none is one
// of `inputs` (a results file over the grid file that made it). Error(kInvalidArgument), exit 2:
// "--json out: is a directory; nothing was run".
void check_outputs(const std::vector<PathArg>& files, const std::vector<PathArg>& dirs = {},
                   const std::vector<PathArg>& inputs = {});

}  // namespace tessera::cli
