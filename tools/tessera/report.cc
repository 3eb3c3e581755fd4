// tessera report: render bench JSON files as one self-contained HTML page (bar charts per shape
// and pass, the roofline, the rows) or, for an .svg output, the roofline alone. --peers merges
// peer results (schema "tessera-peers/1", see src/harness/report.h) written by bench/ scripts.
#include <fmt/core.h>

#include "harness/report.h"
#include "harness/table.h"
#include "common.h"
#include "tessera/error.h"

#include <nlohmann/json.hpp>

namespace tessera::cli {

namespace {

// The document a peer file joins: the one of its "kernel", or the only one.
nlohmann::json& peer_target(std::vector<nlohmann::json>& docs, const nlohmann::json& peers, const std::string& path) {
  const std::string kernel = peers.value("kernel", std::string());
  if (docs.size() == 1) return docs.front();
  check(!kernel.empty(), ErrorCode::kInvalidArgument,
        "report: peer file " + path + " names no \"kernel\"; with several bench files it must");
  nlohmann::json* found = nullptr;
  for (auto& d : docs)
    if (d.value("kernel", std::string()) == kernel) {
      check(found == nullptr, ErrorCode::kInvalidArgument,
            "report: peer file " + path + " is for kernel '" + kernel +
                "', which several bench files hold: render them apart, or merge it with one of them alone");
      found = &d;
    }
  check(found != nullptr, ErrorCode::kInvalidArgument,
        "report: peer file " + path + " is for kernel '" + kernel + "', which no bench file holds");
  return *found;
}

}  // namespace

void register_report(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "report", "Render `tessera bench --json` files as one HTML page (or one file's roofline as SVG)");
  struct Args {
    std::vector<std::string> in;
    std::string out;
    std::vector<std::string> peers;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("files", a->in, "Bench JSON files (several: one page with a section each)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--out", a->out, "Output .html (page) or .svg (chart only)")->required();
  cmd->add_option("--peers", a->peers,
                  "Peer results JSON (tessera-peers/1, e.g. from bench/torch_lce_baseline.py --peers-out) to "
                  "merge into the bench file of its kernel; repeatable")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(CLI::ExistingFile);
  cmd->callback([a] {
    std::vector<PathArg> inputs;
    for (const auto& f : a->in) inputs.push_back({"input", f});
    for (const auto& p : a->peers) inputs.push_back({"--peers", p});
    check_outputs({{"--out", a->out}}, {}, inputs);  // a report over its own bench file lost the results
    std::vector<nlohmann::json> docs;
    for (const auto& f : a->in) {
      docs.push_back(harness::read_json_file(f));
      const std::string schema = docs.back().value("schema", std::string());
      check(schema.rfind("tessera-bench/", 0) == 0, ErrorCode::kInvalidArgument,
            "report: " + f + " is not a `tessera bench --json` file (schema '" + schema + "')");
    }
    for (const auto& p : a->peers) {
      const nlohmann::json peers = harness::read_json_file(p);
      harness::merge_peer_results(peer_target(docs, peers, p), peers, p);
    }
    harness::write_reports(docs, a->out);
    size_t rows = 0;
    for (const auto& d : docs) rows += d.contains("rows") ? d["rows"].size() : 0;
    fmt::print("wrote {} ({} rows from {} file{})\n", a->out, rows, docs.size(), docs.size() == 1 ? "" : "s");
  });
}

}  // namespace tessera::cli
