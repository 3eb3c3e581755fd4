// Tessera harness, internal to the report: helpers shared by report.cc (the page and its table),
// report_data.cc (normalizing documents, merging peers, grouping rows) and report_charts.cc (the
// SVG charts). Nothing here knows a kernel: dims come from the document.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/roofline.h"

namespace tessera::harness::report_detail {

using nlohmann::json;

std::string esc(const std::string& s);   // HTML/XML text and attribute escaping
std::string num(double v);               // 3 significant digits, "–" when not finite
double getd(const json& r, const char* k);       // NaN when absent or not a number
std::string gets(const json& r, const char* k);  // "" when absent or null

// The document's ceilings, keeping only what a chart or table can use: a peak or a bandwidth
// that is not a finite positive number is dropped, as if unmeasured. Throws
// Error(kInvalidArgument) when "roofline.devices" is not a list of ceilings.
std::vector<DeviceCeilings> ceilings_of(const json& doc);
bool usable(double v);  // finite and > 0

std::vector<std::string> dims_of(const json& doc);
std::string dims_label(const json& row, const std::vector<std::string>& dims);  // "B=8 H=16 V=64"
// Above 100 % of the stored ceilings: flagged by the bench (roofline_stale), or an old file's
// fraction above 1.
bool is_stale(const json& row);
double stale_fraction(const json& row);  // the measured fraction of a stale row, else NaN
// A colour per implementation, in order of first appearance.
std::map<std::string, std::string> implementation_colors(const json& rows);

// The rows of one bar chart: one shape (its dims values), one dtype, one pass.
struct BarGroup {
  std::string title;            // "small · B=64 H=64 V=512 · f32 · forward"
  std::vector<size_t> rows;     // indices into doc["rows"], fastest first
  double gemm_floor_ms = 0;     // useful GEMMs × one GEMM, 0 when unknown
  int gemm_count = 0;
  double baseline_ms = 0;       // the materialized baseline, 0 when unknown
  std::string baseline_name;
};
std::vector<BarGroup> bar_groups(const json& doc);

std::string render_bar_charts(const json& doc);  // one <svg> per group, in a <div>

}  // namespace tessera::harness::report_detail
