// Fuzz target: the roofline JSON reader (schemas tessera-roofline/2 and /1), as load_roofline
// reads a stored file, then the lookups a bench makes with what it read.
#include "fuzz_util.h"
#include "harness/roofline.h"
#include "tessera/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto r = tessera::harness::parse_roofline(tessera::fuzz::as_string(data, size), "fuzz.json");
    for (const auto& d : r.devices) {
      std::string note;
      (void)d.peak_gflops("bf16", &note);
      (void)d.attainable_gflops(1.5, "f32");
      (void)d.attainable_gemm_gflops(1.5, "bf16");
      (void)d.peak_line("f16");
    }
    (void)r.find("cpu");
  } catch (const tessera::Error&) {
  }
  return 0;
}
