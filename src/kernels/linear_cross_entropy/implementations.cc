// linear_cross_entropy: the registry of implementations, in default dispatch order.
// A new backend adds its factory here (and its file to the kernel's tessera_add_kernel in
// CMakeLists.txt); a device-module backend is declared here and registers itself from the module.
#include "kernels/linear_cross_entropy/impl.h"

namespace tessera::linear_cross_entropy {

void Implementation::forward_backward(const Problem& p, const BlockSizes& bs, const GradIn& g,
                                      const ForwardOut& fout, const GradOut& gout) const {
  forward(p, bs, fout);
  GradIn g2 = g;
  g2.lse = fout.lse;
  backward(p, bs, g2, gout);
}

Registry& registry() {
  static Registry& r = Registry::leaked(kKernelName, [](Registry& reg) {
    // Default order: fastest first. Only implementations of the inputs' device are tried.
    // cuda.cu lives in the CUDA device module: declared here, registered by the module when a
    // CUDA device is first used (dispatch/registry.h). Listed as unavailable, with the reason,
    // where the module cannot be loaded.
    reg.add_module_implementation("cuda", DeviceType::kCUDA,
                                  "NVIDIA GPUs (sm_80+), from the CUDA module libtessera_cuda.so");
#ifdef TESSERA_HAVE_CPU_BACKEND
    reg.add(make_cpu_implementation());
    reg.add(make_cpu_v2_implementation());  // experimental: not in the default order
#endif
    reg.add(make_reference_implementation());
  });
  return r;
}

const Implementation* find_implementation(const std::string& name) { return registry().find(name); }

}  // namespace tessera::linear_cross_entropy
