// Fuzz target: benchmark grid files (bench/<kernel>.json): kernel, dims, named grids of named
// shapes, then the lookups the bench makes (grid by name, each shape's dims).
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "harness/grid.h"
#include "tessera/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(tessera::fuzz::as_string(data, size));
  } catch (const nlohmann::json::exception&) {
    return 0;  // not JSON: load_grid_file reports it as Error(kIo) before the grid parser runs
  }
  try {
    const auto f = tessera::harness::parse_grid_file(j);
    for (const auto& g : f.grids) {
      (void)f.grid(g.name);
      for (const auto& s : g.shapes)
        for (const auto& d : f.dims) (void)s.dim(d);
    }
    (void)f.grid("smoke");
  } catch (const tessera::Error&) {
  }
  return 0;
}
