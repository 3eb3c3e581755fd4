// attention: the registry of implementations, in default dispatch order.
// A new backend adds its factory here (and its file to CMakeLists.txt).
#include "kernels/attention/impl.h"

namespace tessera::attention {

const std::vector<std::unique_ptr<Implementation>>& registry() {
  static const std::vector<std::unique_ptr<Implementation>> impls = [] {
    std::vector<std::unique_ptr<Implementation>> v;
    // Default order: fastest first. Only implementations of the inputs' device are tried.
#ifdef TESSERA_HAVE_CPU_BACKEND
    v.push_back(make_cpu_implementation());
#endif
    v.push_back(make_reference_implementation());
    return v;
  }();
  return impls;
}

const Implementation* find_implementation(const std::string& name) {
  for (const auto& impl : registry())
    if (impl->name() == name) return impl.get();
  return nullptr;
}

}  // namespace tessera::attention
