// Tessera tests: environment variables for a scope (the outer value put back), and the scope in
// which the kernels' bf16 dot routes run on any CPU.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "primitives/cpu_bf16_gemm.h"

namespace tessera::testing {

// Sets `name` to `value` (nullptr: unsets it) for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ScopedEnv(const char* name, const std::string& value) : ScopedEnv(name, value.c_str()) {}
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// The kernels' bf16 dot routes on for the scope: natively where the CPU has AVX512-BF16, else
// through the portable loops (TESSERA_CPU_BF16_DOT=portable), so that a route's tiles, pairs
// and tails are tested on every machine (CI's has no AVX512-BF16).
class Bf16DotOn {
 public:
  Bf16DotOn() : env_("TESSERA_CPU_BF16_DOT", "1") {
    if (!cpu_bf16_gemm::native()) ::setenv("TESSERA_CPU_BF16_DOT", "portable", 1);
  }
 private:
  ScopedEnv env_;
};

}  // namespace tessera::testing
