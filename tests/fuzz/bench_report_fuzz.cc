// Fuzz target: the bench JSON reader behind `tessera report` (schema tessera-bench/1: rows,
// roofline ceilings, machine, messages), rendered to HTML with its inline SVG roofline.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "harness/report.h"
#include "tessera/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(tessera::fuzz::as_string(data, size));
  } catch (const nlohmann::json::exception&) {
    return 0;  // not JSON: read_json_file reports it as Error(kIo); nothing of ours ran
  }
  try {
    (void)tessera::harness::render_report_html(doc);
  } catch (const tessera::Error&) {
  }
  return 0;
}
