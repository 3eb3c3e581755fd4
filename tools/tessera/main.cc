// tessera: the command-line tool. One file per subcommand; each registers itself here.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "tessera/error.h"
#include "tessera/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera: fused kernels for large-model training and serving, with their oracles"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION);
  tessera::cli::register_list(app);
  tessera::cli::register_roofline(app);
  tessera::cli::register_bench(app);
  tessera::cli::register_report(app);
  tessera::cli::register_check(app);
  tessera::cli::register_run(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 2;
  }
  return tessera::cli::exit_code();
}
