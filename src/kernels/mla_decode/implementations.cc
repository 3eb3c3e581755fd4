// mla_decode: the registry of implementations, in default dispatch order (fastest first).
// A new backend adds its factory here and its file to tessera_add_kernel(mla_decode ...).
#include "kernels/mla_decode/impl.h"

namespace tessera::mla_decode {

Registry& registry() {
  static Registry& r = Registry::leaked(kKernelName, [](Registry& reg) {
    // cuda.cu: in the CUDA device module, declared here (dispatch/registry.h: add_module_implementation).
    reg.add_module_implementation("cuda", DeviceType::kCUDA,
                                  "NVIDIA GPUs: split-KV partial attention then the lse combine, from the CUDA "
                                  "module libtessera_cuda.so");
    // cuda_v2: experimental (out of the default order) until a GPU run verifies it.
    reg.add_module_implementation("cuda_v2", DeviceType::kCUDA,
                                  "NVIDIA GPUs: split-KV, keys across the lanes, 4 query heads an item, from the "
                                  "CUDA module libtessera_cuda.so", {}, VersionStatus::kExperimental);
#ifdef TESSERA_HAVE_CPU_BACKEND
    reg.add(make_cpu_implementation());
#endif
    reg.add(make_reference_implementation());
  });
  return r;
}

}  // namespace tessera::mla_decode
