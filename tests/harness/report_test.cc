// The bench report: dims come from the document, a bar chart per shape/dtype/pass with every
// implementation, stale ceilings flagged, old-schema files still rendered, peers merged, point
// labels that never overlap.
#include "harness/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "harness/table.h"
#include "tessera/error.h"

namespace tessera::harness {
namespace {

using nlohmann::json;

std::string temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("tessera_report_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

json fixture() { return read_json_file(TESSERA_TEST_SOURCE_DIR "/tests/fixtures/bench_report.json"); }

// The bar chart SVGs of a page, each as text.
std::vector<std::string> bar_charts(const std::string& html) {
  std::vector<std::string> out;
  for (size_t p = html.find("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"bars\""); p != std::string::npos;
       p = html.find("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"bars\"", p + 1))
    out.push_back(html.substr(p, html.find("</svg>", p) - p));
  return out;
}

struct Box {
  double x0, y0, x1, y1;
};
std::vector<Box> label_boxes(const std::string& svg) {
  std::vector<Box> out;
  std::regex re(R"re(class="label" data-box="([-0-9.]+) ([-0-9.]+) ([-0-9.]+) ([-0-9.]+)")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back({std::stod((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4])});
  return out;
}

void expect_no_overlap(const std::vector<Box>& b) {
  for (size_t i = 0; i < b.size(); ++i)
    for (size_t j = i + 1; j < b.size(); ++j)
      EXPECT_FALSE(b[i].x0 < b[j].x1 && b[j].x0 < b[i].x1 && b[i].y0 < b[j].y1 && b[j].y0 < b[i].y1)
          << "labels " << i << " and " << j << " overlap";
}

// A made-up attention-like kernel: dims B, S, H, D; one shape, two implementations, a baseline.
json attention_doc() {
  json rows = json::array();
  auto row = [](const char* impl, const char* kind, const char* mode, double ms) {
    return json{{"kind", kind}, {"implementation", impl}, {"mode", mode}, {"shape", "s128"}, {"B", 2}, {"S", 128},
                {"H", 4}, {"D", 64}, {"dtype", "bf16"}, {"median_ms", ms}, {"min_ms", ms * 0.9},
                {"max_ms", ms * 1.2}, {"ai", 10.0}, {"gflops", 100.0 / ms}, {"device", "cpu"}};
  };
  rows.push_back(row("flash", "kernel", "forward", 1.0));
  rows.push_back(row("naive", "kernel", "forward", 3.0));
  rows.push_back(row("blas-materialized", "baseline", "forward", 2.0));
  rows[0]["vs_gemm"] = 2.0, rows[0]["vs_baseline"] = 0.5, rows[0]["gemm_count"] = 2;
  return {{"schema", "tessera-bench/2"}, {"kernel", "attention"}, {"dims", {"B", "S", "H", "D"}}, {"rows", rows}};
}

// Ceilings of schema /2: the physical peaks are the roof (solid lines), the BLAS GEMM rates the
// practical line (its own class, lighter); the ceilings table shows both and the copy bandwidth.
TEST(Report, DrawsPhysicalPeaksAndTheGemmLine) {
  json doc = fixture();
  auto& dev = doc["roofline"]["devices"][0];
  dev["peak_gflops"] = {{"f32_fma_avx512", 232.8}, {"f32_fma_avx2", 230.0}, {"bf16_dot_avx512", 467.9}};
  dev["peak_method"] = {{"f32_fma_avx512", "vfmadd231ps zmm"}, {"bf16_dot_avx512", "vdpbf16ps zmm"}};
  dev["copy_gbs"] = 22.8;
  dev["copy_method"] = "memcpy of 256 MiB";
  const std::string svg = render_roofline_svg(doc);
  EXPECT_EQ(count(svg, "class=\"ceiling ceiling-peak\""), 2u);  // the roofs only: avx2's 230 is not one
  EXPECT_EQ(svg.find("f32_fma_avx2 peak"), std::string::npos);
  // Ceiling labels stack: no two closer than a line of text.
  std::vector<double> ys;
  const std::regex label("class=\"ceiling-label\" x=\"[^\"]*\" y=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), label); it != std::sregex_iterator(); ++it)
    ys.push_back(std::stod((*it)[1]));
  ASSERT_EQ(ys.size(), 2u + dev["gemm_gflops"].size());
  std::sort(ys.begin(), ys.end());
  for (size_t i = 1; i < ys.size(); ++i) EXPECT_GE(ys[i] - ys[i - 1], 13.9) << i;
  EXPECT_EQ(count(svg, "class=\"ceiling ceiling-compute\""), dev["gemm_gflops"].size());
  EXPECT_NE(svg.find("cpu bf16_dot_avx512 peak 468 GFLOP/s"), std::string::npos);
  EXPECT_NE(svg.find("data-line=\"f32_fma_avx512\""), std::string::npos);
  const std::string html = render_report_html(doc);
  EXPECT_NE(html.find("peak GFLOP/s (the roof)"), std::string::npos);
  EXPECT_NE(html.find("bf16_dot_avx512 468, f32_fma_avx2 230, f32_fma_avx512 233"), std::string::npos);  // the table lists every line
  EXPECT_NE(html.find("(copy 22.8)"), std::string::npos);
  EXPECT_NE(html.find("vdpbf16ps zmm"), std::string::npos);
}

TEST(Report, RendersOldSchemaFixture) {
  const json doc = fixture();
  ASSERT_EQ(doc["schema"], "tessera-bench/1");
  ASSERT_FALSE(doc.contains("dims"));
  const size_t nrows = doc["rows"].size();
  const std::string svg = render_roofline_svg(doc);
  EXPECT_EQ(count(svg, "class=\"ceiling ceiling-memory\""), 1u);
  EXPECT_EQ(count(svg, "class=\"ceiling ceiling-compute\""), doc["roofline"]["devices"][0]["gemm_gflops"].size());
  char peak_txt[64];
  std::snprintf(peak_txt, sizeof peak_txt, "f32 GEMM (BLAS) %.1f GFLOP/s",
                doc["roofline"]["devices"][0]["gemm_gflops"]["f32"].get<double>());
  EXPECT_NE(svg.find(peak_txt), std::string::npos) << peak_txt;
  EXPECT_EQ(count(svg, "<g class=\"point\" ") + count(svg, "<g class=\"point stale\" "), nrows);  // one per row
  for (size_t i = 1; i <= nrows; ++i) EXPECT_NE(svg.find("data-row=\"" + std::to_string(i) + "\""), std::string::npos);

  const std::string html = render_report_html(doc);
  EXPECT_EQ(html.find("<script"), std::string::npos);   // self-contained, no JS
  EXPECT_EQ(html.find("https://"), std::string::npos);  // nothing fetched from the network
  EXPECT_NE(html.find("<b>dims</b>: B, H, V"), std::string::npos);  // missing dims: B/H/V from the rows
  EXPECT_NE(html.find("<th>B</th><th>H</th><th>V</th>"), std::string::npos);
  EXPECT_EQ(html.find(" · fwd<"), std::string::npos);  // old mode names mapped
  EXPECT_NE(html.find("small · B=64 H=64 V=512 · f32 · forward"), std::string::npos);
  EXPECT_EQ(count(html, "<tr><td>") + count(html, "<tr class=\"baseline\"><td>"), nrows);
  // The BLAS is described once (the header), not in every row's note.
  const std::string blas = doc["machine"]["blas"];
  EXPECT_EQ(count(html, blas), 1u);
}

TEST(Report, BarsPerShapeAndPassWithEveryImplementation) {
  const json doc = normalize_bench_doc(fixture());
  std::map<std::string, std::set<std::string>> groups;  // "shape|dtype|mode" -> implementations
  for (const auto& r : doc["rows"])
    if (r["mode"] != "gemm")
      groups[r["shape"].get<std::string>() + "|" + r["dtype"].get<std::string>() + "|" + r["mode"].get<std::string>()]
          .insert(r["implementation"].get<std::string>());
  const auto charts = bar_charts(render_report_html(doc));
  ASSERT_EQ(charts.size(), groups.size());
  for (const auto& c : charts) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(c, m, std::regex(R"re(class="title"[^>]*>([^ ]+) · [^<]* · ([a-z0-9]+) · ([a-z]+)<)re")));
    const auto& impls = groups.at(std::string(m[1]) + "|" + std::string(m[2]) + "|" + std::string(m[3]));
    EXPECT_EQ(count(c, "<g class=\"bar "), impls.size());
    for (const auto& impl : impls) EXPECT_NE(c.find("data-implementation=\"" + impl + "\""), std::string::npos);
    EXPECT_EQ(count(c, "class=\"spread\""), impls.size());  // min–max whisker on every bar
    EXPECT_NE(c.find("class=\"gemm-floor\""), std::string::npos);
    EXPECT_NE(c.find("× GEMM"), std::string::npos);
    EXPECT_NE(c.find("× mat."), std::string::npos);
  }
}

TEST(Report, VersionRatiosAndWhatTheCompilerDid) {
  json doc = fixture();
  ASSERT_FALSE(doc["rows"].empty());
  doc["rows"][0]["version_base"] = "cpu";
  doc["rows"][0]["vs_version"] = 0.5;
  doc["build"] = {{"simd", {{"compiled", {"AVX3", "AVX2"}}, {"supported", {"AVX2"}}, {"dispatched", "AVX2"}}},
                  {"cuda_compiler", "nvcc 13.0"},
                  {"cuda_kernels",
                   {{{"name", "row_kernel<float>(Params)"}, {"source", "src/kernels/k/cuda.cu"}, {"arch", "sm_90a"},
                     {"registers", 40}, {"spill_store_bytes", 0}, {"spill_load_bytes", 0}, {"shared_bytes", 324},
                     {"spill_flagged", false}},
                    {{"name", "spilly<float>(Params)"}, {"source", "src/kernels/k/cuda.cu"}, {"arch", "sm_90a"},
                     {"registers", 255}, {"spill_store_bytes", 64}, {"spill_load_bytes", 48}, {"shared_bytes", 0},
                     {"spill_flagged", true}}}}};
  const std::string html = render_report_html(doc);
  EXPECT_NE(html.find("× version"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"t\">0.5 cpu</td>"), std::string::npos);
  EXPECT_NE(html.find("What the compiler did"), std::string::npos);
  EXPECT_NE(html.find("dispatched there <b>AVX2</b>"), std::string::npos);
  EXPECT_NE(html.find("row_kernel&lt;float&gt;(Params)"), std::string::npos);  // escaped
  EXPECT_EQ(count(html, " SPILL</td>"), 1u);                                    // only the flagged one
  EXPECT_NE(html.find("class=\"stale\" title=\"spills, not declared CUDA_MAY_SPILL\">64/48 SPILL"), std::string::npos);
  // Without "build" (older files) there is no such section.
  doc.erase("build");
  EXPECT_EQ(render_report_html(doc).find("What the compiler did"), std::string::npos);
}

TEST(Report, DimsComeFromTheDocument) {
  const std::string html = render_report_html(attention_doc());
  EXPECT_NE(html.find("<th>B</th><th>S</th><th>H</th><th>D</th>"), std::string::npos);
  EXPECT_EQ(html.find("<th>V</th>"), std::string::npos);
  EXPECT_EQ(html.find("V="), std::string::npos);
  const auto charts = bar_charts(html);
  ASSERT_EQ(charts.size(), 1u);
  EXPECT_NE(charts[0].find("s128 · B=2 S=128 H=4 D=64 · bf16 · forward"), std::string::npos);
  // Fastest first, with the ratios derived from the row that carries them.
  EXPECT_LT(charts[0].find("data-implementation=\"flash\""), charts[0].find("data-implementation=\"naive\""));
  EXPECT_NE(charts[0].find("3.00 ms · 6.00× GEMM · 1.50× mat."), std::string::npos);
}

TEST(Report, StaleCeilingsFlagged) {
  json doc = attention_doc();
  doc["rows"][0]["roofline_stale"] = true;
  doc["rows"][0]["roofline_fraction"] = nullptr;
  doc["rows"][0]["roofline_measured_fraction"] = 1.48;
  doc["rows"][1]["roofline_fraction"] = 1.2;  // an old file's fraction above 100 %: stale too
  doc["rows"][2]["roofline_fraction"] = 0.5;
  const std::string html = render_report_html(doc);
  EXPECT_NE(html.find(">stale (148%)<"), std::string::npos);
  EXPECT_NE(html.find(">stale (120%)<"), std::string::npos);
  EXPECT_NE(html.find("<td>50.0</td>"), std::string::npos);
  EXPECT_NE(html.find("class=\"warn\""), std::string::npos);
  EXPECT_NE(html.find("<code>tessera roofline</code>"), std::string::npos);
  const std::string svg = render_roofline_svg(doc);
  EXPECT_EQ(count(svg, "class=\"point stale\""), 2u);
  EXPECT_NE(svg.find("stale ceilings"), std::string::npos);  // legend
  // No warning when nothing is stale.
  EXPECT_EQ(render_report_html(attention_doc()).find("class=\"warn\""), std::string::npos);
}

TEST(Report, PeersMergedIntoTheirShapesBars) {
  json doc = fixture();
  const json peers = {{"schema", "tessera-peers/1"},
                      {"kernel", "linear_cross_entropy"},
                      {"source", "PyTorch eager"},
                      {"device", "cpu"},
                      {"rows",
                       {{{"implementation", "torch-eager"}, {"mode", "fused"}, {"B", 64}, {"H", 64}, {"V", 512},
                         {"dtype", "f32"}, {"median_ms", 10.0}, {"min_ms", 9.0}, {"max_ms", 12.0}}}}};
  const size_t before = doc["rows"].size();
  merge_peer_results(doc, peers, "peers.json");
  ASSERT_EQ(doc["rows"].size(), before + 1);
  const json& p = doc["rows"].back();
  EXPECT_EQ(p["kind"], "peer");
  EXPECT_EQ(p["shape"], "small");  // joined to the bench's shape with the same dims
  EXPECT_GT(p["vs_gemm"].get<double>(), 0);
  EXPECT_GT(p["gflops"].get<double>(), 0);
  const std::string html = render_report_html(doc);
  EXPECT_NE(html.find("Peer results merged from <code>peers.json</code>"), std::string::npos);
  EXPECT_NE(html.find("<tr class=\"peer\">"), std::string::npos);
  for (const auto& c : bar_charts(html))
    EXPECT_EQ(c.find("torch-eager (peer)") != std::string::npos, c.find("small · B=64 H=64 V=512 · f32 · fused") != std::string::npos);
  EXPECT_EQ(count(render_roofline_svg(doc), "<polygon class=\"marker\""), 1u);  // a diamond
}

TEST(Report, MalformedPeersRejectedAndDocUntouched) {
  const json doc = fixture();
  const json good_row = {{"implementation", "jax"}, {"mode", "forward"}, {"B", 8}, {"H", 16}, {"V", 64},
                         {"dtype", "f32"}, {"median_ms", 1.0}};
  auto with = [&](const char* key, const json& value) {
    json r = good_row;
    if (value.is_null()) r.erase(key); else r[key] = value;
    return json{{"schema", "tessera-peers/1"}, {"rows", {r}}};
  };
  for (const json& bad : {json{{"rows", json::array()}}, with("median_ms", nullptr), with("median_ms", -1),
                          with("V", nullptr), with("mode", 3),
                          json{{"schema", "tessera-peers/1"}, {"kernel", "attention"}, {"rows", json::array()}}}) {
    json d = doc;
    EXPECT_THROW(merge_peer_results(d, bad, "bad.json"), Error) << bad.dump();
    EXPECT_EQ(d, doc);  // untouched, not even normalized
  }
  json d = doc;
  EXPECT_NO_THROW(merge_peer_results(d, with("note", "fine"), "ok.json"));
}

TEST(Report, RooflineLabelsNeverOverlap) {
  expect_no_overlap(label_boxes(render_roofline_svg(fixture())));
  // A crowded chart: 40 points on a small patch; labels are placed apart or listed.
  json doc = attention_doc();
  doc["rows"] = json::array();
  for (int i = 0; i < 40; ++i)
    doc["rows"].push_back({{"kind", "kernel"}, {"implementation", "impl" + std::to_string(i % 5)}, {"mode", "forward"},
                           {"B", i}, {"S", 1}, {"H", 1}, {"D", 1}, {"dtype", "f32"}, {"median_ms", 1.0},
                           {"ai", 10.0 + 0.4 * i}, {"gflops", 50.0 + (i % 7) * 2.0}});
  const std::string svg = render_roofline_svg(doc);
  const auto boxes = label_boxes(svg);
  expect_no_overlap(boxes);
  // Every row is named once: in a label (a cluster of coincident points shares one) or listed.
  std::set<int> named;
  std::regex text(R"re(class="label" data-box="[^"]*" x="[^"]*" y="[^"]*" font-size="11">([0-9,]+)<)re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), text); it != std::sregex_iterator(); ++it) {
    const std::string t = (*it)[1];
    for (size_t p = 0; p < t.size(); p = t.find(',', p) == std::string::npos ? t.size() : t.find(',', p) + 1)
      EXPECT_TRUE(named.insert(std::stoi(t.substr(p))).second);
  }
  EXPECT_TRUE(named.size() == 40u || svg.find("crowded, not labelled") != std::string::npos) << named.size();
}

TEST(Report, WritesHtmlOrSvgAndRejectsNonBenchFiles) {
  const std::string svg_path = temp_path("r.svg"), html_path = temp_path("r.html");
  write_report(fixture(), svg_path);
  write_report(fixture(), html_path);
  EXPECT_EQ(read_text_file(svg_path).rfind("<?xml", 0), 0u);
  EXPECT_EQ(read_text_file(html_path).rfind("<!DOCTYPE html>", 0), 0u);
  const json empty = {{"rows", json::array()}};
  EXPECT_NE(render_roofline_svg(empty).find("no rows"), std::string::npos);
  EXPECT_THROW(render_roofline_svg(json::object()), Error);
}

// PNG width from the IHDR chunk (bytes 16..19, big-endian), 0 when not a PNG.
uint32_t png_width(const std::string& path) {
  const std::string b = read_text_file(path);
  if (b.size() < 24 || b.compare(1, 3, "PNG") != 0) return 0;
  uint32_t w = 0;
  for (int i = 16; i < 20; ++i) w = (w << 8) | static_cast<unsigned char>(b[static_cast<size_t>(i)]);
  return w;
}

// In a real browser: scripts/render_report.sh renders the page at both widths. Skipped where
// Debian's chromium is not installed (the suite never needs it).
TEST(Report, RendersInHeadlessChromium) {
  if (std::system("command -v chromium >/dev/null 2>&1") != 0) GTEST_SKIP() << "chromium not installed";
  const std::string html = temp_path("browser.html"), prefix = temp_path("browser");
  write_report(fixture(), html);
  const std::string cmd = "HEIGHT=3000 timeout 120 " TESSERA_TEST_SOURCE_DIR "/scripts/render_report.sh " + html + " " + prefix +
                          " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_EQ(png_width(prefix + "-1440.png"), 1440u);
  EXPECT_EQ(png_width(prefix + "-1024.png"), 1024u);
}

}  // namespace
}  // namespace tessera::harness
