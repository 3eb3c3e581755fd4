// tessera: the command-line tool. Subcommands are generic; kernels come from the registry.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "common.h"
#include "core/text.h"
#include "tessera/error.h"

namespace {

// "tessera run linear_cross_entropy": the subcommands parsed before an error, for its message.
std::string command_path(const CLI::App& app) {
  std::string path = "tessera";
  const CLI::App* at = &app;
  while (!at->get_subcommands().empty()) {
    at = at->get_subcommands().front();
    path += " " + at->get_name();
  }
  return path;
}

// The message of a usage error: the words nobody took come first (in the order given), since
// CLI11 may report a missing requirement before it gets to them.
std::string usage_message(const CLI::App& app, const CLI::ParseError& e) {
  const std::vector<std::string> extra = app.remaining(true);
  if (extra.empty()) return e.what();
  std::string words;
  for (const auto& w : extra) words += (words.empty() ? "" : " ") + w;
  return std::string(extra.size() > 1 ? "unexpected arguments: " : "unexpected argument: ") + words;
}

}  // namespace

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
    // One line that names the bad words and where to look; every usage error exits 2, like our
    // own argument errors.
    const std::string path = command_path(app);
    std::fprintf(stderr, "tessera: error: %s (see `%s --help`)\n",
                 tessera::text::printable(usage_message(app, e)).c_str(), path.c_str());
    return 2;
  } catch (const std::exception& e) {
    // Messages may quote a corrupt file's bytes: escaped, so the output stays valid UTF-8 text.
    std::fprintf(stderr, "tessera: error: %s\n", tessera::text::printable(e.what()).c_str());
    return 2;
  }
  return tessera::cli::exit_code();
}
