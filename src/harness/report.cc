// The report page: header (kernel, dims, machine, BLAS said once, peers, stale warning), the
// bar charts, the roofline, the ceilings, the rows table and the bench's messages. The charts
// are in report_charts.cc, the data handling in report_data.cc.
#include "harness/report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include "harness/report_internal.h"
#include "harness/roofline.h"
#include "harness/table.h"
#include "tessera/error.h"

namespace tessera::harness {
namespace {

using nlohmann::json;
using namespace report_detail;

const char* kStyle =
    "body{font-family:sans-serif;margin:24px;color:#222;max-width:1400px}\n"
    "h2{margin-top:28px}\n"
    "table{border-collapse:collapse;font-size:11.5px;margin:12px 0}\n"
    "th,td{border:1px solid #ccc;padding:2px 4px;text-align:right;white-space:nowrap}\n"
    "th{white-space:normal;vertical-align:bottom}\n"
    "th{background:#f0f0f0}td.t,th.t{text-align:left}\n"
    "tr.baseline td{color:#555;background:#fafafa}tr.peer td{background:#f4f8ff}\n"
    "tr td.stale{color:#b00000;font-weight:bold}\n"
    ".wrap{max-width:100%;overflow-x:auto}\n"
    ".small{font-size:12px;color:#555}td.small{white-space:normal;text-align:left;max-width:420px}\n"
    ".warn{border:2px solid #d00000;background:#fff4f4;padding:8px 12px;margin:12px 0;max-width:960px}\n"
    ".bar-charts{display:flex;flex-wrap:wrap;gap:12px}\n"
    "svg{max-width:100%;height:auto}\nol.notes{font-size:12px;color:#444}\n";

// The machine's BLAS description, said once in the header and shortened in every note.
std::string blas_of(const json& doc) {
  return doc.contains("machine") && doc["machine"].is_object() ? gets(doc["machine"], "blas") : "";
}

std::string short_note(std::string note, const std::string& blas) {
  if (blas.empty()) return note;
  for (size_t p = note.find(blas); p != std::string::npos; p = note.find(blas, p)) note.replace(p, blas.size(), "the BLAS");
  return note;
}

void header_section(std::ostringstream& h, const json& doc) {
  const std::string kernel = gets(doc, "kernel");
  h << "<h1>Tessera bench" << (kernel.empty() ? "" : ": " + esc(kernel)) << "</h1>\n<p class=\"small\">";
  if (doc.contains("created_at")) h << "created " << esc(gets(doc, "created_at")) << " · ";
  if (doc.contains("tessera_version")) h << "tessera " << esc(gets(doc, "tessera_version")) << " · ";
  if (doc.contains("schema")) h << esc(gets(doc, "schema")) << " · ";
  if (doc.contains("command")) h << "<code>" << esc(gets(doc, "command")) << "</code>";
  h << "</p>\n<p>";
  std::string dims;
  for (const auto& d : dims_of(doc)) dims += (dims.empty() ? "" : ", ") + d;
  if (!dims.empty()) h << "<b>dims</b>: " << esc(dims) << " &nbsp; ";
  if (doc.contains("machine") && doc["machine"].is_object())
    for (auto it = doc["machine"].begin(); it != doc["machine"].end(); ++it)
      h << "<b>" << esc(it.key()) << "</b>: " << esc(it->is_string() ? it->get<std::string>() : it->dump()) << " &nbsp; ";
  h << "</p>\n";
  if (!blas_of(doc).empty())
    h << "<p class=\"small\">Baselines and the GEMM floor run through the BLAS above (“the BLAS” in the notes).</p>\n";
  if (doc.contains("peers") && doc["peers"].is_array())
    for (const auto& p : doc["peers"])
      h << "<p class=\"small\">Peer results merged from <code>" << esc(gets(p, "origin")) << "</code>: " << esc(gets(p, "rows"))
        << " rows; " << esc(gets(p, "source")) << (gets(p, "device").empty() ? "" : " on " + esc(gets(p, "device")))
        << "</p>\n";
}

void stale_warning(std::ostringstream& h, const json& rows) {
  const auto n = std::count_if(rows.begin(), rows.end(), [](const json& r) { return is_stale(r); });
  if (n == 0) return;
  h << "<div class=\"warn\"><b>Stale ceilings.</b> " << n << (n == 1 ? " row ran" : " rows ran")
    << " faster than the stored ceilings allow (“stale” in the % roofline column, hollow red on the roofline): "
       "the ceilings were measured on a busy machine or on another one, so no fraction of roofline is given for "
       "them. Re-measure on an idle machine with <code>tessera roofline</code> (it stores them where "
       "<code>tessera bench</code> reads them; <code>--out FILE</code> and <code>tessera bench --roofline FILE</code> "
       "for another place), then re-run the bench.</div>\n";
}

void ceilings_section(std::ostringstream& h, const json& doc) {
  h << "<h2>Ceilings</h2>\n";
  const std::vector<DeviceCeilings> ceilings = ceilings_of(doc);
  if (ceilings.empty()) {
    h << "<p>No ceilings in this file: no fraction of roofline, and no ceiling lines.</p>\n";
    return;
  }
  const std::string blas = blas_of(doc);
  h << "<div class=\"wrap\"><table><tr><th class=\"t\">device</th><th class=\"t\">name</th>"
       "<th>peak GFLOP/s (the roof)</th><th>BLAS GEMM GFLOP/s</th><th>bandwidth GB/s</th><th class=\"t\">how</th></tr>\n";
  for (const auto& d : ceilings) {
    std::string peaks, gemms, how;
    for (const auto& [line, p] : d.peak_gflops_by_line) peaks += (peaks.empty() ? "" : ", ") + line + " " + num(p);
    for (const auto& [dt, p] : d.gemm_gflops) gemms += (gemms.empty() ? "" : ", ") + dt + " " + num(p);
    for (const auto& [line, m] : d.peak_method) how += esc(line + ": " + m) + "<br>";
    for (const auto& [dt, m] : d.gemm_method) how += esc(dt + ": " + short_note(m, blas)) + "<br>";
    how += "bandwidth: " + esc(d.bandwidth_method);
    std::string bw = num(d.bandwidth_gbs);
    if (d.copy_gbs > 0) bw += " (copy " + num(d.copy_gbs) + ")", how += "<br>copy: " + esc(d.copy_method);
    for (const auto& n : d.notes)
      if (n != "BLAS: " + blas) how += "<br>" + esc(short_note(n, blas));  // the BLAS is in the header
    h << "<tr><td class=\"t\">" << esc(d.device) << "</td><td class=\"t\">" << esc(d.name) << "</td><td>"
      << (peaks.empty() ? std::string("– (GEMM line used)") : esc(peaks)) << "</td><td>" << esc(gemms) << "</td><td>"
      << esc(bw) << "</td><td class=\"t small\">" << how << "</td></tr>\n";
  }
  h << "</table></div>\n";
  if (doc.contains("roofline_source")) h << "<p class=\"small\">" << esc(gets(doc, "roofline_source")) << "</p>\n";
}

std::string roofline_cell(const json& r) {
  if (is_stale(r))
    return "<td class=\"stale\" title=\"" + esc(gets(r, "roofline_note")) + "\">stale (" + num(100 * stale_fraction(r)) +
           "%)</td>";
  const double frac = getd(r, "roofline_fraction"), gemm = getd(r, "gemm_line_fraction");
  std::string title = gets(r, "roofline_line").empty() ? "" : "against " + gets(r, "roofline_line");
  if (std::isfinite(gemm)) title += (title.empty() ? "" : "; ") + num(100 * gemm) + "% of the BLAS GEMM line";
  return "<td" + (title.empty() ? std::string() : " title=\"" + esc(title) + "\"") + ">" +
         (std::isfinite(frac) ? num(100 * frac) : std::string("–")) + "</td>";
}

// Footnote number of a note (1-based), adding it the first time; 0 for no note.
size_t footnote(std::vector<std::string>& notes, const std::string& note) {
  if (note.empty()) return 0;
  auto it = std::find(notes.begin(), notes.end(), note);
  if (it == notes.end()) it = notes.insert(notes.end(), note);
  return static_cast<size_t>(it - notes.begin()) + 1;
}

std::string spread(const json& r) {
  const double lo = getd(r, "min_ms"), hi = getd(r, "max_ms");
  return std::isfinite(lo) || std::isfinite(hi) ? num(lo) + "–" + num(hi) : "–";
}

// `anchor`: the footnotes' id prefix, unique per report section on a page.
void table_row(std::ostringstream& h, const json& r, size_t i, const std::vector<std::string>& dims, size_t note,
               const std::string& anchor) {
  double extra = getd(r, "extra_host_bytes");
  if (getd(r, "extra_device_bytes") > 0) extra = getd(r, "extra_device_bytes");
  const std::string kind = gets(r, "kind");
  h << "<tr" << (kind == "baseline" || kind == "peer" ? " class=\"" + kind + "\"" : "") << "><td>" << i + 1
    << "</td><td class=\"t\">" << esc(gets(r, "implementation")) << "</td><td class=\"t\">" << esc(gets(r, "mode"))
    << "</td><td class=\"t\">" << esc(gets(r, "shape")) << "</td>";
  for (const auto& d : dims) h << "<td>" << esc(gets(r, d.c_str())) << "</td>";
  h << "<td class=\"t\">" << esc(gets(r, "dtype")) << "</td><td>" << num(getd(r, "median_ms")) << "</td><td>"
    << spread(r) << "</td><td>" << num(getd(r, "first_call_ms"))
    << "</td><td>" << num(getd(r, "gflops")) << "</td><td>" << num(getd(r, "gbs")) << "</td><td>" << num(getd(r, "ai"))
    << "</td>" << roofline_cell(r) << "<td>" << (std::isfinite(extra) ? num(extra / 1048576.0) : "–") << "</td><td>"
    << num(getd(r, "vs_gemm")) << "</td><td>" << num(getd(r, "vs_baseline")) << "</td><td class=\"t\">"
    << (std::isfinite(getd(r, "vs_version")) ? num(getd(r, "vs_version")) + " " + esc(gets(r, "version_base")) : "–")
    << "</td><td class=\"t\">"
    << (note ? "<a href=\"#" + anchor + "note-" + std::to_string(note) + "\">[" + std::to_string(note) + "]</a>" : "")
    << "</td></tr>\n";
}

void rows_section(std::ostringstream& h, const json& doc, const std::string& anchor) {
  const auto& rows = doc["rows"];
  const auto dims = dims_of(doc);
  const std::string blas = blas_of(doc);
  h << "<h2>Rows</h2>\n<div class=\"wrap\"><table>\n<tr><th>#</th><th class=\"t\">implementation</th>"
       "<th class=\"t\">pass</th><th class=\"t\">shape</th>";
  for (const auto& d : dims) h << "<th>" << esc(d) << "</th>";
  h << "<th class=\"t\">dtype</th><th>median ms</th><th>min–max ms</th><th>first ms</th><th>GFLOP/s</th><th>GB/s</th>"
       "<th>flop/B</th><th>% roof</th><th>extra MiB</th><th>× GEMM</th><th>× mat.</th><th class=\"t\">× version</th>"
       "<th class=\"t\">note</th></tr>\n";
  std::vector<std::string> notes;
  for (size_t i = 0; i < rows.size(); ++i)
    table_row(h, rows[i], i, dims, footnote(notes, short_note(gets(rows[i], "note"), blas)), anchor);
  h << "</table></div>\n<ol class=\"notes\">\n";
  for (size_t k = 0; k < notes.size(); ++k)
    h << "<li id=\"" << anchor << "note-" << k + 1 << "\">" << esc(notes[k]) << "</li>\n";
  h << "</ol>\n<p class=\"small\">GFLOP/s counts useful flops (recomputation excluded); GB/s and flop/B use the "
       "minimum bytes (inputs read once, outputs written once). % roof = GFLOP/s over the physical roofline (the "
       "measured FMA peak for f32/f16, the bf16 dot-product peak for bf16 where the CPU has one, the streaming-read "
       "bandwidth; a cell's tooltip names the line and gives the % of the practical BLAS GEMM line). × GEMM = median / the GEMM floor (useful GEMM count × "
       "one BLAS GEMM of the shape); × mat. = median / the materialized BLAS baseline; × version = a version's "
       "median / its base version's (cpu_v2 / cpu) in this run; below 1 is faster. Grey rows are "
       "baselines, blue rows peers (their rates come from this run's cost model for the shape).</p>\n";
}

// What the compiler did (doc["build"], written by `tessera bench`): the SIMD targets and, per
// CUDA kernel, registers, spills, stack, shared and constant memory; flagged spills in red.
void compiler_section(std::ostringstream& h, const json& doc) {
  if (!doc.contains("build") || !doc["build"].is_object()) return;
  const json& b = doc["build"];
  h << "<h2>What the compiler did</h2>\n";
  if (b.contains("simd") && b["simd"].is_object()) {
    const json& s = b["simd"];
    auto list = [&](const char* k) {
      std::string out;
      if (s.contains(k) && s[k].is_array())
        for (const auto& x : s[k]) out += (out.empty() ? "" : ", ") + (x.is_string() ? x.get<std::string>() : x.dump());
      return out.empty() ? std::string("–") : out;
    };
    h << "<p class=\"small\">CPU SIMD (Highway): compiled " << esc(list("compiled")) << "; supported on the bench "
      << "machine " << esc(list("supported")) << "; dispatched there <b>" << esc(gets(s, "dispatched")) << "</b>.</p>\n";
  }
  if (b.contains("cuda_kernels") && b["cuda_kernels"].is_array()) {
    h << "<p class=\"small\">CUDA kernels (" << esc(gets(b, "cuda_compiler")) << ", ptxas resource usage per "
      << "thread):</p>\n<div class=\"wrap\"><table>\n<tr><th class=\"t\">kernel</th><th class=\"t\">source</th>"
         "<th class=\"t\">arch</th><th>registers</th><th>spill st/ld B</th><th>stack B</th><th>shared B</th>"
         "<th>const B</th><th>barriers</th></tr>\n";
    auto n = [](const json& k, const char* key) {  // byte and register counts: integers
      const double v = getd(k, key);
      return std::fabs(v) < 9e15 ? std::to_string(static_cast<long long>(v)) : std::string("–");  // NaN fails too
    };
    for (const auto& k : b["cuda_kernels"]) {
      const bool flagged = k.contains("spill_flagged") && k["spill_flagged"].is_boolean() && k["spill_flagged"].get<bool>();
      h << "<tr><td class=\"t\">" << esc(gets(k, "name")) << "</td><td class=\"t\">" << esc(gets(k, "source"))
        << "</td><td class=\"t\">" << esc(gets(k, "arch")) << "</td><td>" << n(k, "registers") << "</td><td"
        << (flagged ? " class=\"stale\" title=\"spills, not declared CUDA_MAY_SPILL\"" : "") << ">"
        << n(k, "spill_store_bytes") << "/" << n(k, "spill_load_bytes") << (flagged ? " SPILL" : "") << "</td><td>"
        << n(k, "stack_frame_bytes") << "</td><td>" << n(k, "shared_bytes") << "</td><td>" << n(k, "constant_bytes")
        << "</td><td>" << n(k, "barriers") << "</td></tr>\n";
    }
    h << "</table></div>\n";
  } else if (b.contains("cuda_note")) {
    h << "<p class=\"small\">CUDA: " << esc(gets(b, "cuda_note")) << "</p>\n";
  }
}

}  // namespace

namespace {

std::string page(const std::string& title, const std::string& body) {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" << esc(title)
    << "</title>\n<style>\n" << kStyle << "</style></head><body>\n"
    << body << "</body></html>\n";
  return h.str();
}

// One bench document: header, charts, roofline, rows, ceilings, compiler, messages. `anchor`
// prefixes its footnote ids (several documents on one page).
std::string report_body(const json& in, const std::string& anchor = "") {
  const std::string svg = render_roofline_svg(in);  // validates the document
  const json doc = normalize_bench_doc(in);
  std::ostringstream h;
  header_section(h, doc);
  stale_warning(h, doc["rows"]);
  h << "<h2>Which is fastest</h2>\n<p class=\"small\">Per shape, dtype and pass: bars are medians, fastest first "
       "(bold), whiskers the min–max of the samples; beside each, the ratio to the GEMM floor (dashed line: the "
       "useful GEMMs of the pass, timed through the BLAS) and to the materialized baseline (× mat.); below 1 is faster. Faint bars are baselines, dashed outlines peers.</p>\n"
    << render_bar_charts(doc);
  h << "<h2>Roofline</h2>\n" << svg;
  rows_section(h, doc, anchor);
  ceilings_section(h, doc);
  compiler_section(h, doc);
  if (doc.contains("messages") && doc["messages"].is_array() && !doc["messages"].empty()) {
    h << "<h2>Messages</h2>\n<ul>\n";
    for (const auto& m : doc["messages"]) h << "<li>" << esc(m.is_string() ? m.get<std::string>() : m.dump()) << "</li>\n";
    h << "</ul>\n";
  }
  return h.str();
}

}  // namespace

std::string render_report_html(const json& doc) {
  const std::string kernel = gets(doc, "kernel");
  return page("Tessera bench" + (kernel.empty() ? "" : ": " + kernel), report_body(doc));
}

std::string render_reports_html(const std::vector<json>& docs) {
  check(!docs.empty(), ErrorCode::kInvalidArgument, "report: no bench documents");
  if (docs.size() == 1) return render_report_html(docs.front());
  std::ostringstream h;
  h << "<h1>Tessera bench: " << docs.size() << " runs</h1>\n<ul>\n";
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::string grid = docs[i].contains("settings") ? gets(docs[i]["settings"], "grid") : "";
    h << "<li><a href=\"#run" << i << "\">" << esc(gets(docs[i], "kernel")) << "</a>"
      << (grid.empty() ? "" : " (grid " + esc(grid) + ")") << ": "
      << (docs[i].contains("rows") ? docs[i]["rows"].size() : 0) << " rows</li>\n";
  }
  h << "</ul>\n";
  for (size_t i = 0; i < docs.size(); ++i)
    h << "<section id=\"run" << i << "\">\n"
      << report_body(docs[i], "run" + std::to_string(i) + "-") << "</section>\n<hr>\n";
  return page("Tessera bench: " + std::to_string(docs.size()) + " runs", h.str());
}

void write_report(const json& doc, const std::string& path) { write_reports({doc}, path); }

void write_reports(const std::vector<json>& docs, const std::string& path) {
  std::string ext = path.size() >= 4 ? path.substr(path.size() - 4) : "";
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool svg = ext == ".svg";
  check(!svg || docs.size() == 1, ErrorCode::kInvalidArgument,
        "report: an .svg output holds one roofline: give one bench file, or write .html");
  write_text_file(path, svg ? "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + render_roofline_svg(docs.front())
                            : render_reports_html(docs));
}

}  // namespace tessera::harness
