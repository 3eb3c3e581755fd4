#include "core/env.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "core/log.h"

namespace tessera::env {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

bool flag(const char* name, bool default_value) {
  auto v = get(name);
  if (!v) return default_value;
  std::string s = *v;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  // Not silently: TESSERA_AUTOTUNE=disable would otherwise leave autotune on unseen.
  log::warn_once(std::string(name) + "=" + *v + " is not a flag value (0/false/off/no or 1/true/on/yes): " +
                 "using the default, " + (default_value ? "on" : "off"));
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
