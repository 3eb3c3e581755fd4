// Tessera internal (tuning): the persistent autotune cache.
//
// One JSON file per key in a cache directory (default $TESSERA_CACHE_DIR, else
// $XDG_CACHE_HOME/tessera, else ~/.cache/tessera). The key is a long canonical string
// (implementation, device kind, dtypes, shape, options, library version); the file name is
// "<prefix>-<16 hex digits of its hash>.json" and the full key is stored inside and compared on
// read, so a hash collision or a file from another version is never trusted.
//
// Writes are atomic: a uniquely named temp file in the same directory, fsync, rename over the
// final name. Several threads or processes may write the same key at once; a reader always sees
// one complete file (the last rename wins). A corrupt, foreign or mismatched file is ignored
// with a warning (and overwritten by the next tune).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tune/params.h"

namespace tessera::tune {

inline constexpr const char* kCacheFormat = "tessera-tune-cache/1";

struct CacheEntry {
  std::string key;            // the full key
  std::string version;        // library version that wrote it
  bool negative = false;      // no candidate could run: fall through to another implementation
  Params params;              // the winner (when !negative)
  double median_ms = 0;       // the winner's median time
  bool complete = true;       // every candidate was measured (the budget did not cut the sweep)
  std::string created;        // UTC, ISO 8601
  nlohmann::json candidates = nlohmann::json::array();  // every candidate's measurement
};

// $TESSERA_CACHE_DIR, else $XDG_CACHE_HOME/tessera, else $HOME/.cache/tessera, else
// ./.tessera-cache (no home directory).
std::string default_cache_dir();

// 16 lowercase hex digits (64-bit FNV-1a) of `key`.
std::string key_hash(const std::string& key);

class DiskCache {
 public:
  explicit DiskCache(std::string dir, std::string version = TESSERA_VERSION);
  const std::string& dir() const { return dir_; }
  const std::string& version() const { return version_; }

  // "<dir>/<prefix>-<hash>.json"; characters of prefix outside [A-Za-z0-9._-] become '_'.
  std::string path_for(const std::string& prefix, const std::string& key) const;

  // The entry for `key`, or nullopt when there is none. A file that cannot be parsed, has
  // another format, another library version or another key is ignored with a warning.
  std::optional<CacheEntry> read(const std::string& prefix, const std::string& key) const;

  // Writes atomically (creates the directory). Throws Error(kIo) on failure.
  void write(const std::string& prefix, const CacheEntry& e) const;

 private:
  std::string dir_;
  std::string version_;
};

nlohmann::json entry_to_json(const CacheEntry& e);
// Throws std::runtime_error naming what is missing or malformed.
CacheEntry entry_from_json(const nlohmann::json& j);

}  // namespace tessera::tune
