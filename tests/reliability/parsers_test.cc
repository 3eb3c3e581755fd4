// Regression tests for what fuzzing (tests/fuzz, scripts/fuzz.sh) and review found in the
// readers of outside data: each bad input gives a tessera::Error that says what is wrong, never
// another exception, an overflow, an allocation of the declared size or a hang.
// The raw inputs are also replayed by ctest (fuzz_replay.<target>).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "harness/grid.h"
#include "harness/npy.h"
#include "harness/report.h"
#include "harness/roofline.h"
#include "reliability/test_util.h"
#include "tessera/error.h"
#include "tune/autotune.h"
#include "tune/cache.h"

namespace tessera {
namespace {

using reliability::TempDir;

std::string npy_bytes(const std::string& descr, const std::string& shape, const std::string& data) {
  std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  return out + h + data;
}

Error npy_error(const std::string& bytes) {
  std::istringstream in(bytes, std::ios::binary);
  try {
    npy::read(in, "t.npy");
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return Error(ErrorCode::kInternal, "");
}

TEST(NpyReliability, ValidFileStillLoads) {
  float v[3] = {1, 2, 3};
  std::istringstream in(npy_bytes("<f4", "(3,)", std::string(reinterpret_cast<char*>(v), 12)), std::ios::binary);
  const Tensor t = npy::read(in, "t.npy");
  EXPECT_EQ(t.shape(), (Shape{3}));
  EXPECT_EQ(t.data_as<float>()[2], 3.0f);
}

// Found by tessera_fuzz_npy (signed overflow in contiguous_strides under UBSan): a zero dim
// makes the element count 0, but the strides of the other dims still overflowed int64.
TEST(NpyReliability, ZeroDimWithHugeOtherDimsIsAnError) {
  const Error e = npy_error(npy_bytes("<f4", "(0, 4611686018427387904, 4611686018427387904)", ""));
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("t.npy"), std::string::npos) << e.what();
}

// A header that declares far more data than the file holds fails with the declared size
// before anything is allocated (the old reader allocated the declared size first).
TEST(NpyReliability, HugeDeclaredSizeFailsBeforeAllocating) {
  const Error e = npy_error(npy_bytes("<f4", "(1099511627776, 1048576)", ""));
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  const std::string m = e.what();
  EXPECT_NE(m.find("truncated data"), std::string::npos) << m;
  EXPECT_NE(m.find("4611686018427387904 bytes"), std::string::npos) << m;  // 2^40 · 2^20 · 4
}

TEST(NpyReliability, ByteCountOverflowIsAnError) {
  const Error e = npy_error(npy_bytes("<i8", "(4611686018427387904, 4)", ""));
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
}

// std::stoll threw std::out_of_range (not a tessera::Error) for a dimension past int64.
TEST(NpyReliability, DimensionPastInt64IsAnError) {
  const Error e = npy_error(npy_bytes("<f4", "(99999999999999999999,)", ""));
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("too large"), std::string::npos) << e.what();
}

TEST(NpyReliability, TruncatedDataNamesBothSizes) {
  const Error e = npy_error(npy_bytes("<f4", "(4, 4)", std::string(12, '\0')));
  const std::string m = e.what();
  EXPECT_NE(m.find("needs 64 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("has 12"), std::string::npos) << m;
}

// Found by tessera_fuzz_grid: a non-string "name" or "description" escaped as
// nlohmann::json::type_error (std::terminate in the CLI's callback path).
TEST(GridReliability, NonStringFieldsAreErrors) {
  auto j = nlohmann::json::parse(R"({"kernel":"k","dims":["B"],"grids":{"g":{"shapes":[{"name":5,"B":1}]}}})");
  EXPECT_THROW(harness::parse_grid_file(j), Error);
  j = nlohmann::json::parse(R"({"kernel":"k","dims":["B"],"grids":{"g":{"description":[],"shapes":[{"B":1}]}}})");
  EXPECT_THROW(harness::parse_grid_file(j), Error);
}

// Found by tessera_fuzz_bench_report: a ceiling without "device" escaped as
// nlohmann::json::out_of_range.
TEST(ReportReliability, MalformedCeilingsAreErrors) {
  const auto doc = nlohmann::json::parse(
      R"({"rows":[{"ai":1,"gflops":1}],"roofline":{"devices":[{"ddvice":"cpu","bandwidth_gbs":1}]}})");
  try {
    harness::render_report_html(doc);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  // A non-string "kernel" is shown as its JSON text (json::value threw type_error before).
  EXPECT_NE(harness::render_report_html(nlohmann::json::parse(R"({"rows":[],"kernel":7})")).find("Tessera bench: 7"),
            std::string::npos);
}

// Found by review: peak / bandwidth overflowing to infinity (1e300 / 1e-320) or underflowing
// to 0 made the decade loop of the chart endless. Both render now.
TEST(ReportReliability, NonFiniteRidgeDoesNotHang) {
  for (const char* text :
       {R"({"rows":[{"ai":1,"gflops":10}],"roofline":{"devices":[{"device":"cpu","gemm_gflops":{"f32":1e300},"bandwidth_gbs":1e-320}]}})",
        R"({"rows":[{"ai":1,"gflops":1}],"roofline":{"devices":[{"device":"cpu","gemm_gflops":{"f32":1e-320},"bandwidth_gbs":1e300}]}})",
        R"({"rows":[{"ai":1e-320,"gflops":1e308}],"roofline":{"devices":[{"device":"cpu","gemm_gflops":{"f32":1e-320},"bandwidth_gbs":1e308}]}})"}) {
    const std::string html = harness::render_report_html(nlohmann::json::parse(text));
    EXPECT_NE(html.find("</svg>"), std::string::npos);
  }
}

// Found by the bench_report target after the report was rewritten (10 s into the CI run): a
// kernel row with a GEMM ratio but no "gemm_count" (or a count of 1e300) was cast to int: NaN /
// out of range, undefined behaviour. Counts that are not small integers are now ignored.
TEST(ReportReliability, GemmCountThatIsNotACountIsIgnored) {
  for (const char* count : {"", R"(,"gemm_count":1e300)", R"(,"gemm_count":-5)", R"(,"gemm_count":"x")"}) {
    const std::string text = std::string(R"({"dims":["B"],"rows":[{"implementation":"cpu","kind":"kernel","mode":"forward",)") +
                             R"("dtype":"f32","B":8,"median_ms":2,"vs_gemm":2)" + count + "}]}";
    const std::string html = harness::render_report_html(nlohmann::json::parse(text));
    EXPECT_NE(html.find("</html>"), std::string::npos) << text;
  }
}

TEST(RooflineReliability, NotARooflineIsAnIoError) {
  for (const char* text : {"[]", "{\"schema\":\"tessera-roofline/1\"}", "{\"schema\":5}", "nul",
                           R"({"schema":"tessera-roofline/1","devices":[{"device":1}]})"}) {
    try {
      harness::parse_roofline(text, "r.json");
      ADD_FAILURE() << "accepted " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kIo) << text;
      EXPECT_NE(std::string(e.what()).find("r.json"), std::string::npos) << e.what();
    }
  }
}

// Found by review (then made a fuzz seed): a negative cache entry whose candidates carry a
// non-string "candidate" made json::value throw type_error out of lookup_or_autotune, i.e.
// out of a kernel call. A candidates field that is not an array makes the entry corrupt.
TEST(CacheReliability, ForeignCandidatesNeverEscape) {
  TempDir dir("cache");
  tune::DiskCache cache(dir.str(), "0.1.0");
  tune::AutotuneRequest req;
  req.prefix = "k.cpu";
  req.key = "k|cpu|B=1";
  req.candidates = {{{"b", 1}}, {{"b", 2}}};
  int sweeps = 0;
  req.make_run = [&] {
    ++sweeps;
    return tune::RunFn([](const tune::Params& p) { return 1e-3 * static_cast<double>(p[0].second); });
  };
  req.policy.warmup = 0;
  req.policy.repeats = 1;
  const std::string path = cache.path_for(req.prefix, req.key);

  reliability::write_file(path, R"({"format":"tessera-tune-cache/1","key":"k|cpu|B=1","version":"0.1.0",)"
                                R"("result":"none","candidates":[{"candidate":5,"failure":"x"},7,{"failure":"y"}]})");
  tune::clear_autotune_memo();
  tune::AutotuneResult r = tune::lookup_or_autotune(cache, req);
  EXPECT_EQ(r.kind, tune::AutotuneResult::Kind::kNegative);
  EXPECT_NE(r.detail.find("?: x"), std::string::npos) << r.detail;
  EXPECT_EQ(sweeps, 0);

  reliability::write_file(path, R"({"format":"tessera-tune-cache/1","key":"k|cpu|B=1","version":"0.1.0",)"
                                R"("result":"ok","params":{"b":2},"median_ms":1,"candidates":{"a":1}})");
  tune::clear_autotune_memo();
  r = tune::lookup_or_autotune(cache, req);  // corrupt: ignored, tuned again, rewritten
  EXPECT_EQ(r.kind, tune::AutotuneResult::Kind::kFound);
  EXPECT_EQ(r.source, "autotune");
  EXPECT_EQ(sweeps, 1);
  EXPECT_EQ(r.params, (tune::Params{{"b", 1}}));
  tune::clear_autotune_memo();
}

}  // namespace
}  // namespace tessera
