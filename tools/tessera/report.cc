// tessera report: render a bench JSON file as a self-contained HTML page (inline SVG roofline
// and a table of the rows) or, for an .svg output, the chart alone.
#include <fmt/core.h>

#include "harness/report.h"
#include "harness/table.h"
#include "common.h"

namespace tessera::cli {

void register_report(CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "Render a `tessera bench --json` file as HTML (or SVG)");
  struct Args {
    std::string in, out;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("file", a->in, "Bench JSON file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--out", a->out, "Output .html (page) or .svg (chart only)")->required();
  cmd->callback([a] {
    const auto doc = harness::read_json_file(a->in);
    harness::write_report(doc, a->out);
    fmt::print("wrote {} ({} rows)\n", a->out, doc.contains("rows") ? doc["rows"].size() : 0);
  });
}

}  // namespace tessera::cli
