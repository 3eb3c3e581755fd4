// mlstm: the registry of implementations, in default dispatch order (fastest first).
#include "kernels/mlstm/impl.h"

namespace tessera::mlstm {

Registry& registry() {
  static Registry& r = Registry::leaked(kKernelName, [](Registry& reg) {
    // cuda.cu lives in the CUDA device module: declared here, registered by the module when a
    // CUDA device is first used; listed as unavailable, with the reason, where it cannot load.
    reg.add_module_implementation("cuda", DeviceType::kCUDA,
                                  "NVIDIA GPUs: chunkwise (state recurrence per head, then one block per chunk), from the CUDA module libtessera_cuda.so");
#ifdef TESSERA_HAVE_CPU_BACKEND
    reg.add(make_cpu_implementation());
#endif
    reg.add(make_reference_implementation());
  });
  return r;
}

}  // namespace tessera::mlstm
