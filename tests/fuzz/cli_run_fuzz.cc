// Fuzz target: the CLI's option parsing of every `tessera run` subcommand. The input is split
// on NUL bytes into the arguments after `tessera run`; the app is built as tools/tessera/main.cc
// builds it (register_run). Each leaf subcommand gets a parse-complete callback that stops the
// parse once its options are converted, checked and their requirements met, before the
// command's own callback runs: this target fuzzes parsing and validation, not the files the
// options name (the .npy reader has its own target). The command callbacks are left in place
// (they own the option storage: replacing them freed it, a use-after-free in the harness, not
// in the CLI). Expected outcomes: CLI::ParseError (what main() turns into a usage message),
// tessera::Error, or the stop after a complete parse.
//
// The target relies only on tessera::cli::register_run(CLI::App&) (tools/tessera/common.h) and
// walks whatever subcommands it registers: one `run KERNEL` per registered kernel.
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tessera/common.h"
#include "tessera/error.h"

namespace {

struct Parsed {};

void stop_after_parse(CLI::App* app) {
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_subcommands([](CLI::App*) { return true; }).empty())
      sub->parse_complete_callback([] { throw Parsed{}; });
    else
      stop_after_parse(sub);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args = {"tessera", "run"};
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  if (!cur.empty()) args.push_back(cur);
  if (args.size() > 64) return 0;  // argv of a few dozen words covers every option

  CLI::App app{"tessera"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION);
  tessera::cli::register_run(app);
  stop_after_parse(&app);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const Parsed&) {
  } catch (const CLI::ParseError&) {
  } catch (const tessera::Error&) {
  }
  return 0;
}
