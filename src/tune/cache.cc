#include "tune/cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "core/env.h"
#include "core/log.h"
#include "core/text.h"
#include "core/files.h"
#include "tessera/error.h"

namespace tessera::tune {
namespace fs = std::filesystem;

std::string default_cache_dir() {
  if (auto d = env::get("TESSERA_CACHE_DIR")) return *d;
  if (auto d = env::get("XDG_CACHE_HOME")) return *d + "/tessera";
  if (auto h = env::get("HOME")) return *h + "/.cache/tessera";
  return ".tessera-cache";
}

std::string key_hash(const std::string& key) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : key) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

DiskCache::DiskCache(std::string dir, std::string version)
    : dir_(std::move(dir)), version_(std::move(version)) {}

std::string DiskCache::path_for(const std::string& prefix, const std::string& key) const {
  std::string safe;
  for (char c : prefix) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    safe += ok ? c : '_';
  }
  return (fs::path(dir_) / (safe + "-" + key_hash(key) + ".json")).string();
}

nlohmann::json entry_to_json(const CacheEntry& e) {
  nlohmann::json j;
  j["format"] = kCacheFormat;
  j["key"] = e.key;
  j["version"] = e.version;
  j["created"] = e.created;
  j["result"] = e.negative ? "none" : "ok";
  if (!e.negative) {
    j["params"] = params_to_json(e.params);
    j["median_ms"] = e.median_ms;
  }
  j["complete"] = e.complete;
  j["candidates"] = e.candidates;
  return j;
}

CacheEntry entry_from_json(const nlohmann::json& j) {
  auto str = [&](const char* field) {
    if (!j.contains(field) || !j[field].is_string())
      throw std::runtime_error(std::string("missing or non-string field '") + field + "'");
    return j[field].get<std::string>();
  };
  if (!j.is_object()) throw std::runtime_error("not a JSON object");
  if (str("format") != kCacheFormat)
    throw std::runtime_error("unknown format '" + str("format") + "'");
  CacheEntry e;
  e.key = str("key");
  e.version = str("version");
  e.created = j.value("created", "");
  const std::string result = str("result");
  if (result == "none") {
    e.negative = true;
  } else if (result == "ok") {
    if (!j.contains("params")) throw std::runtime_error("result 'ok' without params");
    e.params = params_from_json(j["params"]);
    if (e.params.empty()) throw std::runtime_error("empty params");
    if (!j.contains("median_ms") || !j["median_ms"].is_number())
      throw std::runtime_error("missing median_ms");
    e.median_ms = j["median_ms"].get<double>();
  } else {
    throw std::runtime_error("unknown result '" + result + "'");
  }
  e.complete = j.value("complete", true);
  if (j.contains("candidates")) {
    if (!j["candidates"].is_array()) throw std::runtime_error("\"candidates\" is not an array");
    e.candidates = j["candidates"];
  }
  return e;
}

std::optional<CacheEntry> DiskCache::read(const std::string& prefix, const std::string& key) const {
  const std::string path = path_for(prefix, key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;  // no entry (the normal miss)
  std::stringstream ss;
  ss << in.rdbuf();
  CacheEntry e;
  try {
    e = entry_from_json(nlohmann::json::parse(ss.str()));
  } catch (const std::exception& ex) {
    log::warn(text::printable("autotune cache: ignoring corrupt entry " + path + " (" + ex.what() + ")"));
    return std::nullopt;
  }
  if (e.version != version_) {
    log::warn(text::printable("autotune cache: ignoring entry " + path + " written by tessera " + e.version +
                              " (this is " + version_ + ")"));
    return std::nullopt;
  }
  if (e.key != key) {
    log::warn(text::printable("autotune cache: ignoring entry " + path +
                              " whose key differs from the request (" + e.key + ")"));
    return std::nullopt;
  }
  return e;
}

namespace {

std::string io_error(const std::string& what, const std::string& path) {
  return "autotune cache: cannot " + what + " " + path + ": " + std::strerror(errno);
}

std::string temp_name(const std::string& final_name) { return files::unique_temp_name(final_name); }

}  // namespace

void DiskCache::write(const std::string& prefix, const CacheEntry& e) const {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec)
    throw Error(ErrorCode::kIo, "autotune cache: cannot create directory " + dir_ + ": " + ec.message());
  const std::string path = path_for(prefix, e.key);
  const std::string tmp = temp_name(path);
  const std::string text = entry_to_json(e).dump(2) + "\n";

  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(ErrorCode::kIo, io_error("create", tmp));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string msg = io_error("write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(ErrorCode::kIo, msg);
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    const std::string msg = io_error("flush", tmp);
    ::unlink(tmp.c_str());
    throw Error(ErrorCode::kIo, msg);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string msg = io_error("rename into", path);
    ::unlink(tmp.c_str());
    throw Error(ErrorCode::kIo, msg);
  }
}

}  // namespace tessera::tune
