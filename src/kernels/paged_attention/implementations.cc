// paged_attention: the registry of implementations, in default dispatch order (fastest first).
// A new backend adds its factory here and its file to tessera_add_kernel(paged_attention ...).
#include "kernels/paged_attention/impl.h"

namespace tessera::paged_attention {

Registry& registry() {
  static Registry& r = Registry::leaked(kKernelName, [](Registry& reg) {
    // cuda_v2.cu, cuda.cu: in the CUDA device module, declared here (dispatch/registry.h:
    // add_module_implementation). v2 first (verified on an H200, 2026-11-28: 9.6x v1 at decode);
    // v1 stays current as its fallback (v2 refuses chunk partials past 1 GiB).
    reg.add_module_implementation("cuda_v2", DeviceType::kCUDA,
                                  "NVIDIA GPUs: split-KV, keys across the lanes, a kv head's query heads together, "
                                  "from the CUDA module libtessera_cuda.so");
    reg.add_module_implementation("cuda", DeviceType::kCUDA,
                                  "NVIDIA GPUs: one warp per query row and head, from the CUDA module libtessera_cuda.so");
#ifdef TESSERA_HAVE_CPU_BACKEND
    reg.add(make_cpu_implementation());
#endif
    reg.add(make_reference_implementation());
  });
  return r;
}

}  // namespace tessera::paged_attention
