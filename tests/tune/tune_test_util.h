// Helpers for the tuning tests: a temp directory that is removed afterwards, scoped env vars,
// captured log output, a kernel's declared tuning with a one-row table of the test's own.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scoped_env.h"
#include "core/log.h"
#include "tune/declared.h"
#include "tune/device_kind.h"

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

using testing::ScopedEnv;  // tests/scoped_env.h

// Captures log lines (warn and above by default) for its lifetime.
class LogCapture {
 public:
  LogCapture() { log::set_capture(&text_); }
  ~LogCapture() { log::set_capture(nullptr); }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// An empty tuned table: every call a miss.
inline const std::vector<tune::TableEntry>& no_rows() {
  static const std::vector<tune::TableEntry> none;
  return none;
}

// A kernel's declared tuning whose table is one cpu row (this machine's device kind) for
// (dtype, bucket) with the given parameters, with the checked-in table's switch on and autotune
// off, for a scope: the row is gone again afterwards.
class OneRowTable {
 public:
  OneRowTable(tune::Declared d, const std::string& dtype, const std::string& bucket, tune::Params params)
      : table_on_("TESSERA_TUNED_TABLE", nullptr), autotune_off_("TESSERA_AUTOTUNE", "0"), d_(std::move(d)) {
    row_() = {{"cpu", tune::default_device_kind(DeviceType::kCPU), dtype, bucket, std::move(params), "", "", 0, ""}};
    d_.table = [] () -> const std::vector<tune::TableEntry>& { return row_(); };
  }
  ~OneRowTable() { row_().clear(); }
  OneRowTable(const OneRowTable&) = delete;
  OneRowTable& operator=(const OneRowTable&) = delete;
  const tune::Declared& declared() const { return d_; }

 private:
  static std::vector<tune::TableEntry>& row_() {
    static std::vector<tune::TableEntry> rows;
    return rows;
  }
  ScopedEnv table_on_, autotune_off_;
  tune::Declared d_;
};

}  // namespace tessera::testing_tune
