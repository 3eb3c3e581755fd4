// tessera list: kernels, their implementations, and which can run here (and why not).
#include <fmt/core.h>

#include "tessera/commands.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::cli {

namespace {
int g_exit = 0;
}
void set_exit_code(int code) { g_exit = code; }
int exit_code() { return g_exit; }

void register_list(CLI::App& app) {
  auto* cmd = app.add_subcommand("list", "List kernels and implementations, and which can run on this machine");
  cmd->callback([] {
    fmt::print("{}\n", linear_cross_entropy::kKernelName);
    for (const auto& info : linear_cross_entropy::implementations()) {
      fmt::print("  {:<12} {:<13} {}\n", info.name, info.available ? "available" : "unavailable",
                 info.available ? info.description : info.unavailable_reason);
    }
  });
}

}  // namespace tessera::cli
