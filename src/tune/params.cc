#include "tune/params.h"

#include <stdexcept>

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
