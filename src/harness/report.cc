#include "harness/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "harness/roofline.h"
#include "harness/table.h"
#include "tessera/error.h"

namespace tessera::harness {
namespace {

using nlohmann::json;

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

// 3 significant digits, no exponent for everyday magnitudes.
std::string num(double v) {
  if (!std::isfinite(v)) return "–";
  char buf[48];
  const double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 1e6 || a < 1e-3)
    std::snprintf(buf, sizeof buf, "%.3g", v);
  else if (a >= 100)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else if (a >= 10)
    std::snprintf(buf, sizeof buf, "%.1f", v);
  else if (a >= 1)
    std::snprintf(buf, sizeof buf, "%.2f", v);
  else
    std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string tick(double decade_value) {
  char buf[32];
  if (decade_value >= 1e6 || decade_value < 1e-2)
    std::snprintf(buf, sizeof buf, "1e%d", static_cast<int>(std::lround(std::log10(decade_value))));
  else if (decade_value >= 1)
    std::snprintf(buf, sizeof buf, "%.0f", decade_value);
  else
    std::snprintf(buf, sizeof buf, "%g", decade_value);
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

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                          "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

// The document's ceilings, keeping only the values a chart can use: a peak or a bandwidth that
// is not a finite positive number is dropped, as if unmeasured (their ratio, the ridge point,
// is checked apart: 1e300 / 1e-320 overflows). Throws Error(kInvalidArgument) for a "devices" list that is not ceilings.
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
    if (!(d.bandwidth_gbs > 0) || !std::isfinite(d.bandwidth_gbs)) d.bandwidth_gbs = 0;
    std::erase_if(d.gemm_gflops, [](const auto& kv) { return !(kv.second > 0) || !std::isfinite(kv.second); });
  }
  return out;
}

bool usable(double v) { return v > 0 && std::isfinite(v); }

std::string row_label(const json& r) {
  std::string s = gets(r, "implementation") + " " + gets(r, "mode") + " " + gets(r, "dtype");
  const std::string shape = gets(r, "shape");
  if (!shape.empty()) s += " " + shape;
  if (r.contains("B")) s += " (B=" + gets(r, "B") + " H=" + gets(r, "H") + " V=" + gets(r, "V") + ")";
  return s;
}

}  // namespace

namespace {
std::string render_roofline_svg_impl(const json& doc);
std::string render_report_html_impl(const json& doc);

// A document that is JSON but not a bench document fails with Error(kInvalidArgument), never
// with an escaped json::exception: every field read below is type-checked, this is the net.
template <class F>
std::string guarded(F&& f) {
  try {
    return f();
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, std::string("report: malformed bench document: ") + e.what());
  }
}
}  // namespace

std::string render_roofline_svg(const json& doc) {
  return guarded([&] { return render_roofline_svg_impl(doc); });
}
std::string render_report_html(const json& doc) {
  return guarded([&] { return render_report_html_impl(doc); });
}

