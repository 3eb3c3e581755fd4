// The report's charts, inline SVG with no script: the roofline (every row against the measured
// ceilings) and one bar chart per shape, dtype and pass (every implementation, baseline and
// peer timed there, median with its min–max spread, ratios written beside each bar).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <sstream>

#include "harness/report.h"
#include "harness/report_internal.h"
#include "harness/roofline.h"
#include "tessera/error.h"

namespace tessera::harness {
namespace report_detail {
namespace {

std::string tick(double decade_value) {
  char buf[32];
  if (decade_value >= 1e6 || decade_value < 1e-2)
    std::snprintf(buf, sizeof buf, "1e%d", static_cast<int>(std::lround(std::log10(decade_value))));
  else
    std::snprintf(buf, sizeof buf, "%g", decade_value);
  return buf;
}

std::ostringstream svg_stream() {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  return s;
}

// ---- roofline -------------------------------------------------------------------------------

struct Pt {
  size_t index;
  double ai, gf, x = 0, y = 0;
};

struct Box {
  double x0, y0, x1, y1;
  bool hits(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
};

// A log-log plot area: decades lx0..lx1 (intensity) and ly0..ly1 (GFLOP/s).
struct Plot {
  double lx0 = -1, lx1 = 2, ly0 = -1, ly1 = 2;
  static constexpr double W = 960, H = 600, ml = 80, mr = 250, mt = 40, mb = 60;
  static constexpr double pw = W - ml - mr, ph = H - mt - mb;
  double X(double ai) const { return ml + (std::log10(ai) - lx0) / (lx1 - lx0) * pw; }
  double Y(double gf) const { return mt + ph - (std::log10(gf) - ly0) / (ly1 - ly0) * ph; }
  double clampy(double y) const { return std::clamp(y, mt, mt + ph); }
};

// A device's horizontal lines: the physical peaks (the roof) and the BLAS GEMM rates (the
// practical line), as (GFLOP/s, what).
struct ComputeLine {
  std::string cls, key, label;  // css class, data attribute ("data-line=.." / "data-dtype=.."), label
};
// Of the physical peaks, only the roofs (peak_line of f32 and of bf16); sorted by rate.
std::vector<std::pair<double, ComputeLine>> compute_lines(const DeviceCeilings& d) {
  std::vector<std::pair<double, ComputeLine>> out;
  for (const auto& [line, peak] : d.peak_gflops_by_line)
    if (line == d.peak_line("f32").line || line == d.peak_line("bf16").line)
      out.push_back({peak, {"ceiling ceiling-peak", "data-line=\"" + esc(line) + "\"",
                            d.device + " " + line + " peak " + num(peak) + " GFLOP/s"}});
  for (const auto& [dt, peak] : d.gemm_gflops)
    out.push_back({peak, {"ceiling ceiling-compute", "data-dtype=\"" + esc(dt) + "\"",
                          d.device + " " + dt + " GEMM (BLAS) " + num(peak) + " GFLOP/s"}});
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

// Domains padded to whole decades around the points, the peaks and the ridge points.
Plot plot_domain(const std::vector<Pt>& pts, const std::vector<DeviceCeilings>& ceilings) {
  double xmin = 1e300, xmax = 0, ymin = 1e300, ymax = 0;
  for (const auto& p : pts) {
    xmin = std::min(xmin, p.ai), xmax = std::max(xmax, p.ai);
    ymin = std::min(ymin, p.gf), ymax = std::max(ymax, p.gf);
  }
  for (const auto& d : ceilings)
    for (const auto& [peak, line] : compute_lines(d)) {
      if (!usable(peak)) continue;
      ymax = std::max(ymax, peak), ymin = std::min(ymin, peak);
      const double ridge = d.bandwidth_gbs > 0 ? peak / d.bandwidth_gbs : 0;  // may overflow: 1e300 / 1e-320
      if (usable(ridge)) xmin = std::min(xmin, ridge), xmax = std::max(xmax, ridge);
    }
  if (xmax <= 0) xmin = 0.1, xmax = 100;
  if (ymax <= 0) ymin = 0.1, ymax = 100;
  Plot p;
  p.lx0 = std::floor(std::log10(xmin) - 0.3), p.lx1 = std::ceil(std::log10(xmax) + 0.3);
  p.ly0 = std::floor(std::log10(ymin) - 0.3), p.ly1 = std::ceil(std::log10(ymax) + 0.3);
  if (!std::isfinite(p.lx0) || !std::isfinite(p.lx1)) p.lx0 = -1, p.lx1 = 2;  // never loop over ±inf decades
  if (!std::isfinite(p.ly0) || !std::isfinite(p.ly1)) p.ly0 = -1, p.ly1 = 2;
  if (p.lx1 - p.lx0 < 2) p.lx1 = p.lx0 + 2;
  if (p.ly1 - p.ly0 < 2) p.ly0 = p.ly1 - 2;
  return p;
}

void draw_axes(std::ostringstream& s, const Plot& p) {
  s << "<g class=\"axes\" stroke=\"#ddd\">\n";
  for (double e = p.lx0; e <= p.lx1 + 1e-9; e += 1) {
    const double x = p.X(std::pow(10.0, e));
    s << "<line x1=\"" << x << "\" y1=\"" << p.mt << "\" x2=\"" << x << "\" y2=\"" << p.mt + p.ph << "\"/>\n"
      << "<text x=\"" << x << "\" y=\"" << p.mt + p.ph + 18 << "\" text-anchor=\"middle\" stroke=\"none\" fill=\"#333\">"
      << tick(std::pow(10.0, e)) << "</text>\n";
  }
  for (double e = p.ly0; e <= p.ly1 + 1e-9; e += 1) {
    const double y = p.Y(std::pow(10.0, e));
    s << "<line x1=\"" << p.ml << "\" y1=\"" << y << "\" x2=\"" << p.ml + p.pw << "\" y2=\"" << y << "\"/>\n"
      << "<text x=\"" << p.ml - 8 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\" stroke=\"none\" fill=\"#333\">"
      << tick(std::pow(10.0, e)) << "</text>\n";
  }
  s << "</g>\n<rect x=\"" << p.ml << "\" y=\"" << p.mt << "\" width=\"" << p.pw << "\" height=\"" << p.ph
    << "\" fill=\"none\" stroke=\"#333\"/>\n"
    << "<text x=\"" << p.ml + p.pw / 2 << "\" y=\"" << p.H - 15
    << "\" text-anchor=\"middle\">arithmetic intensity (useful flop / minimum byte)</text>\n"
    << "<text transform=\"translate(20," << p.mt + p.ph / 2
    << ") rotate(-90)\" text-anchor=\"middle\">attained GFLOP/s (useful)</text>\n";
}

// One device's bandwidth diagonal up to its highest ridge, and a horizontal line per dtype. The
// bandwidth label runs along its line; the peak labels' boxes go to `taken` (points avoid them).
void draw_device_ceilings(std::ostringstream& s, const Plot& p, const DeviceCeilings& d, const char* dash,
                          std::vector<Box>& taken) {
  const double xl = std::pow(10.0, p.lx0), xr = std::pow(10.0, p.lx1);
  double top = 0;
  const auto lines = compute_lines(d);
  for (const auto& [peak, line] : lines) top = std::max(top, peak);
  if (d.bandwidth_gbs > 0) {
    const double xe = top > 0 ? top / d.bandwidth_gbs : xr;
    const double xs = std::max(xl, std::pow(10.0, p.ly0) / d.bandwidth_gbs);
    if (xs < xe) {
      s << "<line class=\"ceiling ceiling-memory\" data-device=\"" << esc(d.device) << "\" x1=\"" << p.X(xs)
        << "\" y1=\"" << p.clampy(p.Y(xs * d.bandwidth_gbs)) << "\" x2=\"" << p.X(xe) << "\" y2=\""
        << p.clampy(p.Y(xe * d.bandwidth_gbs)) << "\" stroke=\"#444\" stroke-width=\"2\"" << dash << "/>\n";
      const double x1 = p.X(xs), y1 = p.clampy(p.Y(xs * d.bandwidth_gbs));
      const double angle = std::atan2(p.clampy(p.Y(xe * d.bandwidth_gbs)) - y1, p.X(xe) - x1) * 180 / std::numbers::pi;
      s << "<text class=\"ceiling-label\" transform=\"translate(" << x1 << "," << y1 << ") rotate(" << angle
        << ")\" x=\"24\" y=\"-6\" fill=\"#444\">" << esc(d.device) << " " << num(d.bandwidth_gbs) << " GB/s</text>\n";
    }
  }
  double last_ty = 1e300;  // labels stack upwards from the lowest line, each above its own line
  for (const auto& [peak, line] : lines) {
    if (peak <= 0) continue;
    const bool practical = line.cls == "ceiling ceiling-compute";  // the GEMM line: lighter, dotted
    const double ridge = d.bandwidth_gbs > 0 ? peak / d.bandwidth_gbs : xl;
    s << "<line class=\"" << line.cls << "\" data-device=\"" << esc(d.device) << "\" " << line.key
      << " x1=\"" << p.X(std::max(ridge, xl)) << "\" y1=\"" << p.Y(peak) << "\" x2=\"" << p.X(xr) << "\" y2=\""
      << p.Y(peak) << "\" stroke=\"" << (practical ? "#999" : "#444") << "\" stroke-width=\"2\""
      << (practical && !*dash ? " stroke-dasharray=\"2 3\"" : dash) << "/>\n";
    const std::string& label = line.label;
    // Above the line, just right of the ridge: only stale points live above a ceiling.
    const double tx = std::min(p.X(std::max(ridge, xl)) + 6, p.ml + p.pw - 6.5 * static_cast<double>(label.size()) - 4);
    const double ty = std::min(p.Y(peak) - 6, last_ty - 14), tw = 6.5 * static_cast<double>(label.size());
    last_ty = ty;
    taken.push_back({tx, ty - 11, tx + tw, ty + 2});
    s << "<text class=\"ceiling-label\" x=\"" << tx << "\" y=\"" << ty << "\" fill=\"" << (practical ? "#777" : "#444")
      << "\">" << esc(label) << "</text>\n";
  }
}

// Marker: circle for a kernel, square for a baseline, diamond for a peer; hollow, red and
// dashed when the row beat the stored ceilings (they are stale).
void draw_marker(std::ostringstream& s, const json& r, double x, double y, const std::string& c) {
  const bool stale = is_stale(r);
  const std::string kind = gets(r, "kind");
  const std::string style = stale ? "fill=\"white\" stroke=\"#d00000\" stroke-width=\"2\" stroke-dasharray=\"3 2\""
                                  : "fill=\"" + c + "\" fill-opacity=\"0.85\" stroke=\"#000\"";
  if (kind == "baseline")
    s << "<rect class=\"marker\" x=\"" << x - 5 << "\" y=\"" << y - 5 << "\" width=\"10\" height=\"10\" " << style << "/>";
  else if (kind == "peer")
    s << "<polygon class=\"marker\" points=\"" << x << "," << y - 7 << " " << x + 7 << "," << y << " " << x << ","
      << y + 7 << " " << x - 7 << "," << y << "\" " << style << "/>";
  else
    s << "<circle class=\"marker\" cx=\"" << x << "\" cy=\"" << y << "\" r=\"5.5\" " << style << "/>";
  if (stale) s << "<circle cx=\"" << x << "\" cy=\"" << y << "\" r=\"2\" fill=\"" << c << "\"/>";
}

// Points closer than a marker's size share one label ("3,7"): clusters, in row order.
std::vector<std::vector<size_t>> clusters_of(const std::vector<Pt>& pts) {
  std::vector<std::vector<size_t>> out;
  std::vector<bool> used(pts.size(), false);
  for (size_t i = 0; i < pts.size(); ++i) {
    if (used[i]) continue;
    out.push_back({i});
    for (size_t j = i + 1; j < pts.size(); ++j)
      if (!used[j] && std::hypot(pts[i].x - pts[j].x, pts[i].y - pts[j].y) < 6) used[j] = true, out.back().push_back(j);
  }
  return out;
}

// A label box for text `t` near (x, y) that hits no placed box and no marker, inside the plot:
// rings of 8 directions at growing distances. Returns false when all are taken.
bool place_label(const Plot& p, double x, double y, const std::string& t, const std::vector<Box>& taken, Box& out) {
  const double w = 6.5 * static_cast<double>(t.size()) + 2, h = 11;
  for (double r : {9.0, 18.0, 30.0, 44.0, 60.0})
    for (int k = 0; k < 8; ++k) {
      const double a = k * std::numbers::pi / 4, cx = x + r * std::cos(a), cy = y - r * std::sin(a);
      const double bx = std::cos(a) < -0.3 ? cx - w : std::cos(a) > 0.3 ? cx : cx - w / 2;
      const double by = std::sin(a) > 0.3 ? cy - h : std::sin(a) < -0.3 ? cy : cy - h / 2;
      const Box b{bx, by, bx + w, by + h};
      if (b.x0 < p.ml + 2 || b.x1 > p.ml + p.pw - 2 || b.y0 < p.mt + 2 || b.y1 > p.mt + p.ph - 2) continue;
      if (std::none_of(taken.begin(), taken.end(), [&](const Box& o) { return o.hits(b); })) {
        out = b;
        return true;
      }
    }
  return false;
}

// Labels every cluster with its row numbers; the ones that find no free place are listed.
std::string draw_labels(std::ostringstream& s, const Plot& p, const std::vector<Pt>& pts, std::vector<Box> taken) {
  for (const auto& q : pts) taken.push_back({q.x - 7, q.y - 7, q.x + 7, q.y + 7});
  std::string unplaced;
  for (const auto& cl : clusters_of(pts)) {
    std::string t;
    for (size_t i : cl) {
      if (!t.empty()) t += ',';
      t += std::to_string(pts[i].index + 1);
    }
    const double x = pts[cl[0]].x, y = pts[cl[0]].y;
    Box b{};
    if (!place_label(p, x, y, t, taken, b)) {
      if (!unplaced.empty()) unplaced += "; ";
      unplaced += t;
      continue;
    }
    taken.push_back(b);
    const double cx = std::clamp(x, b.x0, b.x1), cy = std::clamp(y, b.y0, b.y1);
    if (std::hypot(cx - x, cy - y) > 12)
      s << "<line class=\"leader\" x1=\"" << x << "\" y1=\"" << y << "\" x2=\"" << cx << "\" y2=\"" << cy
        << "\" stroke=\"#888\" stroke-width=\"0.8\"/>";
    s << "<text class=\"label\" data-box=\"" << b.x0 << " " << b.y0 << " " << b.x1 << " " << b.y1 << "\" x=\"" << b.x0 + 1
      << "\" y=\"" << b.y1 - 2 << "\" font-size=\"11\">" << t << "</text>\n";
  }
  return unplaced;
}

std::string draw_points(std::ostringstream& s, const Plot& p, const json& rows, std::vector<Pt>& pts,
                        const std::map<std::string, std::string>& color, const std::vector<Box>& taken) {
  s << "<g class=\"points\">\n";
  for (auto& q : pts) {
    const auto& r = rows[q.index];
    q.x = p.X(q.ai), q.y = p.Y(q.gf);
    s << "<g class=\"point" << (is_stale(r) ? " stale" : "") << "\" data-row=\"" << q.index + 1 << "\" data-x=\"" << q.x
      << "\" data-y=\"" << q.y << "\"><title>#" << q.index + 1 << " " << esc(gets(r, "implementation")) << " "
      << esc(gets(r, "mode")) << " " << esc(gets(r, "dtype")) << " " << esc(gets(r, "shape")) << ": " << num(q.gf)
      << " GFLOP/s at " << num(q.ai) << " flop/B";
    const double frac = getd(r, "roofline_fraction");
    if (is_stale(r)) s << ", above the stored ceilings (" << num(100 * stale_fraction(r)) << "%): stale";
    else if (std::isfinite(frac)) s << ", " << num(100 * frac) << "% of roofline";
    s << "</title>";
    draw_marker(s, r, q.x, q.y, color.at(gets(r, "implementation")));
    s << "</g>\n";
  }
  const std::string unplaced = draw_labels(s, p, pts, taken);
  s << "</g>\n";
  return unplaced;
}

void draw_legend(std::ostringstream& s, const Plot& p, const std::map<std::string, std::string>& color,
                 const std::vector<DeviceCeilings>& ceilings, const std::string& unplaced, bool any_stale) {
  double ly = p.mt + 10;
  const double lx = p.ml + p.pw + 20;
  s << "<g class=\"legend\">\n";
  for (const auto& [impl, c] : color) {
    s << "<circle cx=\"" << lx << "\" cy=\"" << ly << "\" r=\"5\" fill=\"" << c << "\" stroke=\"#000\"/>"
      << "<text x=\"" << lx + 12 << "\" y=\"" << ly + 4 << "\">" << esc(impl) << "</text>\n";
    ly += 20;
  }
  auto line = [&](const std::string& t, const char* fill = "#555") {
    s << "<text x=\"" << lx - 6 << "\" y=\"" << (ly += 18) << "\" fill=\"" << fill << "\">" << t << "</text>\n";
  };
  ly -= 8;
  line("● kernel  ■ baseline  ◆ peer");
  line("numbers = table rows");
  if (any_stale) line("hollow red = stale ceilings", "#d00000");
  if (ceilings.size() > 1) line("solid: " + esc(ceilings[0].device) + ", dashed: others");
  if (!unplaced.empty()) line("crowded, not labelled: " + esc(unplaced));
  s << "</g>\n";
}

}  // namespace

// ---- bar charts -----------------------------------------------------------------------------

namespace {

// The time axis of a bar chart: linear from 0, or log when the spread is too wide for a
// linear bar to show the fast ones.
struct TimeAxis {
  bool log = false;
  double lo = 0, hi = 1;
  static constexpr double x0 = 118, w = 150;
  double X(double ms) const {
    if (!log) return x0 + ms / hi * w;
    return x0 + (std::log10(std::max(ms, lo)) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) * w;
  }
};

TimeAxis time_axis(const BarGroup& g, const json& rows) {
  double mn = 1e300, mx = 0;
  auto see = [&](double v) {
    if (v > 0 && std::isfinite(v)) mn = std::min(mn, v), mx = std::max(mx, v);
  };
  for (size_t i : g.rows) see(getd(rows[i], "min_ms")), see(getd(rows[i], "median_ms")), see(getd(rows[i], "max_ms"));
  see(g.gemm_floor_ms);
  TimeAxis a;
  a.log = mx / mn > 30;
  a.lo = a.log ? mn / 1.5 : 0;  // log: a little room either side, decade ticks inside
  a.hi = a.log ? mx * 1.3 : mx * 1.05;
  return a;
}

void draw_time_ticks(std::ostringstream& s, const TimeAxis& a, double y0, double y1) {
  std::vector<double> ticks;
  if (a.log) {
    for (double v = std::pow(10.0, std::ceil(std::log10(a.lo))); v <= a.hi; v *= 10) ticks.push_back(v);
  } else {
    // At most 4 steps of 1, 2 or 5 × 10^k: the labels must fit a 150 px axis.
    const double mag = std::pow(10.0, std::floor(std::log10(a.hi / 4)));
    double step = mag * 10;
    for (double m : {5.0, 2.0, 1.0})
      if (a.hi / (m * mag) <= 4) step = m * mag;
    for (double v = 0; v <= a.hi * 1.0001; v += step) ticks.push_back(v);
  }
  for (double v : ticks)
    s << "<line x1=\"" << a.X(v) << "\" y1=\"" << y0 << "\" x2=\"" << a.X(v) << "\" y2=\"" << y1
      << "\" stroke=\"#e4e4e4\"/><text x=\"" << a.X(v) << "\" y=\"" << y1 + 13
      << "\" text-anchor=\"middle\" fill=\"#555\" font-size=\"10\">" << (a.log ? tick(v) : num(v)) << "</text>\n";
  s << "<text x=\"" << a.x0 + a.w / 2 << "\" y=\"" << y1 + 26 << "\" text-anchor=\"middle\" fill=\"#555\" font-size=\"10\">"
    << "median ms, whisker min–max" << (a.log ? " (log scale)" : "") << "</text>\n";
}

// "0.173 ms · 3.76× GEMM · 0.78× mat.": the ratios of one bar (to the GEMM floor and to the
// materialized baseline).
std::string bar_text(const json& r, const BarGroup& g) {
  const double med = getd(r, "median_ms");
  std::string t = num(med) + " ms";
  if (g.gemm_floor_ms > 0) t += " · " + num(med / g.gemm_floor_ms) + "× GEMM";
  if (g.baseline_ms > 0 && gets(r, "implementation") != g.baseline_name)
    t += " · " + num(med / g.baseline_ms) + "× mat.";
  return t;
}

void draw_bar(std::ostringstream& s, const json& r, const BarGroup& g, const TimeAxis& a, double y, bool fastest,
              const std::string& c) {
  const std::string kind = gets(r, "kind");
  const double med = getd(r, "median_ms"), lo = getd(r, "min_ms"), hi = getd(r, "max_ms");
  s << "<g class=\"bar bar-" << esc(kind) << "\" data-implementation=\"" << esc(gets(r, "implementation")) << "\">";
  s << "<text x=\"" << a.x0 - 8 << "\" y=\"" << y + 13 << "\" text-anchor=\"end\"" << (fastest ? " font-weight=\"bold\"" : "")
    << ">" << esc(gets(r, "implementation")) << (kind == "peer" ? " (peer)" : "") << "</text>";
  s << "<rect x=\"" << a.x0 << "\" y=\"" << y + 3 << "\" width=\"" << std::max(1.0, a.X(med) - a.x0)
    << "\" height=\"14\" fill=\"" << c << "\" fill-opacity=\"" << (kind == "kernel" ? "0.85" : "0.45") << "\""
    << (kind == "peer" ? " stroke=\"#000\" stroke-dasharray=\"3 2\"" : "") << "/>";
  double end = a.X(med);
  if (lo > 0 && hi > 0) {
    const double x0 = a.X(lo), x1 = a.X(hi);
    end = std::max(end, x1);
    s << "<path class=\"spread\" d=\"M" << x0 << " " << y + 10 << "H" << x1 << "M" << x0 << " " << y + 5 << "V" << y + 15
      << "M" << x1 << " " << y + 5 << "V" << y + 15 << "\" stroke=\"#222\" fill=\"none\"/>";
  }
  const double floor_x = g.gemm_floor_ms > 0 ? a.X(g.gemm_floor_ms) : -1;
  if (floor_x > end - 1 && floor_x < end + 12) end = floor_x;  // the text starts past the floor line
  s << "<text class=\"ratios\" x=\"" << end + 6 << "\" y=\"" << y + 13 << "\" font-size=\"11\">" << esc(bar_text(r, g))
    << "</text></g>\n";
}

std::string bar_chart(const BarGroup& g, const json& rows, const std::map<std::string, std::string>& color) {
  const TimeAxis a = time_axis(g, rows);
  const double top = 44, row_h = 22, W = 480, Hh = top + row_h * static_cast<double>(g.rows.size()) + 36;
  auto s = svg_stream();
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"bars\" width=\"" << W << "\" height=\"" << Hh
    << "\" viewBox=\"0 0 " << W << " " << Hh << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"" << W << "\" height=\"" << Hh << "\" fill=\"white\"/>\n"
    << "<text class=\"title\" x=\"8\" y=\"18\" font-weight=\"bold\">" << esc(g.title) << "</text>\n";
  const double y1 = top + row_h * static_cast<double>(g.rows.size());
  draw_time_ticks(s, a, top, y1);
  if (g.gemm_floor_ms > 0) {
    const double x = a.X(g.gemm_floor_ms);
    const bool right = x > a.x0 + a.w * 0.6;  // label left of the line near the right edge
    s << "<line class=\"gemm-floor\" x1=\"" << x << "\" y1=\"" << top - 4 << "\" x2=\"" << x << "\" y2=\"" << y1
      << "\" stroke=\"#000\" stroke-width=\"1.5\" stroke-dasharray=\"5 3\"/><text x=\"" << (right ? x - 3 : x + 3)
      << "\" y=\"" << top - 6 << "\" font-size=\"10\" fill=\"#000\"" << (right ? " text-anchor=\"end\"" : "") << ">GEMM floor "
      << num(g.gemm_floor_ms) << " ms</text>\n";
  }
  for (size_t k = 0; k < g.rows.size(); ++k) {
    const auto& r = rows[g.rows[k]];
    draw_bar(s, r, g, a, top + row_h * static_cast<double>(k), k == 0, color.at(gets(r, "implementation")));
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace

std::string render_bar_charts(const json& in) {
  const json doc = normalize_bench_doc(in);
  const auto groups = bar_groups(doc);
  const auto color = implementation_colors(doc["rows"]);
  std::string out = "<div class=\"bar-charts\">\n";
  for (const auto& g : groups) out += bar_chart(g, doc["rows"], color);
  if (groups.empty()) out += "<p>No timed rows.</p>\n";
  return out + "</div>\n";
}

}  // namespace report_detail

using namespace report_detail;

std::string render_roofline_svg(const json& in) {
  check(in.is_object() && in.contains("rows") && in["rows"].is_array(), ErrorCode::kInvalidArgument,
        "report: the document has no \"rows\" array (is it a `tessera bench --json` file?)");
  const json doc = normalize_bench_doc(in);
  const auto& rows = doc["rows"];
  const auto ceilings = ceilings_of(doc);
  std::vector<Pt> pts;
  for (size_t i = 0; i < rows.size(); ++i) {
    const double ai = getd(rows[i], "ai"), gf = getd(rows[i], "gflops");
    if (ai > 0 && gf > 0 && std::isfinite(ai) && std::isfinite(gf)) pts.push_back({i, ai, gf});
  }
  const Plot p = plot_domain(pts, ceilings);
  auto s = svg_stream();
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"roofline\" width=\"" << p.W << "\" height=\"" << p.H
    << "\" viewBox=\"0 0 " << p.W << " " << p.H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << p.W << "\" height=\"" << p.H << "\" fill=\"white\"/>\n"
    << "<title>Roofline: arithmetic intensity vs attained GFLOP/s</title>\n";
  draw_axes(s, p);
  s << "<g class=\"ceilings\">\n";
  std::vector<Box> taken;
  for (size_t i = 0; i < ceilings.size(); ++i)
    draw_device_ceilings(s, p, ceilings[i], i == 0 ? "" : " stroke-dasharray=\"6 3\"", taken);
  s << "</g>\n";
  const auto color = implementation_colors(rows);
  const std::string unplaced = draw_points(s, p, rows, pts, color, taken);
  const bool any_stale = std::any_of(rows.begin(), rows.end(), [](const json& r) { return is_stale(r); });
  draw_legend(s, p, color, ceilings, unplaced, any_stale);
  if (pts.empty())
    s << "<text x=\"" << p.ml + p.pw / 2 << "\" y=\"" << p.mt + p.ph / 2
      << "\" text-anchor=\"middle\" fill=\"#a00\">no rows with a positive rate to plot</text>\n";
  s << "</svg>\n";
  return s.str();
}

}  // namespace tessera::harness
