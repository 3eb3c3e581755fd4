// Helpers for the tuning tests: a temp directory that is removed afterwards, scoped env vars,
// captured log output.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "core/log.h"

namespace tessera::testing_tune {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/tessera-tune-test-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (!p) std::abort();
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Captures log lines (warn and above by default) for its lifetime.
class LogCapture {
 public:
  LogCapture() { log::set_capture(&text_); }
  ~LogCapture() { log::set_capture(nullptr); }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

}  // namespace tessera::testing_tune
