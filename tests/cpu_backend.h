#pragma once
// Whether the optimized CPU backend was built: the GPU machine's preset (`gpu`) builds without it
// (no BLAS there), so a test that names the `cpu` implementation runs it only where it exists.
#include <vector>

namespace tessera::testing {

#ifdef TESSERA_HAVE_CPU_BACKEND
inline constexpr bool kHaveCpuBackend = true;
#else
inline constexpr bool kHaveCpuBackend = false;
#endif

// The implementations a reference-vs-cpu test loops over: "reference", and "cpu" where built.
inline std::vector<const char*> reference_and_cpu() {
  if (kHaveCpuBackend) return {"reference", "cpu"};
  return {"reference"};
}

}  // namespace tessera::testing

#define TESSERA_SKIP_WITHOUT_CPU_BACKEND() \
  if (!::tessera::testing::kHaveCpuBackend) GTEST_SKIP() << "built without the cpu backend (TESSERA_CPU_BACKEND=OFF)"
