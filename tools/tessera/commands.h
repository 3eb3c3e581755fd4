// tessera CLI: each subcommand lives in its own file and registers itself with the app.
// A subcommand's callback sets the process exit code with set_exit_code (0 ok, 1 a check or
// benchmark target failed, 2 bad arguments / input files).
#pragma once

#include <CLI/CLI.hpp>

namespace tessera::cli {

void set_exit_code(int code);
int exit_code();

void register_list(CLI::App& app);
void register_roofline(CLI::App& app);
void register_bench(CLI::App& app);
void register_report(CLI::App& app);
void register_check(CLI::App& app);
void register_run(CLI::App& app);

}  // namespace tessera::cli
