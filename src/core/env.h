// Tessera internal: environment variables.
#pragma once

#include <optional>
#include <string>

namespace tessera::env {

std::optional<std::string> get(const char* name);       // unset or empty -> nullopt
bool flag(const char* name, bool default_value);          // 0/false/off/no vs 1/true/on/yes, any case; else a warning
int integer(const char* name, int default_value);

}  // namespace tessera::env