namespace {
std::string render_roofline_svg_impl(const json& doc) {
  check(doc.is_object() && doc.contains("rows") && doc["rows"].is_array(), ErrorCode::kInvalidArgument,
        "report: the document has no \"rows\" array (is it a `tessera bench --json` file?)");
  const auto& rows = doc["rows"];
  const auto ceilings = ceilings_of(doc);

  // Plottable points.
  struct Pt {
    size_t index;
    double ai, gf;
  };
  std::vector<Pt> pts;
  for (size_t i = 0; i < rows.size(); ++i) {
    const double ai = getd(rows[i], "ai"), gf = getd(rows[i], "gflops");
    if (ai > 0 && gf > 0 && std::isfinite(ai) && std::isfinite(gf)) pts.push_back({i, ai, gf});
  }

  // Domains (log10), padded to whole decades around points, peaks and ridge points.
  double xmin = 1e300, xmax = 0, ymin = 1e300, ymax = 0;
  for (const auto& p : pts) {
    xmin = std::min(xmin, p.ai), xmax = std::max(xmax, p.ai);
    ymin = std::min(ymin, p.gf), ymax = std::max(ymax, p.gf);
  }
  for (const auto& d : ceilings) {
    for (const auto& [dt, peak] : d.gemm_gflops) {
      if (peak <= 0) continue;
      ymax = std::max(ymax, peak);
      ymin = std::min(ymin, peak);
      const double ridge = d.bandwidth_gbs > 0 ? peak / d.bandwidth_gbs : 0;
      if (usable(ridge)) xmin = std::min(xmin, ridge), xmax = std::max(xmax, ridge);  // may under/overflow
    }
  }
  if (xmax <= 0) xmin = 0.1, xmax = 100;
  if (ymax <= 0) ymin = 0.1, ymax = 100;
  double lx0 = std::floor(std::log10(xmin) - 0.3), lx1 = std::ceil(std::log10(xmax) + 0.3);
  double ly0 = std::floor(std::log10(ymin) - 0.3), ly1 = std::ceil(std::log10(ymax) + 0.3);
  // Whole decades between finite bounds: the tick loops below step by one decade.
  if (!std::isfinite(lx0) || !std::isfinite(lx1)) lx0 = -1, lx1 = 2;
  if (!std::isfinite(ly0) || !std::isfinite(ly1)) ly0 = -1, ly1 = 2;
  if (lx1 - lx0 < 2) lx1 = lx0 + 2;
  if (ly1 - ly0 < 2) ly0 = ly1 - 2;

  const double W = 960, Hh = 600, ml = 80, mr = 250, mt = 40, mb = 60;
  const double pw = W - ml - mr, ph = Hh - mt - mb;
  auto X = [&](double ai) { return ml + (std::log10(ai) - lx0) / (lx1 - lx0) * pw; };
  auto Y = [&](double gf) { return mt + ph - (std::log10(gf) - ly0) / (ly1 - ly0) * ph; };
  auto clampy = [&](double y) { return std::clamp(y, mt, mt + ph); };

  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"roofline\" width=\"" << W << "\" height=\"" << Hh
    << "\" viewBox=\"0 0 " << W << " " << Hh << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s << "<rect x=\"0\" y=\"0\" width=\"" << W << "\" height=\"" << Hh << "\" fill=\"white\"/>\n";
  s << "<title>Roofline: arithmetic intensity vs attained GFLOP/s</title>\n";
  // Grid and ticks.
  s << "<g class=\"axes\" stroke=\"#ddd\">\n";
  for (double e = lx0; e <= lx1 + 1e-9; e += 1) {
    const double x = ml + (e - lx0) / (lx1 - lx0) * pw;
    s << "<line x1=\"" << x << "\" y1=\"" << mt << "\" x2=\"" << x << "\" y2=\"" << mt + ph << "\"/>\n";
    s << "<text x=\"" << x << "\" y=\"" << mt + ph + 18 << "\" text-anchor=\"middle\" stroke=\"none\" fill=\"#333\">"
      << tick(std::pow(10.0, e)) << "</text>\n";
  }
  for (double e = ly0; e <= ly1 + 1e-9; e += 1) {
    const double y = mt + ph - (e - ly0) / (ly1 - ly0) * ph;
    s << "<line x1=\"" << ml << "\" y1=\"" << y << "\" x2=\"" << ml + pw << "\" y2=\"" << y << "\"/>\n";
    s << "<text x=\"" << ml - 8 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\" stroke=\"none\" fill=\"#333\">"
      << tick(std::pow(10.0, e)) << "</text>\n";
  }
  s << "</g>\n";
  s << "<rect x=\"" << ml << "\" y=\"" << mt << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#333\"/>\n";
  s << "<text x=\"" << ml + pw / 2 << "\" y=\"" << Hh - 15
    << "\" text-anchor=\"middle\">arithmetic intensity (useful flop / minimum byte)</text>\n";
  s << "<text transform=\"translate(20," << mt + ph / 2
    << ") rotate(-90)\" text-anchor=\"middle\">attained GFLOP/s (useful)</text>\n";

  // Ceilings: for each device, the bandwidth diagonal up to the highest peak's ridge, and one
  // horizontal line per dtype from its ridge to the right edge.
  const double xl = std::pow(10.0, lx0), xr = std::pow(10.0, lx1);
  s << "<g class=\"ceilings\">\n";
  int dev_i = 0;
  for (const auto& d : ceilings) {
    const char* dash = dev_i++ == 0 ? "" : " stroke-dasharray=\"6 3\"";
    double top = 0;
    for (const auto& [dt, peak] : d.gemm_gflops) top = std::max(top, peak);
    if (d.bandwidth_gbs > 0) {
      const double xe = top > 0 ? std::min(top / d.bandwidth_gbs, xr) : xr;
      // Clip the diagonal y = ai · bw to the plot.
      double xs = std::max(xl, std::pow(10.0, ly0) / d.bandwidth_gbs);
      if (xs < xe) {
        s << "<line class=\"ceiling ceiling-memory\" data-device=\"" << esc(d.device) << "\" x1=\"" << X(xs)
          << "\" y1=\"" << clampy(Y(xs * d.bandwidth_gbs)) << "\" x2=\"" << X(xe) << "\" y2=\""
          << clampy(Y(xe * d.bandwidth_gbs)) << "\" stroke=\"#444\" stroke-width=\"2\"" << dash << "/>\n";
        const double lx = std::max(xs * 1.6, xl * 1.6);
        s << "<text class=\"ceiling-label\" x=\"" << X(lx) + 4 << "\" y=\"" << clampy(Y(lx * d.bandwidth_gbs)) - 8
          << "\" fill=\"#444\">" << esc(d.device) << " " << num(d.bandwidth_gbs) << " GB/s</text>\n";
      }
    }
    int k = 0;
    for (const auto& [dt, peak] : d.gemm_gflops) {
      if (peak <= 0) continue;
      const double ridge = d.bandwidth_gbs > 0 ? peak / d.bandwidth_gbs : xl;
      s << "<line class=\"ceiling ceiling-compute\" data-device=\"" << esc(d.device) << "\" data-dtype=\""
        << esc(dt) << "\" x1=\"" << X(std::max(ridge, xl)) << "\" y1=\"" << Y(peak) << "\" x2=\"" << X(xr)
        << "\" y2=\"" << Y(peak) << "\" stroke=\"#444\" stroke-width=\"2\"" << dash << "/>\n";
      s << "<text class=\"ceiling-label\" x=\"" << X(xr) - 6 << "\" y=\"" << Y(peak) - 6 - 14 * k
        << "\" text-anchor=\"end\" fill=\"#444\">" << esc(d.device) << " " << esc(dt) << " GEMM peak "
        << num(peak) << " GFLOP/s</text>\n";
      ++k;
    }
  }
  s << "</g>\n";

  // Points: colour by implementation, square for baselines; label = row number.
  std::map<std::string, const char*> color;
  for (const auto& r : rows) {
    const std::string impl = gets(r, "implementation");
    if (!color.count(impl)) color[impl] = kPalette[color.size() % (sizeof kPalette / sizeof *kPalette)];
  }
  s << "<g class=\"points\">\n";
  std::vector<std::pair<double, double>> placed;  // label anchors already used
  for (const auto& p : pts) {
    const auto& r = rows[p.index];
    const char* c = color[gets(r, "implementation")];
    const double x = X(p.ai), y = Y(p.gf);
    const bool baseline = gets(r, "kind") == "baseline";
    s << "<g class=\"point\" data-row=\"" << p.index + 1 << "\">";
    s << "<title>#" << p.index + 1 << " " << esc(row_label(r)) << ": " << num(p.gf) << " GFLOP/s at "
      << num(p.ai) << " flop/B";
    const double frac = getd(r, "roofline_fraction");
    if (std::isfinite(frac)) s << ", " << num(100 * frac) << "% of roofline";
    s << "</title>";
    if (baseline)
      s << "<rect x=\"" << x - 5 << "\" y=\"" << y - 5 << "\" width=\"10\" height=\"10\" fill=\"" << c
        << "\" fill-opacity=\"0.75\" stroke=\"#000\"/>";
    else
      s << "<circle cx=\"" << x << "\" cy=\"" << y << "\" r=\"5.5\" fill=\"" << c
        << "\" fill-opacity=\"0.85\" stroke=\"#000\"/>";
    // Label next to the point, at the first offset that does not collide with earlier labels.
    const double offs[][2] = {{7, -6}, {7, 13}, {-19, -6}, {-19, 13}, {7, -18}, {-19, -18}, {7, 25}};
    double tx = x + 7, ty = y - 6;
    for (const auto& o : offs) {
      bool clash = false;
      for (const auto& [px, py] : placed) clash |= std::fabs(px - (x + o[0])) < 16 && std::fabs(py - (y + o[1])) < 11;
      if (!clash) {
        tx = x + o[0], ty = y + o[1];
        break;
      }
    }
    placed.emplace_back(tx, ty);
    s << "<text x=\"" << tx << "\" y=\"" << ty << "\" font-size=\"11\">" << p.index + 1 << "</text>";
    s << "</g>\n";
  }
  s << "</g>\n";

  // Legend.
  double ly = mt + 10;
  const double lx = ml + pw + 20;
  s << "<g class=\"legend\">\n";
  for (const auto& [impl, c] : color) {
    s << "<circle cx=\"" << lx << "\" cy=\"" << ly << "\" r=\"5\" fill=\"" << c << "\" stroke=\"#000\"/>"
      << "<text x=\"" << lx + 12 << "\" y=\"" << ly + 4 << "\">" << esc(impl) << "</text>\n";
    ly += 20;
  }
  ly += 10;
  s << "<text x=\"" << lx - 6 << "\" y=\"" << ly << "\" fill=\"#555\">● kernel  ■ BLAS baseline</text>\n";
  ly += 18;
  s << "<text x=\"" << lx - 6 << "\" y=\"" << ly << "\" fill=\"#555\">numbers = table rows</text>\n";
  if (ceilings.size() > 1) {
    ly += 18;
    s << "<text x=\"" << lx - 6 << "\" y=\"" << ly << "\" fill=\"#555\">solid: " << esc(ceilings[0].device)
      << ", dashed: others</text>\n";
  }
  if (pts.empty()) {
    s << "<text x=\"" << ml + pw / 2 << "\" y=\"" << mt + ph / 2
      << "\" text-anchor=\"middle\" fill=\"#a00\">no rows with a positive rate to plot</text>\n";
  }
  s << "</g>\n</svg>\n";
  return s.str();
}

std::string render_report_html_impl(const json& doc) {
  const std::string svg = render_roofline_svg_impl(doc);
  const auto& rows = doc["rows"];
  const auto ceilings = ceilings_of(doc);
  std::ostringstream h;
  const std::string kernel = gets(doc, "kernel");
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>Tessera bench"
    << (kernel.empty() ? "" : ": " + esc(kernel)) << "</title>\n<style>\n"
    << "body{font-family:sans-serif;margin:24px;color:#222}\n"
    << "table{border-collapse:collapse;font-size:13px;margin:12px 0}\n"
    << "th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;white-space:nowrap}\n"
    << "th{background:#f0f0f0}td.t{text-align:left}\n"
    << "tr.baseline td{color:#555;background:#fafafa}\n"
    << ".small{font-size:12px;color:#555}\ntd.small{white-space:normal;text-align:left;min-width:260px;max-width:520px}\n"
    << "th.t{text-align:left}\n</style></head><body>\n";
  h << "<h1>Tessera bench" << (kernel.empty() ? "" : ": " + esc(kernel)) << "</h1>\n";
  h << "<p class=\"small\">";
  if (doc.contains("created_at")) h << "created " << esc(gets(doc, "created_at")) << " · ";
  if (doc.contains("tessera_version")) h << "tessera " << esc(gets(doc, "tessera_version")) << " · ";
  if (doc.contains("command")) h << "<code>" << esc(gets(doc, "command")) << "</code>";
  h << "</p>\n";
  if (doc.contains("machine") && doc["machine"].is_object()) {
    h << "<p>";
    for (auto it = doc["machine"].begin(); it != doc["machine"].end(); ++it)
      h << "<b>" << esc(it.key()) << "</b>: " << esc(it->is_string() ? it->get<std::string>() : it->dump()) << " &nbsp; ";
    h << "</p>\n";
  }
  h << "<h2>Ceilings</h2>\n";
  if (ceilings.empty()) {
    h << "<p>No ceilings in this file: no fraction of roofline, and no ceiling lines.</p>\n";
  } else {
    h << "<table><tr><th class=\"t\">device</th><th class=\"t\">name</th><th>GEMM peak GFLOP/s</th><th>bandwidth GB/s</th>"
         "<th class=\"t\">how</th></tr>\n";
    for (const auto& d : ceilings) {
      std::string peaks, how;
      for (const auto& [dt, p] : d.gemm_gflops) peaks += (peaks.empty() ? "" : ", ") + dt + " " + num(p);
      for (const auto& [dt, m] : d.gemm_method) how += dt + ": " + m + "<br>";
      how += "bandwidth: " + esc(d.bandwidth_method);
      for (const auto& n : d.notes) how += "<br>" + esc(n);
      h << "<tr><td class=\"t\">" << esc(d.device) << "</td><td class=\"t\">" << esc(d.name) << "</td><td>" << esc(peaks)
        << "</td><td>" << num(d.bandwidth_gbs) << "</td><td class=\"t small\">" << how << "</td></tr>\n";
    }
    h << "</table>\n";
    if (doc.contains("roofline_source")) h << "<p class=\"small\">" << esc(gets(doc, "roofline_source")) << "</p>\n";
  }
  h << "<h2>Roofline</h2>\n" << svg;
  h << "<h2>Rows</h2>\n<table>\n<tr><th>#</th><th>implementation</th><th>mode</th><th>shape</th><th>B</th><th>H</th>"
       "<th>V</th><th>dtype</th><th>median ms</th><th>min–max ms</th><th>first call ms</th><th>GFLOP/s</th>"
       "<th>GB/s</th><th>flop/B</th><th>% roofline</th><th>extra MiB</th><th>× GEMM</th>"
       "<th>× materialized</th><th>note</th></tr>\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const double frac = getd(r, "roofline_fraction");
    double extra = getd(r, "extra_host_bytes");
    const double dev_extra = getd(r, "extra_device_bytes");
    if (std::isfinite(dev_extra) && dev_extra > 0) extra = dev_extra;
    h << "<tr" << (gets(r, "kind") == "baseline" ? " class=\"baseline\"" : "") << "><td>" << i + 1
      << "</td><td class=\"t\">" << esc(gets(r, "implementation")) << "</td><td class=\"t\">" << esc(gets(r, "mode"))
      << "</td><td class=\"t\">" << esc(gets(r, "shape")) << "</td><td>" << esc(gets(r, "B")) << "</td><td>"
      << esc(gets(r, "H")) << "</td><td>" << esc(gets(r, "V")) << "</td><td class=\"t\">" << esc(gets(r, "dtype"))
      << "</td><td>" << num(getd(r, "median_ms")) << "</td><td>" << num(getd(r, "min_ms")) << "–"
      << num(getd(r, "max_ms")) << "</td><td>" << num(getd(r, "first_call_ms")) << "</td><td>"
      << num(getd(r, "gflops")) << "</td><td>" << num(getd(r, "gbs")) << "</td><td>" << num(getd(r, "ai"))
      << "</td><td>" << (std::isfinite(frac) ? num(100 * frac) : "–") << "</td><td>"
      << (std::isfinite(extra) ? num(extra / 1048576.0) : "–") << "</td><td>" << num(getd(r, "vs_gemm"))
      << "</td><td>" << num(getd(r, "vs_baseline")) << "</td><td class=\"t small\">" << esc(gets(r, "note"))
      << "</td></tr>\n";
  }
  h << "</table>\n";
  h << "<p class=\"small\">GFLOP/s counts useful flops (recomputation excluded); GB/s and flop/B use the minimum "
       "bytes (inputs read once, outputs written once). × GEMM = median / (useful GEMM count × one "
       "[B×H]·[H×V] BLAS GEMM); × materialized = median / the unfused BLAS baseline; below 1 is faster.</p>\n";
  if (doc.contains("messages") && doc["messages"].is_array() && !doc["messages"].empty()) {
    h << "<h2>Messages</h2>\n<ul>\n";
    for (const auto& m : doc["messages"]) h << "<li>" << esc(m.is_string() ? m.get<std::string>() : m.dump()) << "</li>\n";
    h << "</ul>\n";
  }
  h << "</body></html>\n";
  return h.str();
}

}  // namespace

void write_report(const json& doc, const std::string& path) {
  const bool svg = path.size() >= 4 && path.compare(path.size() - 4, 4, ".svg") == 0;
  write_text_file(path, svg ? "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + render_roofline_svg(doc)
                            : render_report_html(doc));
}

}  // namespace tessera::harness
