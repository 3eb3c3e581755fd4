// attention: the registry of implementations, in default dispatch order.
// A new backend adds its factory here (and its file to CMakeLists.txt); a device-module backend
// is declared here and registers itself from the module.
#include "kernels/attention/impl.h"

namespace tessera::attention {

Registry& registry() {
  static Registry& r = Registry::leaked(kKernelName, [](Registry& reg) {
    // Default order: fastest first. Only implementations of the inputs' device are tried.
    // cuda.cu lives in the CUDA device module: declared here, registered by the module when a
    // CUDA device is first used (dispatch/registry.h). Listed as unavailable, with the reason,
    // where the module cannot be loaded.
    // cudnn (cuDNN's fused flash attention) first: it takes f16 / bf16 dense problems with causal /
    // window masks and GQA, and says why not for the rest, which then go to cuda.
    reg.add_module_implementation("cudnn", DeviceType::kCUDA,
                                  "NVIDIA GPUs (sm_80+): cuDNN fused flash attention, from the CUDA module "
                                  "libtessera_cuda.so when built with cuDNN");
    reg.add_module_implementation("cuda", DeviceType::kCUDA,
                                  "NVIDIA GPUs (sm_80+), from the CUDA module libtessera_cuda.so");
#ifdef TESSERA_HAVE_CPU_BACKEND
    reg.add(make_cpu_implementation());
#endif
    reg.add(make_reference_implementation());
  });
  return r;
}

const Implementation* find_implementation(const std::string& name) { return registry().find(name); }

}  // namespace tessera::attention
