#include "core/env.h"

#include <cstdlib>
#include <string>

namespace tessera::env {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

bool flag(const char* name, bool default_value) {
  auto v = get(name);
  if (!v) return default_value;
  const std::string& s = *v;
  if (s == "0" || s == "false" || s == "off" || s == "no" || s == "OFF" || s == "FALSE") return false;
  if (s == "1" || s == "true" || s == "on" || s == "yes" || s == "ON" || s == "TRUE") return true;
  return default_value;
}

int integer(const char* name, int default_value) {
  auto v = get(name);
  if (!v) return default_value;
  try {
    size_t pos = 0;
    int x = std::stoi(*v, &pos);
    return pos == v->size() ? x : default_value;
  } catch (...) {
    return default_value;
  }
}

}  // namespace tessera::env
