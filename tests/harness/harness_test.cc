// Generic harness pieces: statistics, timing, CSV/JSON tables, grid files, roofline store,
// report rendering.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/text.h"
#include "harness/grid.h"
#include "harness/report.h"
#include "harness/roofline.h"
#include "harness/stats.h"
#include "harness/table.h"
#include "harness/timer.h"
#include "tessera/error.h"

namespace tessera::harness {
namespace {

std::string temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("tessera_harness_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

TEST(Stats, MedianQuartilesMinMax) {
  const Stats s = summarize({5, 1, 3, 2, 4});
  EXPECT_EQ(s.n, 5u);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 5);
  EXPECT_DOUBLE_EQ(s.median, 3);
  EXPECT_DOUBLE_EQ(s.q1, 2);
  EXPECT_DOUBLE_EQ(s.q3, 4);
  EXPECT_DOUBLE_EQ(s.mean, 3);
  EXPECT_DOUBLE_EQ(summarize({1, 2, 3, 4}).median, 2.5);
  EXPECT_EQ(summarize({}).n, 0u);
}

TEST(Timer, FirstCallApartAndRepeats) {
  int calls = 0, before = 0, after = 0;
  TimingOptions opt;
  opt.warmup = 1;
  opt.repeats = 5;
  opt.before_first = [&] { ++before; };
  opt.after_first = [&] {
    ++after;
    EXPECT_EQ(calls, 1);  // right after the first call, before warm-up
  };
  const Timing t = measure([&] { ++calls; }, opt);
  EXPECT_EQ(calls, 1 + 1 + 5);
  EXPECT_EQ(t.samples_s.size(), 5u);
  EXPECT_EQ(before, 1);
  EXPECT_EQ(after, 1);
  EXPECT_GE(t.first_call_s, 0.0);
  EXPECT_LE(t.stats.min, t.stats.median);
  EXPECT_LE(t.stats.median, t.stats.max);
}

TEST(Timer, BudgetStopsAfterMinRepeats) {
  TimingOptions opt;
  opt.repeats = 100;
  opt.min_repeats = 3;
  opt.max_seconds = 0.0;  // spent at once: only the minimum
  const Timing t = measure([] {}, opt);
  EXPECT_EQ(t.samples_s.size(), 3u);
}

TEST(Table, CsvRoundTrip) {
  std::vector<Row> rows = {
      {{"name", "plain"}, {"n", 3}, {"x", 0.1}, {"ok", true}, {"none", nullptr}},
      {{"name", "has, comma and \"quotes\""}, {"n", -7}, {"x", 1.0 / 3.0}, {"ok", false}, {"none", nullptr}},
      {{"name", "line\nbreak"}, {"n", 123456789012LL}, {"x", 6.02e23}, {"ok", true}, {"extra", "only here"}},
  };
  const std::string path = temp_path("rows.csv");
  write_csv_file(path, rows);
  const auto back = read_csv_file(path);
  ASSERT_EQ(back.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    for (auto it = rows[i].begin(); it != rows[i].end(); ++it) {
      ASSERT_TRUE(back[i].contains(it.key())) << it.key();
      if (it->is_number_float())
        EXPECT_DOUBLE_EQ(back[i][it.key()].get<double>(), it->get<double>()) << it.key();
      else
        EXPECT_EQ(back[i][it.key()], *it) << it.key();
    }
  }
  // A column absent from a row reads back as null.
  EXPECT_TRUE(back[0]["extra"].is_null());
  // Columns: the union of the rows' keys; an explicit order is kept.
  EXPECT_EQ(table_columns(rows).size(), 6u);
  EXPECT_EQ(to_csv(rows, {"x", "name"}).substr(0, 7), "x,name\n");
}

TEST(Table, CsvRejectsRaggedRecords) {
  EXPECT_THROW(parse_csv("a,b\n1,2,3\n"), Error);
  EXPECT_THROW(parse_csv("a,b\n\"open,2\n"), Error);
}

TEST(Table, JsonRoundTrip) {
  nlohmann::json doc = {{"rows", {{{"a", 1.5}, {"b", "x"}}}}, {"k", "v"}};
  const std::string path = temp_path("doc.json");
  write_json_file(path, doc);
  EXPECT_EQ(read_json_file(path), doc);
  EXPECT_THROW(read_json_file(temp_path("does_not_exist.json")), Error);
}

// A corrupt JSON file (here a .npy passed by mistake) is quoted escaped, never as raw bytes.
TEST(Table, JsonErrorsQuoteCorruptBytesEscaped) {
  const std::string path = temp_path("corrupt.json");
  write_text_file(path, "\x93NUMPY\x01\x00{'descr'");
  try {
    read_json_file(path);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(text::printable(msg), msg);  // nothing left to escape: valid UTF-8, no controls
    EXPECT_NE(msg.find("\\x93"), std::string::npos) << msg;
  }
}

TEST(Grid, ParsesAndValidates) {
  const auto j = nlohmann::json::parse(R"({
    "kernel": "k", "dims": ["B", "H"],
    "grids": {"g": {"description": "d", "dtypes": ["f32", "bf16"],
                    "shapes": [{"name": "s1", "B": 2, "H": 3, "model": "m"}, {"B": 4, "H": 5}]}}})");
  const GridFile f = parse_grid_file(j);
  ASSERT_EQ(f.grids.size(), 1u);
  const Grid& g = f.grid("g");
  EXPECT_EQ(g.dtypes, (std::vector<std::string>{"f32", "bf16"}));
  ASSERT_EQ(g.shapes.size(), 2u);
  EXPECT_EQ(g.shapes[0].name, "s1");
  EXPECT_EQ(g.shapes[0].dim("H"), 3);
  EXPECT_EQ(g.shapes[0].extra.at("model"), "m");
  EXPECT_EQ(g.shapes[1].name, "B=4,H=5");  // unnamed shapes are named by their dims
  EXPECT_THROW(f.grid("nope"), Error);

