// Tessera internal: what the build compiled, for `tessera list --verbose` and the report
// (docs/VERSIONS.md, "What the compiler did").
//
//   CPU backends: the SIMD targets Highway compiled into libtessera (HWY_TARGETS), those this
//   CPU supports, and the one HWY_DYNAMIC_DISPATCH runs here (the best of both).
//   CUDA backends: where the module's compiler report (libtessera_cuda.resources.json, written
//   by the build from ptxas's resource usage) is: beside libtessera.so, or $TESSERA_CUDA_RESOURCES.
#pragma once

#include <string>
#include <vector>

namespace tessera::build_info {

struct SimdTargets {
  bool built = false;                 // the CPU backend (and Highway) is part of this build
  std::vector<std::string> compiled;  // HWY_TARGETS, best first ("AVX3_SPR", ..., "SSE2", "EMU128")
  std::vector<std::string> supported; // of those, the ones this CPU runs
  std::string dispatched;             // the one dynamic dispatch picks here
  std::string static_target;          // the baseline every TU is compiled for (HWY_STATIC_TARGET)
};
SimdTargets simd_targets();

// The CUDA module's compiler report: $TESSERA_CUDA_RESOURCES, else
// <directory of libtessera.so>/libtessera_cuda.resources.json (may not exist).
std::string cuda_resources_path();

}  // namespace tessera::build_info
