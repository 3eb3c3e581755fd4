// tessera report: render a bench JSON file as a self-contained HTML page (bar charts per shape
// and pass, the roofline, the rows) or, for an .svg output, the roofline alone. --peers merges
// peer results (schema "tessera-peers/1", see src/harness/report.h) written by bench/ scripts.
#include <fmt/core.h>

#include "harness/report.h"
#include "harness/table.h"
#include "common.h"

namespace tessera::cli {

void register_report(CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "Render a `tessera bench --json` file as HTML (or SVG)");
  struct Args {
    std::string in, out;
    std::vector<std::string> peers;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("file", a->in, "Bench JSON file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--out", a->out, "Output .html (page) or .svg (chart only)")->required();
  cmd->add_option("--peers", a->peers,
                  "Peer results JSON (tessera-peers/1, e.g. from bench/torch_lce_baseline.py --peers-out) to "
                  "merge; repeatable")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(CLI::ExistingFile);
  cmd->callback([a] {
    auto doc = harness::read_json_file(a->in);
    for (const auto& p : a->peers) harness::merge_peer_results(doc, harness::read_json_file(p), p);
    harness::write_report(doc, a->out);
    fmt::print("wrote {} ({} rows)\n", a->out, doc.contains("rows") ? doc["rows"].size() : 0);
  });
}

}  // namespace tessera::cli
