// grouped_matmul: the registry of implementations, in default dispatch order.
// A new backend adds its factory here (and its file to CMakeLists.txt).
#include "kernels/grouped_matmul/impl.h"

namespace tessera::grouped_matmul {

Registry& registry() {
  static Registry& r = Registry::leaked(kKernelName, [](Registry& reg) {
    // Default order: fastest first. Only implementations of the inputs' device are tried.
    // cuda.cu lives in the CUDA device module: declared here, registered by the module when a
    // CUDA device is first used; listed as unavailable, with the reason, where it cannot load.
    // cuda_v2 (every group in one grouped cuBLAS call) ahead of cuda (one GEMM per group, kept
    // for side-by-side timing and as cuda_v2's fallback); docs/kernels/grouped_matmul.md.
    reg.add_module_implementation("cuda_v2", DeviceType::kCUDA,
                                  "NVIDIA GPUs: all groups in one grouped cuBLAS call, from the CUDA module "
                                  "libtessera_cuda.so");
    reg.add_module_implementation("cuda", DeviceType::kCUDA,
                                  "NVIDIA GPUs: one cuBLAS GEMM per group, from the CUDA module libtessera_cuda.so");
#ifdef TESSERA_HAVE_CPU_BACKEND
    reg.add(make_cpu_implementation());
#endif
    reg.add(make_reference_implementation());
  });
  return r;
}

const Implementation* find_implementation(const std::string& name) { return registry().find(name); }

}  // namespace tessera::grouped_matmul
