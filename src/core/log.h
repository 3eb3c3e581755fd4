// Tessera internal: logging to stderr. Level from TESSERA_LOG_LEVEL (error|warn|info|debug;
// default warn). *_once variants print a given message at most once per process.
#pragma once

#include <string>

namespace tessera::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

Level level();
void set_level(Level l);  // for tests and the CLI (-v / -q)
void write(Level l, const std::string& msg);
void error(const std::string& msg);
void warn(const std::string& msg);
void info(const std::string& msg);
void debug(const std::string& msg);
void warn_once(const std::string& msg);
void info_once(const std::string& msg);
// For tests: capture every message (all levels that pass the filter) instead of printing.
void set_capture(std::string* sink);

}  // namespace tessera::log
