// grouped_matmul, cuda backends (cuda.cu, cuda_v2.cu): the checks every CUDA kernel of Tessera
// makes before touching memory — the device exists and is new enough, and each pointer labelled
// cuda:N is reachable from that device (pageable host memory is not).
#pragma once

#include <cuda_runtime_api.h>

#include <climits>
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

// What both CUDA versions require of a call (their supports()): CUDA device memory, a usable
// device of compute capability 8.0+, and M, K, N — and G for a grouped call (`g_is_int`), whose
// group count is an int too — within cuBLAS's int.
inline Availability device_support(const Problem& p, const char* impl, bool g_is_int) {
  if (p.device.type != DeviceType::kCUDA)
    return Availability::no("inputs are on " + p.device.str() + "; grouped_matmul " + impl +
                            " needs CUDA device memory");
  if (std::string why = device_problem(p.device.index); !why.empty()) return Availability::no(why);
  if (p.M > INT_MAX || p.K > INT_MAX || p.N > INT_MAX || (g_is_int && p.G > INT_MAX))
    return Availability::no(std::string(g_is_int ? "M, K, N and G" : "M, K and N") +
                            " must each fit cuBLAS's int (<= 2^31 - 1)");
  return Availability::yes();
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
