#include "harness/grid.h"

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/text.h"
#include "harness/table.h"
#include "tessera/error.h"

namespace tessera::harness {

int64_t GridShape::dim(const std::string& d) const {
  auto it = dims.find(d);
  check(it != dims.end(), ErrorCode::kInvalidArgument, "shape '" + name + "' has no dim " + d);
  return it->second;
}

const Grid& GridFile::grid(const std::string& name) const {
  std::string names;
  for (const auto& g : grids) {
    if (g.name == name) return g;
    names += (names.empty() ? "" : ", ") + g.name;
  }
  throw Error(ErrorCode::kNotFound, "no grid '" + name + "' in " + (path.empty() ? "the grid file" : path) +
                                        " (grids: " + names + ")");
}

namespace {

GridFile parse_grid_file_impl(const nlohmann::json& j) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::kInvalidArgument, text::printable("grid file: " + m)); };
  if (!j.is_object()) bad("top level must be an object");
  GridFile f;
  if (!j.contains("kernel") || !j["kernel"].is_string()) bad("missing string \"kernel\"");
  f.kernel = j["kernel"].get<std::string>();
  if (!j.contains("dims") || !j["dims"].is_array() || j["dims"].empty()) bad("missing array \"dims\"");
  for (const auto& d : j["dims"]) {
    if (!d.is_string()) bad("\"dims\" must list strings");
    f.dims.push_back(d.get<std::string>());
  }
  if (!j.contains("grids") || !j["grids"].is_object()) bad("missing object \"grids\"");
  for (auto it = j["grids"].begin(); it != j["grids"].end(); ++it) {
    Grid g;
    g.name = it.key();
    const auto& gj = it.value();
    if (!gj.is_object()) bad("grid '" + g.name + "' must be an object");
    if (gj.contains("description") && !gj["description"].is_string())
      bad("grid '" + g.name + "': \"description\" must be a string");
    g.description = gj.value("description", "");
    if (gj.contains("dtypes")) {
      if (!gj["dtypes"].is_array()) bad("grid '" + g.name + "': \"dtypes\" must be an array");
      for (const auto& d : gj["dtypes"]) {
        if (!d.is_string()) bad("grid '" + g.name + "': \"dtypes\" must list strings");
        g.dtypes.push_back(d.get<std::string>());
      }
    }
    if (!gj.contains("shapes") || !gj["shapes"].is_array() || gj["shapes"].empty())
      bad("grid '" + g.name + "' has no \"shapes\"");
    for (size_t i = 0; i < gj["shapes"].size(); ++i) {
      const auto& sj = gj["shapes"][i];
      GridShape s;
      if (!sj.is_object()) bad("grid '" + g.name + "' shape " + std::to_string(i) + " must be an object");
      if (sj.contains("name") && !sj["name"].is_string())
        bad("grid '" + g.name + "' shape " + std::to_string(i) + ": \"name\" must be a string");
      s.name = sj.value("name", "");
      for (const auto& d : f.dims) {
        const std::string where = "grid '" + g.name + "' shape " +
                                  (s.name.empty() ? std::to_string(i) : "'" + s.name + "'");
        if (!sj.contains(d) || !sj[d].is_number_integer()) bad(where + ": missing integer " + d);
        const int64_t v = sj[d].get<int64_t>();
        if (v <= 0) bad(where + ": " + d + " must be positive, got " + std::to_string(v));
        s.dims[d] = v;
      }
      if (s.name.empty()) {
        for (const auto& d : f.dims) s.name += (s.name.empty() ? "" : ",") + d + "=" + std::to_string(s.dims[d]);
      }
      for (auto kv = sj.begin(); kv != sj.end(); ++kv) {
        if (kv.key() == "name" || s.dims.count(kv.key())) continue;
        s.extra[kv.key()] = kv.value().is_string() ? kv.value().get<std::string>() : kv.value().dump();
      }
      g.shapes.push_back(std::move(s));
    }
    f.grids.push_back(std::move(g));
  }
  return f;
}

}  // namespace

GridFile parse_grid_file(const nlohmann::json& j) {
  try {
    return parse_grid_file_impl(j);
  } catch (const nlohmann::json::exception& e) {
    // Every field is checked above; this is the net for one that is not (never an escape).
    throw Error(ErrorCode::kInvalidArgument, std::string("grid file: malformed (") + e.what() + ")");
  }
}

std::string find_grid_file(const std::string& kernel, const std::string& explicit_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> tried;
  auto try_path = [&](const fs::path& p) -> bool {
    tried.push_back(p.string());
    return fs::is_regular_file(p, ec);
  };
  const std::string file = kernel + ".json";
  if (!explicit_path.empty()) {
    if (try_path(explicit_path)) return explicit_path;
    throw Error(ErrorCode::kNotFound, "grid file " + explicit_path + " does not exist");
  }
  if (auto dir = env::get("TESSERA_BENCH_DIR"))
    if (try_path(fs::path(*dir) / file)) return (fs::path(*dir) / file).string();
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && exe.has_parent_path()) {
    const fs::path d = exe.parent_path();
    for (const fs::path& c : {d / ".." / "bench", d / ".." / ".." / "bench",
                              d / ".." / "share" / "tessera" / "bench"})
      if (try_path(c / file)) return fs::weakly_canonical(c / file, ec).string();
  }
#ifdef TESSERA_SOURCE_DIR
  if (try_path(fs::path(TESSERA_SOURCE_DIR) / "bench" / file))
    return (fs::path(TESSERA_SOURCE_DIR) / "bench" / file).string();
#endif
  std::string list;
  for (const auto& t : tried) list += "\n  " + t;
  throw Error(ErrorCode::kNotFound, "cannot find the benchmark grid file " + file +
                                        " (set TESSERA_BENCH_DIR or pass --grid-file); looked at:" + list);
}

GridFile load_grid_file(const std::string& path) {
  GridFile f = parse_grid_file(read_json_file(path));
  f.path = path;
  return f;
}

}  // namespace tessera::harness
