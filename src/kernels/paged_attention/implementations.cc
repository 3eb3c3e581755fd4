// paged_attention: the registry of implementations, in default dispatch order (fastest first).
// A new backend adds its factory here and its file to tessera_add_kernel(paged_attention ...).
#include "kernels/paged_attention/impl.h"

namespace tessera::paged_attention {

Registry& registry() {
  static Registry& r = Registry::leaked(kKernelName, [](Registry& reg) {
    // cuda.cu: in the CUDA device module, declared here (dispatch/registry.h: add_module_implementation).
    reg.add_module_implementation("cuda", DeviceType::kCUDA,
                                  "NVIDIA GPUs: one warp per query row and head, from the CUDA module libtessera_cuda.so");
    // cuda_v2: experimental (out of the default order) until a GPU run verifies it.
    reg.add_module_implementation("cuda_v2", DeviceType::kCUDA,
                                  "NVIDIA GPUs: split-KV, keys across the lanes, a kv head's query heads together, "
                                  "from the CUDA module libtessera_cuda.so", {}, VersionStatus::kExperimental);
#ifdef TESSERA_HAVE_CPU_BACKEND
    reg.add(make_cpu_implementation());
#endif
    reg.add(make_reference_implementation());
  });
  return r;
}

}  // namespace tessera::paged_attention
