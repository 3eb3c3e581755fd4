// Tessera primitives: f32 <-> storage dtype conversions for CUDA kernels (f32, bf16, f16; round to
// nearest even). Header-only, device code; included by the kernels' .cu files in the CUDA module.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace tessera::primitives::cuda {

// Overloads, not a template: an element read from a typed pointer picks its own.
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
// f8e4m3 (OCP E4M3, "e4m3fn"): exact in f32 (a KV cache's storage type; nothing is stored in it).
__device__ __forceinline__ float to_f32(__nv_fp8_e4m3 x) { return static_cast<float>(x); }

// from_f32<T>(x): x rounded to T (nearest even).
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

}  // namespace tessera::primitives::cuda
