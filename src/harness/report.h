// Tessera harness: a self-contained report of a bench JSON document (generic).
//
// The document is what `tessera bench --json` writes (schema "tessera-bench/1"): "rows" (each
// with at least implementation, mode, dtype, device, ai [flop/byte], gflops [useful GFLOP/s])
// and "roofline" (measured ceilings, roofline.h). The chart is an inline SVG roofline: log-log
// axes of arithmetic intensity vs attained GFLOP/s, one compute ceiling per measured dtype and
// one bandwidth ceiling per device (drawn from the measured peaks), and one labelled point per
// row (its number in the table). The HTML adds the machine, the ceilings and a table of the
// rows. No network, no scripts.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace tessera::harness {

std::string render_roofline_svg(const nlohmann::json& doc);
std::string render_report_html(const nlohmann::json& doc);
// Writes HTML or, for a path ending in .svg, the chart alone. Throws Error(kIo).
void write_report(const nlohmann::json& doc, const std::string& path);

}  // namespace tessera::harness
