// Tessera harness: benchmark grids as data (generic).
//
// A grid file (bench/<kernel>.json) holds named grids of named shapes:
//   {
//     "kernel": "linear_cross_entropy",
//     "dims": ["B", "H", "V"],
//     "grids": {
//       "smoke": {"description": "...", "dtypes": ["f32"],
//                 "shapes": [{"name": "tiny", "B": 8, "H": 16, "V": 64}, ...]},
//       ...
//     }
//   }
// Every shape must give every dim as a positive integer; a grid may list dtypes (the bench's
// --dtype overrides them). Extra keys in a shape (e.g. "note", "model") are kept as strings.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tessera::harness {

struct GridShape {
  std::string name;
  std::map<std::string, int64_t> dims;
  std::map<std::string, std::string> extra;  // other string/number fields, as text
  int64_t dim(const std::string& d) const;   // throws Error(kInvalidArgument) if absent
};

struct Grid {
  std::string name;
  std::string description;
  std::vector<std::string> dtypes;
  std::vector<GridShape> shapes;
};

struct GridFile {
  std::string path;  // where it was read from ("" when parsed from text)
  std::string kernel;
  std::vector<std::string> dims;
  std::vector<Grid> grids;  // in file order

  const Grid& grid(const std::string& name) const;  // throws Error(kNotFound) listing names
};

// Parses a grid document; throws Error(kInvalidArgument) naming the offending grid / shape.
GridFile parse_grid_file(const nlohmann::json& j);

// Finds bench/<kernel>.json. Searched in order (first that exists wins):
//   1. explicit path (if non-empty)
//   2. $TESSERA_BENCH_DIR/<kernel>.json
//   3. next to the executable: <exe dir>/../bench, <exe dir>/../../bench,
//      <exe dir>/../share/tessera/bench (installed layout)
//   4. the source tree this was built from (TESSERA_SOURCE_DIR/bench)
// Throws Error(kNotFound) listing every place it looked.
std::string find_grid_file(const std::string& kernel, const std::string& explicit_path = "");
GridFile load_grid_file(const std::string& path);

}  // namespace tessera::harness
