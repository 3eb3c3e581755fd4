// tessera: the command-line tool. Subcommands are generic; kernels come from the registry.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "common.h"
#include "tessera/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera: fused kernels for large-model training and serving, with their oracles"};
  try {
    tessera::cli::build_app(app);
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message
    return 2;     // every usage error exits 2, like our own argument errors
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 2;
  }
  return tessera::cli::exit_code();
}
