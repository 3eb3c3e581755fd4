#include "core/build_info.h"

#include <dlfcn.h>

#include <filesystem>

#include "core/env.h"

#ifdef TESSERA_HAVE_CPU_BACKEND
#include <hwy/targets.h>
#endif

namespace tessera::build_info {

SimdTargets simd_targets() {
  SimdTargets t;
#ifdef TESSERA_HAVE_CPU_BACKEND
  t.built = true;
  const int64_t supported = hwy::SupportedTargets();
  for (int64_t bits = HWY_TARGETS; bits != 0; bits &= bits - 1) {
    const int64_t target = bits & ~(bits - 1);  // lowest bit first: the best target first
    t.compiled.push_back(hwy::TargetName(target));
    if (supported & target) {
      t.supported.push_back(hwy::TargetName(target));
      if (t.dispatched.empty()) t.dispatched = hwy::TargetName(target);
    }
  }
  t.static_target = hwy::TargetName(HWY_STATIC_TARGET);
#endif
  return t;
}

std::string cuda_resources_path() {
  if (auto p = env::get("TESSERA_CUDA_RESOURCES")) return *p;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&simd_targets), &info) && info.dli_fname && *info.dli_fname) {
    std::error_code ec;
    const std::filesystem::path p = std::filesystem::canonical(info.dli_fname, ec);
    if (!ec) return (p.parent_path() / "libtessera_cuda.resources.json").string();
  }
  return "libtessera_cuda.resources.json";
}

}  // namespace tessera::build_info
