// The data side of the report: old documents normalized, peer results merged, rows grouped for
// the bar charts, and the small formatting helpers every part of the report shares.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/text.h"
#include "harness/report.h"
#include "harness/report_internal.h"
#include "tessera/error.h"

namespace tessera::harness {
namespace report_detail {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v) {
  if (!std::isfinite(v)) return "–";
  char buf[48];
  const double a = std::fabs(v);
  if (a == 0) return "0";
  const char* f = a >= 1e6 || a < 1e-3 ? "%.3g" : a >= 100 ? "%.0f" : a >= 10 ? "%.1f" : a >= 1 ? "%.2f" : "%.3g";
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

double getd(const json& r, const char* k) {
  auto it = r.find(k);
  return it != r.end() && it->is_number() ? it->get<double>() : std::nan("");
}

std::string gets(const json& r, const char* k) {
  auto it = r.find(k);
  if (it == r.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

bool usable(double v) { return v > 0 && std::isfinite(v); }

std::vector<DeviceCeilings> ceilings_of(const json& doc) {
  std::vector<DeviceCeilings> out;
  if (doc.contains("roofline") && doc["roofline"].is_object() && doc["roofline"].contains("devices")) {
    try {
      out = doc["roofline"]["devices"].get<std::vector<DeviceCeilings>>();
    } catch (const json::exception& e) {
      throw Error(ErrorCode::kInvalidArgument, std::string("report: malformed \"roofline\" ceilings: ") + e.what());
    }
  }
  for (auto& d : out) {
    if (!usable(d.bandwidth_gbs)) d.bandwidth_gbs = 0;
    std::erase_if(d.gemm_gflops, [](const auto& kv) { return !usable(kv.second); });
    std::erase_if(d.peak_gflops_by_line, [](const auto& kv) { return !usable(kv.second); });
    if (!usable(d.copy_gbs)) d.copy_gbs = 0;
  }
  return out;
}

std::vector<std::string> dims_of(const json& doc) {
  std::vector<std::string> dims;
  if (doc.contains("dims") && doc["dims"].is_array())
    for (const auto& d : doc["dims"])
      if (d.is_string()) dims.push_back(d.get<std::string>());
  return dims;
}

std::string dims_label(const json& row, const std::vector<std::string>& dims) {
  std::string s;
  for (const auto& d : dims)
    if (row.contains(d)) s += (s.empty() ? "" : " ") + d + "=" + gets(row, d.c_str());
  return s;
}

bool is_stale(const json& row) {
  auto it = row.find("roofline_stale");
  if (it != row.end() && it->is_boolean()) return it->get<bool>();
  return getd(row, "roofline_fraction") > 1.0;  // an old file, written before the flag existed
}

double stale_fraction(const json& row) {
  if (!is_stale(row)) return std::nan("");
  const double m = getd(row, "roofline_measured_fraction");
  return std::isfinite(m) ? m : getd(row, "roofline_fraction");
}

std::map<std::string, std::string> implementation_colors(const json& rows) {
  static const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                   "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  std::map<std::string, std::string> color;
  for (const auto& r : rows) {
    const std::string impl = gets(r, "implementation");
    if (!color.count(impl)) color[impl] = kPalette[color.size() % (sizeof kPalette / sizeof *kPalette)];
  }
  return color;
}

namespace {

std::string group_key(const json& r, const std::vector<std::string>& dims) {
  return dims_label(r, dims) + "|" + gets(r, "dtype") + "|" + gets(r, "mode");
}

// The GEMM floor and the materialized baseline of a group, from the rows that carry the ratios
// (kernel rows: median / vs_gemm) or, for the baseline, from the group's baseline row itself.
void fill_references(BarGroup& g, const json& rows) {
  for (size_t i : g.rows) {
    const auto& r = rows[i];
    const double med = getd(r, "median_ms"), vg = getd(r, "vs_gemm"), vb = getd(r, "vs_baseline");
    if (gets(r, "kind") == "baseline" && g.baseline_name.empty()) {
      g.baseline_name = gets(r, "implementation");
      g.baseline_ms = med;
    }
    if (g.gemm_floor_ms <= 0 && vg > 0) {
      g.gemm_floor_ms = med / vg;
      const double n = getd(r, "gemm_count");  // a count, but the file is outside data: NaN, 1e300
      g.gemm_count = n >= 1 && n <= 1e6 ? static_cast<int>(n) : 0;
    }
    if (g.baseline_ms <= 0 && vb > 0) g.baseline_ms = med / vb;
  }
}

}  // namespace

std::vector<BarGroup> bar_groups(const json& doc) {
  const auto& rows = doc["rows"];
  const auto dims = dims_of(doc);
  std::vector<BarGroup> groups;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (gets(r, "mode") == "gemm" || !(getd(r, "median_ms") > 0)) continue;  // the floor, not a pass
    const std::string key = group_key(r, dims);
    auto [it, fresh] = index.emplace(key, groups.size());
    if (fresh) {
      BarGroup g;
      const std::string shape = gets(r, "shape"), dl = dims_label(r, dims);
      g.title = (shape.empty() ? "" : shape + " · ") + (dl.empty() ? "" : dl + " · ") + gets(r, "dtype") +
                " · " + gets(r, "mode");
      groups.push_back(std::move(g));
    }
    groups[it->second].rows.push_back(i);
  }
  for (auto& g : groups) {
    std::stable_sort(g.rows.begin(), g.rows.end(), [&](size_t a, size_t b) {
      return getd(rows[a], "median_ms") < getd(rows[b], "median_ms");
    });
    fill_references(g, rows);
  }
  return groups;
}

}  // namespace report_detail

using nlohmann::json;
using namespace report_detail;

json normalize_bench_doc(const json& in) {
  json doc = in;
  if (!doc.is_object() || !doc.contains("rows") || !doc["rows"].is_array()) return doc;
  if (!doc.contains("dims") || !doc["dims"].is_array()) {
    const bool bhv = !doc["rows"].empty() && doc["rows"][0].contains("B") && doc["rows"][0].contains("V");
    doc["dims"] = bhv ? json::array({"B", "H", "V"}) : json::array();
  }
  for (auto& r : doc["rows"]) {
    if (!r.is_object() || !r.contains("mode") || !r["mode"].is_string()) continue;
    const std::string m = r["mode"].get<std::string>();
    if (m == "fwd") r["mode"] = "forward";
    if (m == "bwd") r["mode"] = "backward";
  }
  return doc;
}

namespace {

[[noreturn]] void bad_peer(const std::string& origin, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, text::printable("peer results " + origin + ": " + what));
}

// The bench row of the same dims, dtype and pass (a kernel row, for its cost model and
// ratios), else any row of the same dims (for the shape's name); null when none.
const json* matching_row(const json& doc, const json& peer, const std::vector<std::string>& dims, bool same_pass) {
  const std::string want = dims_label(peer, dims);
  for (const auto& r : doc["rows"]) {
    if (gets(r, "kind") == "peer" || dims_label(r, dims) != want) continue;
    if (!same_pass || (gets(r, "kind") == "kernel" && gets(r, "dtype") == gets(peer, "dtype") &&
                       gets(r, "mode") == gets(peer, "mode")))
      return &r;
  }
  return nullptr;
}

// Rates and ratios of a peer row from the bench's own row of that shape and pass.
void derive_rates(json& row, const json& k) {
  const double ms = getd(row, "median_ms");
  const double gf = getd(k, "gflop_useful"), mb = getd(k, "mbytes_min");
  if (gf > 0) row["gflops"] = gf / (ms * 1e-3);
  if (mb > 0) row["gbs"] = mb / ms;
  if (k.contains("ai")) row["ai"] = k["ai"];
  const double vg = getd(k, "vs_gemm"), vb = getd(k, "vs_baseline"), kms = getd(k, "median_ms");
  if (vg > 0) row["vs_gemm"] = ms / (kms / vg);
  if (vb > 0) row["vs_baseline"] = ms / (kms / vb);
}

json peer_row(const json& doc, const json& p, const json& peers, const std::vector<std::string>& dims,
              const std::string& origin, size_t i) {
  const std::string at = "row " + std::to_string(i + 1);
  if (!p.is_object()) bad_peer(origin, at + " is not an object");
  for (const char* k : {"implementation", "mode", "dtype"})
    if (!p.contains(k) || !p[k].is_string()) bad_peer(origin, at + " has no string \"" + k + "\"");
  if (!(getd(p, "median_ms") > 0)) bad_peer(origin, at + " has no positive \"median_ms\"");
  json row = {{"kind", "peer"}, {"implementation", p["implementation"]}, {"mode", p["mode"]}, {"dtype", p["dtype"]}};
  for (const auto& d : dims) {
    if (!p.contains(d) || !p[d].is_number_integer()) bad_peer(origin, at + " has no integer dim \"" + d + "\"");
    row[d] = p[d];
  }
  for (const char* k : {"median_ms", "min_ms", "max_ms", "first_call_ms"})
    if (p.contains(k) && p[k].is_number()) row[k] = p[k];
  row["device"] = p.contains("device") ? gets(p, "device") : gets(peers, "device");
  row["note"] = p.contains("note") ? gets(p, "note") : gets(peers, "source");
  row = normalize_bench_doc(json{{"rows", json::array({row})}})["rows"][0];
  if (const json* any = matching_row(doc, row, dims, false)) row["shape"] = gets(*any, "shape");
  if (const json* k = matching_row(doc, row, dims, true)) derive_rates(row, *k);
  return row;
}

}  // namespace

void merge_peer_results(json& out, const json& peers, const std::string& origin) {
  json doc = normalize_bench_doc(out);  // a copy: `out` changes only when every row is valid
  if (!peers.is_object() || gets(peers, "schema") != "tessera-peers/1")
    bad_peer(origin, "not a peer results file (want \"schema\": \"tessera-peers/1\")");
  const std::string kernel = gets(peers, "kernel"), ours = gets(doc, "kernel");
  if (!kernel.empty() && !ours.empty() && kernel != ours)
    bad_peer(origin, "kernel '" + kernel + "' is not this report's kernel '" + ours + "'");
  if (!peers.contains("rows") || !peers["rows"].is_array()) bad_peer(origin, "no \"rows\" array");
  std::vector<std::string> dims = dims_of(peers);
  if (dims.empty()) dims = dims_of(doc);
  if (dims != dims_of(doc)) bad_peer(origin, "its dims differ from the bench's");
  json added = json::array();
  for (size_t i = 0; i < peers["rows"].size(); ++i)
    added.push_back(peer_row(doc, peers["rows"][i], peers, dims, origin, i));
  for (auto& r : added) doc["rows"].push_back(std::move(r));
  doc["peers"].push_back({{"origin", origin}, {"source", gets(peers, "source")},
                          {"device", gets(peers, "device")}, {"rows", added.size()}});
  out = std::move(doc);
}

}  // namespace tessera::harness
