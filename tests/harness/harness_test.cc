// Generic harness pieces: statistics, timing, CSV/JSON tables, grid files, roofline store,
// (report rendering: report_test.cc).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/text.h"
#include "harness/grid.h"
#include "harness/parity.h"
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

// The parity comparison every kernel's check grid uses: a non-finite expected value is matched
// only by the same value, and an expected −inf does not widen the tolerance of the others.
TEST(ParityCompare, NonFiniteExpectedValuesAreMatchedExactly) {
  const Tolerance tol{1e-5, 1e-5};
  const double inf = INFINITY, nan = NAN;
  EXPECT_EQ(compare({1.0, -inf, nan}, {1.0, -inf, nan}, tol).violations, 0);
  EXPECT_EQ(compare({1.0, 0.0}, {1.0, -inf}, tol).violations, 1);   // finite where −inf was expected
  EXPECT_EQ(compare({1.0, 2.0}, {1.0, nan}, tol).violations, 1);    // a NaN in the reference fails
  EXPECT_EQ(compare({1.0, inf}, {1.0, -inf}, tol).violations, 1);
  const Deviation d = compare({1.5, -inf}, {1.0, -inf}, tol);       // −inf does not make atol infinite
  EXPECT_EQ(d.violations, 1);
  EXPECT_DOUBLE_EQ(d.ref_scale, 1.0);
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

}  // namespace
}  // namespace tessera::harness
