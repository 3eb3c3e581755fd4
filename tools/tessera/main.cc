// tessera: the command-line tool. Subcommands are generic; kernels come from the registry.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "common.h"
#include "core/text.h"
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
    // Messages may quote a corrupt file's bytes: escaped, so the output stays valid UTF-8 text.
    std::fprintf(stderr, "tessera: error: %s\n", tessera::text::printable(e.what()).c_str());
    return 2;
  }
  return tessera::cli::exit_code();
}
