// Runs the tessera binary under test as a user would, capturing stdout+stderr and the exit code.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace tessera::cli_test {

struct Cmd {
  int code;
  std::string out;
};

inline Cmd run_cli(const std::string& args) {
  const std::string cmd = std::string(TESSERA_CLI_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A fresh, empty directory for the running test: <tmp>/<prefix>_<pid>_<test name> (the pid keeps
// concurrent runs of the suite apart, the test name its tests).
inline std::filesystem::path fresh_test_dir(const std::string& prefix) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
      (prefix + "_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace tessera::cli_test
