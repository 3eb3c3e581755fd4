#include "core/log.h"

#include <cstdio>
#include <mutex>
#include <set>

#include "core/env.h"

namespace tessera::log {
namespace {
std::mutex g_mu;
std::string* g_capture = nullptr;
int g_level = -1;

Level parse_level() {
  auto v = env::get("TESSERA_LOG_LEVEL");
  if (!v) return Level::kWarn;
  if (*v == "error") return Level::kError;
  if (*v == "info") return Level::kInfo;
  if (*v == "debug") return Level::kDebug;
  return Level::kWarn;
}
const char* tag(Level l) {
  switch (l) {
    case Level::kError: return "error";
    case Level::kWarn: return "warning";
    case Level::kInfo: return "info";
    case Level::kDebug: return "debug";
  }
  return "";
}
}  // namespace

Level level() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_level < 0) g_level = static_cast<int>(parse_level());
  return static_cast<Level>(g_level);
}

void set_level(Level l) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_level = static_cast<int>(l);
}

void set_capture(std::string* sink) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_capture = sink;
}

void write(Level l, const std::string& msg) {
  if (static_cast<int>(l) > static_cast<int>(level())) return;
  std::lock_guard<std::mutex> lock(g_mu);
  const std::string line = std::string("tessera: ") + tag(l) + ": " + msg + "\n";
  if (g_capture) {
    *g_capture += line;
  } else {
    std::fputs(line.c_str(), stderr);
  }
}

void error(const std::string& m) { write(Level::kError, m); }
void warn(const std::string& m) { write(Level::kWarn, m); }
void info(const std::string& m) { write(Level::kInfo, m); }
void debug(const std::string& m) { write(Level::kDebug, m); }

static bool first_time(const std::string& key) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  return seen.insert(key).second;
}

void warn_once(const std::string& m) {
  if (first_time("W" + m)) warn(m);
}
void info_once(const std::string& m) {
  if (first_time("I" + m)) info(m);
}

}  // namespace tessera::log
