// Tessera primitive tests: run a check on the fast path and, where the CPU has it, again on the
// portable path that `env` = 0 forces (cpu_f32_gemm, cpu_bf16_gemm).
#pragma once

#include <cstdlib>

namespace tessera::testing {

// f(false) on the default path; then, when the fast path is available, f(true) with env=0.
template <class F>
void both_paths(bool fast_available, const char* env, F&& f) {
  f(false);
  if (!fast_available) return;
  ::setenv(env, "0", 1);
  f(true);
  ::unsetenv(env);
}

}  // namespace tessera::testing
