#include "tune/params.h"

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tessera/error.h"

namespace tessera::tune {

std::string params_str(const Params& p) {
  std::string s;
  for (const auto& [name, value] : p) {
    if (!s.empty()) s += ",";
    s += name + "=" + std::to_string(value);
  }
  return s;
}

std::optional<int64_t> param(const Params& p, const std::string& name) {
  for (const auto& [n, v] : p)
    if (n == name) return v;
  return std::nullopt;
}

namespace {
std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}
}  // namespace

Params parse_params(const std::string& text, const std::string& what) {
  Params p;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = trimmed(text.substr(start, end - start));
    const size_t eq = item.find('=');
    const std::string name = eq == std::string::npos ? "" : trimmed(item.substr(0, eq));
    const std::string value = eq == std::string::npos ? "" : trimmed(item.substr(eq + 1));
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(!name.empty() && !value.empty() && used == value.size(), ErrorCode::kInvalidArgument,
          what + ": '" + item + "' is not NAME=INTEGER (in '" + text + "')");
    check(!param(p, name), ErrorCode::kInvalidArgument, what + ": " + name + " is given twice");
    p.emplace_back(name, v);
    start = end + 1;
  }
  return p;
}

nlohmann::json params_to_json(const Params& p) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, value] : p) j[name] = value;
  return j;
}

Params params_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::runtime_error("params must be a JSON object");
  Params p;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_number_integer())
      throw std::runtime_error("param '" + it.key() + "' is not an integer");
    p.emplace_back(it.key(), it.value().get<int64_t>());
  }
  return p;
}

}  // namespace tessera::tune
