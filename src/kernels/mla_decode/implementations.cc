// mla_decode: the registry of implementations, in default dispatch order (fastest first).
// A new backend adds its factory here and its file to tessera_add_kernel(mla_decode ...).
#include "kernels/mla_decode/impl.h"

namespace tessera::mla_decode {

Registry& registry() {
  static Registry& r = Registry::leaked(kKernelName, [](Registry& reg) {
    // cuda_v2.cu, cuda.cu: in the CUDA device module, declared here (dispatch/registry.h:
    // add_module_implementation). v2 first (verified on an H200, 2026-11-28: 2.4x v1); v1 stays
    // current as its fallback (v2 takes D <= 576, Dv <= 512; v1 up to 1024).
    reg.add_module_implementation("cuda_v2", DeviceType::kCUDA,
                                  "NVIDIA GPUs: split-KV, keys across the lanes, 4 query heads an item, from the "
                                  "CUDA module libtessera_cuda.so");
    reg.add_module_implementation("cuda", DeviceType::kCUDA,
                                  "NVIDIA GPUs: split-KV partial attention then the lse combine, from the CUDA "
                                  "module libtessera_cuda.so");
#ifdef TESSERA_HAVE_CPU_BACKEND
    reg.add(make_cpu_implementation());
#endif
    reg.add(make_reference_implementation());
  });
  return r;
}

}  // namespace tessera::mla_decode
