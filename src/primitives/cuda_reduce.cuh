// Tessera primitives: warp and block reductions for CUDA kernels (every lane / thread gets the
// result). Header-only, device code; included by the kernels' .cu files in the CUDA module.
#pragma once

#include <cuda_runtime.h>

namespace tessera::primitives::cuda {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly all-reduce over the 32 lanes of a full warp: op(a, b) must be associative and
// commutative; every lane returns the reduction of all 32 values.
template <class T, class Op>
__device__ __forceinline__ T warp_allreduce(T x, Op op) {
  for (int o = kWarpSize / 2; o > 0; o /= 2) x = op(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  return warp_allreduce(x, [](float a, float b) { return fmaxf(a, b); });
}
__device__ __forceinline__ float warp_sum(float x) {
  return warp_allreduce(x, [](float a, float b) { return a + b; });
}

// All-reduce over a block of blockDim.x threads (a multiple of 32, at most 1024): `scratch`
// holds 32 values in shared memory. Every thread of the block must call it; it synchronizes.
template <class Op>
__device__ __forceinline__ float block_allreduce(float x, float identity, float* scratch, Op op) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  x = warp_allreduce(x, op);
  __syncthreads();  // scratch may hold a previous call's values
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : identity;
  return warp_allreduce(x, op);
}

__device__ __forceinline__ float block_sum(float x, float* scratch) {
  return block_allreduce(x, 0.0f, scratch, [](float a, float b) { return a + b; });
}
__device__ __forceinline__ float block_max(float x, float* scratch) {
  return block_allreduce(x, -__int_as_float(0x7f800000), scratch, [](float a, float b) { return fmaxf(a, b); });
}

}  // namespace tessera::primitives::cuda
