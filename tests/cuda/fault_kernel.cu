// A kernel that faults on purpose (an illegal address), for the TESSERA_CUDA_SYNC_CHECK test in
// tests/cuda/sync_check_test.cc: only ever launched in a child process of that test.
#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::testing {

__global__ void faulting_kernel(int* p) { p[threadIdx.x] = 1; }

void launch_faulting_kernel(cudaStream_t stream) {
  faulting_kernel<<<1, 32, 0, stream>>>(reinterpret_cast<int*>(uintptr_t{16}));  // not a device address
}

}  // namespace tessera::testing
