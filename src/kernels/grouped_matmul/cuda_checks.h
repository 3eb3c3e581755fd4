// grouped_matmul, cuda backends (cuda.cu, cuda_v2.cu): the checks every CUDA kernel of Tessera
// makes before touching memory — the device exists and is new enough, and each pointer labelled
// cuda:N is reachable from that device (pageable host memory is not).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/cuda_util.h"
#include "kernels/grouped_matmul/impl.h"
#include "tessera/error.h"

namespace tessera::grouped_matmul::cuda_checks {

// bf16 GEMMs and the fatbin (sm_90a machine code + compute_80 PTX, which no older GPU can JIT).
constexpr int kMinComputeMajor = 8;

// "" when `device` can run the backend, else why not.
inline std::string device_problem(int device) {
  std::string why;
  const int count = cuda::device_count(&why);
  if (count == 0) return why;
  if (device >= count)
    return "cuda:" + std::to_string(device) + " does not exist (" + std::to_string(count) + " CUDA device(s))";
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "could not query the compute capability of cuda:" + std::to_string(device);
  }
  if (major < kMinComputeMajor)
    return "cuda:" + std::to_string(device) + " has compute capability " + std::to_string(major) + "." +
           std::to_string(minor) + "; the grouped_matmul cuda backends need 8.0 or newer";
  return {};
}

inline void check_accessible(const void* ptr, int device, const char* impl, const char* what) {
  cuda::require_accessible(ptr, device, std::string(kKernelName) + " (" + impl + ")", what);
}

// The operands of a call: a and (b or d) read, c written (null only for empty arrays, which
// is_device_accessible accepts).
inline void check_args(const Problem& p, const void* a, const void* bd, const void* c, const char* impl,
                       const char* bd_name) {
  check_accessible(a, p.device.index, impl, "lhs");
  check_accessible(bd, p.device.index, impl, bd_name);
  check_accessible(c, p.device.index, impl, "the output");
}

}  // namespace tessera::grouped_matmul::cuda_checks
