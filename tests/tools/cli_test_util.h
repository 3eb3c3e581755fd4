// Runs the tessera binary under test as a user would, capturing stdout+stderr and the exit code.
#pragma once

#include <sys/wait.h>

#include <cstdio>
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

}  // namespace tessera::cli_test
