#include "core/files.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "tessera/error.h"

namespace tessera::files {

std::string unique_temp_name(const std::string& final_name) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}() ^
                                   std::hash<std::thread::id>{}(std::this_thread::get_id())};
  char buf[64];
  std::snprintf(buf, sizeof buf, ".tmp.%ld.%llu.%08llx", static_cast<long>(::getpid()),
                static_cast<unsigned long long>(counter.fetch_add(1)),
                static_cast<unsigned long long>(rng() & 0xffffffffull));
  return final_name + buf;
}

void write_atomically(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  const std::string tmp = unique_temp_name(path);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(ErrorCode::kIo, "cannot write " + path);
    f << text;
    f.close();
    if (!f) {
      fs::remove(tmp, ec);
      throw Error(ErrorCode::kIo, "error writing " + path);
    }
  }
  fs::rename(tmp, p, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw Error(ErrorCode::kIo, "cannot write " + path + ": " + ec.message());
  }
}

}  // namespace tessera::files