  auto bad = j;
  bad["grids"]["g"]["shapes"][0].erase("H");
  EXPECT_THROW(parse_grid_file(bad), Error);
  bad = j;
  bad["grids"]["g"]["shapes"][0]["B"] = 0;
  EXPECT_THROW(parse_grid_file(bad), Error);
  bad = j;
  bad.erase("dims");
  EXPECT_THROW(parse_grid_file(bad), Error);
}

TEST(Grid, RepositoryGridFile) {
  const std::string path = find_grid_file("linear_cross_entropy", TESSERA_TEST_SOURCE_DIR "/bench/linear_cross_entropy.json");
  const GridFile f = load_grid_file(path);
  EXPECT_EQ(f.kernel, "linear_cross_entropy");
  EXPECT_EQ(f.dims, (std::vector<std::string>{"B", "H", "V"}));
  auto has = [&](const std::string& grid, int64_t B, int64_t H, int64_t V) {
    for (const auto& s : f.grid(grid).shapes)
      if (s.dim("B") == B && s.dim("H") == H && s.dim("V") == V) return true;
    return false;
  };
  EXPECT_TRUE(has("cpu", 2048, 1024, 32768));
  EXPECT_TRUE(has("cpu", 2048, 1024, 131072));
  EXPECT_TRUE(has("llm", 8192, 4096, 128256));
  EXPECT_TRUE(has("llm", 8192, 2304, 256000));
  EXPECT_FALSE(f.grid("smoke").shapes.empty());
  EXPECT_THROW(find_grid_file("no_such_kernel", "/nonexistent/file.json"), Error);
}

TEST(Roofline, BoundAndDtypeFallback) {
  DeviceCeilings d;
  d.device = "cpu";
  d.gemm_gflops = {{"f32", 100.0}};
  d.bandwidth_gbs = 20.0;
  EXPECT_DOUBLE_EQ(d.attainable_gflops(1.0, "f32"), 20.0);    // memory bound
  EXPECT_DOUBLE_EQ(d.attainable_gflops(50.0, "f32"), 100.0);  // compute bound
  std::string note;
  EXPECT_DOUBLE_EQ(d.peak_gflops("bf16", &note), 100.0);  // no bf16 ceiling: f32's
  EXPECT_NE(note.find("f32"), std::string::npos);
}

TEST(Roofline, StoreRoundTripAndCorruptFile) {
  Roofline r;
  r.measured_at = "2025-01-01T00:00:00Z";
  DeviceCeilings d;
  d.device = "cpu";
  d.name = "test cpu";
  d.gemm_gflops = {{"f32", 123.5}};
  d.gemm_method = {{"f32", "m"}, {"bf16", "no BLAS ceiling"}};
  d.bandwidth_gbs = 17.25;
  r.devices.push_back(d);
  const std::string path = temp_path("sub/dir/roofline.json");
  save_roofline(r, path);
  const auto back = load_roofline(path);
  ASSERT_TRUE(back.has_value());
  ASSERT_NE(back->find("cpu"), nullptr);
  EXPECT_DOUBLE_EQ(back->find("cpu")->gemm_gflops.at("f32"), 123.5);
  EXPECT_DOUBLE_EQ(back->find("cpu")->bandwidth_gbs, 17.25);
  EXPECT_EQ(back->find("cuda:0"), nullptr);
  EXPECT_FALSE(load_roofline(temp_path("missing.json")).has_value());
  const std::string bad = temp_path("corrupt.json");
  std::ofstream(bad) << "{\"schema\": \"something-else\"}";
  EXPECT_THROW(load_roofline(bad), Error);
}

// Numbers of <circle>/<rect> centres in the points group.
std::vector<std::pair<double, double>> point_centres(const std::string& svg) {
  std::vector<std::pair<double, double>> out;
  std::regex circle(R"re(<circle cx="([0-9.]+)" cy="([0-9.]+)" r="5\.5")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), circle); it != std::sregex_iterator(); ++it)
    out.emplace_back(std::stod((*it)[1]), std::stod((*it)[2]));
  std::regex rect(R"re(<rect x="([0-9.]+)" y="([0-9.]+)" width="10")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), rect); it != std::sregex_iterator(); ++it)
    out.emplace_back(std::stod((*it)[1]) + 5, std::stod((*it)[2]) + 5);
  return out;
}

TEST(Report, RendersFixture) {
  const auto doc = read_json_file(TESSERA_TEST_SOURCE_DIR "/tests/fixtures/bench_report.json");
  const size_t nrows = doc["rows"].size();
  ASSERT_GE(nrows, 3u);
  const std::string svg = render_roofline_svg(doc);
  // Ceilings from the measured peaks: one bandwidth line and one compute line per dtype.
  EXPECT_EQ(count(svg, "class=\"ceiling ceiling-memory\""), 1u);
  EXPECT_EQ(count(svg, "class=\"ceiling ceiling-compute\""),
            doc["roofline"]["devices"][0]["gemm_gflops"].size());
  const double peak = doc["roofline"]["devices"][0]["gemm_gflops"]["f32"].get<double>();
  char peak_txt[64];
  std::snprintf(peak_txt, sizeof peak_txt, "GEMM peak %.1f GFLOP/s", peak);
  EXPECT_NE(svg.find(peak_txt), std::string::npos) << peak_txt;
  // One labelled point per row, inside the plot, not all on top of each other.
  EXPECT_EQ(count(svg, "<g class=\"point\""), nrows);
  const auto pts = point_centres(svg);
  ASSERT_EQ(pts.size(), nrows);
  double minx = 1e9, maxx = -1e9, miny = 1e9, maxy = -1e9;
  for (const auto& [x, y] : pts) {
    EXPECT_GE(x, 80.0);
    EXPECT_LE(x, 960.0 - 250.0);
    EXPECT_GE(y, 40.0);
    EXPECT_LE(y, 600.0 - 60.0);
    minx = std::min(minx, x), maxx = std::max(maxx, x), miny = std::min(miny, y), maxy = std::max(maxy, y);
  }
  EXPECT_GT(maxx - minx, 10.0);
  EXPECT_GT(maxy - miny, 10.0);
  for (size_t i = 1; i <= nrows; ++i)
    EXPECT_NE(svg.find("data-row=\"" + std::to_string(i) + "\""), std::string::npos) << i;

  const std::string html = render_report_html(doc);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);  // self-contained, no JS
  EXPECT_EQ(html.find("https://"), std::string::npos);  // nothing fetched from the network
  // The table has every row with its numbers.
  EXPECT_EQ(count(html, "<tr><td>") + count(html, "<tr class=\"baseline\"><td>"), nrows);
  for (const auto& r : doc["rows"]) {
    EXPECT_NE(html.find(">" + r["implementation"].get<std::string>() + "<"), std::string::npos);
    const double med = r["median_ms"].get<double>();
    char buf[32];
    if (med >= 100) std::snprintf(buf, sizeof buf, "%.0f", med);
    else if (med >= 10) std::snprintf(buf, sizeof buf, "%.1f", med);
    else if (med >= 1) std::snprintf(buf, sizeof buf, "%.2f", med);
    else std::snprintf(buf, sizeof buf, "%.3g", med);
    EXPECT_NE(html.find("<td>" + std::string(buf) + "</td>"), std::string::npos) << buf;
  }

  // Writing: .svg gives the chart alone, .html the page.
  const std::string svg_path = temp_path("r.svg"), html_path = temp_path("r.html");
  write_report(doc, svg_path);
  write_report(doc, html_path);
  EXPECT_EQ(read_text_file(svg_path).rfind("<?xml", 0), 0u);
  EXPECT_EQ(read_text_file(html_path).rfind("<!DOCTYPE html>", 0), 0u);
}

TEST(Report, EmptyChartSaysSo) {
  nlohmann::json doc = {{"rows", nlohmann::json::array()}};
  const std::string svg = render_roofline_svg(doc);
  EXPECT_EQ(count(svg, "<g class=\"point\""), 0u);
  EXPECT_NE(svg.find("no rows"), std::string::npos);
  EXPECT_THROW(render_roofline_svg(nlohmann::json::object()), Error);
}

}  // namespace
}  // namespace tessera::harness
