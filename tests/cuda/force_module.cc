// tessera_cuda_tests checks the CUDA module itself, including on machines without a driver
// (every call must then report "no CUDA device" instead of crashing), so this executable loads
// the module even where the loader's driver check would refuse to (core/device_module.h):
// TESSERA_CUDA_MODULE_FORCE=1 unless the caller set it. On a GPU machine it changes nothing.
#include <cstdlib>

namespace {
[[maybe_unused]] const bool g_forced = [] {
  ::setenv("TESSERA_CUDA_MODULE_FORCE", "1", /*overwrite=*/0);
  return true;
}();
}  // namespace
