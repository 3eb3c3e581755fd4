// Device halves of tests/cuda/sanitizer_probe_test.cc: a kernel that reads a buffer with the
// same 16-byte loads linear_cross_entropy's row_kernel uses on its logits scratch.
#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::testing {

__global__ void row_sums_kernel(const float* m, int64_t cols, int64_t ld, float* sums) {
  const float* row = m + blockIdx.x * ld;
  float s = 0.f;
  if (threadIdx.x == 0) {
    int64_t j = 0;
    for (; j + 4 <= cols; j += 4) {
      const float4 q = *reinterpret_cast<const float4*>(row + j);
      s += q.x + q.y + q.z + q.w;
    }
    for (; j < cols; ++j) s += row[j];
    sums[blockIdx.x] = s;
  }
}

void launch_row_sums(const float* m, int64_t rows, int64_t cols, int64_t ld, float* sums, cudaStream_t stream) {
  row_sums_kernel<<<static_cast<unsigned>(rows), 32, 0, stream>>>(m, cols, ld, sums);
}

}  // namespace tessera::testing
