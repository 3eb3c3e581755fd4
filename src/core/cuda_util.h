// Tessera internal: CUDA runtime and cuBLAS glue shared by the CUDA backends and the harness
// hooks (only compiled when the CUDA backend is built). Errors become tessera::Error; device
// scratch comes from one stream-ordered pool per device and is counted in memory::Space::kDevice;
// cuBLAS handles are leased from one pool per device; the DeviceAllocator for DeviceType::kCUDA
// is registered here.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/memory.h"
#include "tessera/dtype.h"

namespace tessera::cuda {

// Registers the DeviceAllocator for DeviceType::kCUDA (cudaMalloc / cudaFree / cudaMemcpy /
// cudaMemset). Idempotent and cheap; touches no CUDA API itself, so it is safe to call on a
// machine without a GPU. Called from a static initializer of cuda_util.cu and from every CUDA
// implementation factory (a static library's initializers alone may be dropped by the linker).
void register_allocator();

// Registers the harness's DeviceHooks for DeviceType::kCUDA (harness/device_hooks.h: device
// count, synchronize, measured ceilings through cuBLAS and copies, the GEMM baseline; in
// cuda_device_hooks.cu). Idempotent, touches no CUDA API; called like register_allocator().
void register_device_hooks();

// Number of usable CUDA devices; 0 with `why` filled when there is none or no driver.
int device_count(std::string* why = nullptr);

// Throws Error: kOutOfMemory for cudaErrorMemoryAllocation, else kInternal, naming `what`.
[[noreturn]] void throw_error(cudaError_t e, const std::string& what);
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_error(e, what);
}

// Makes `device` current for the scope, restoring the previous device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// The stream-ordered pool that DeviceBuffer allocates from on `device` (created on first use,
// kept for the life of the process), or nullptr where the device has no memory-pool support.
// Its release threshold keeps freed scratch mapped for the next call instead of returning it to
// the driver at every synchronization (the default pool's threshold is 0, which unmaps and
// remaps ~1 GiB per training step): all of it by default, at most $TESSERA_CUDA_POOL_KEEP_MIB
// MiB when that is set (0 = give everything back, the old behaviour).
cudaMemPool_t scratch_pool(int device);

// Stream-ordered device scratch: allocated from scratch_pool(device) on `stream`
// (cudaMallocFromPoolAsync / cudaFreeAsync, no synchronization) where the device supports memory
// pools, else cudaMalloc / cudaFree. Counted through memory::note_alloc / note_free
// (Space::kDevice).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, cudaStream_t stream, int device);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void release() noexcept;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  bool async_ = false;
};

// True when `ptr` can be dereferenced by kernels on `device` (device or managed memory, or
// host memory registered / allocated with cudaHostAlloc). Pageable host memory gives false.
bool is_device_accessible(const void* ptr, int device);

// ---- cuBLAS ----

// Throws Error naming `what`: kOutOfMemory for CUBLAS_STATUS_ALLOC_FAILED, else kInternal.
void blas_check(cublasStatus_t s, const char* what);

// The cuBLAS data type of a float DType (f32, bf16, f16); Error(kInvalidArgument) otherwise.
cudaDataType blas_type(DType t);

// CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 for f32 operands when TESSERA_CUDA_TF32=1
// (the one switch both the backend and the harness's GEMM baseline read).
cublasComputeType_t blas_compute(DType operands);

// A cuBLAS handle leased for one call from a per-device pool: handles are created on demand,
// returned to the pool by the destructor and reused by any thread, so their number is the peak
// number of concurrent calls, not the number of threads that ever called (thread-local handles
// leaked one per exited thread). Pooled handles are never destroyed: destroying them during
// process teardown races the CUDA runtime's own teardown. Every lease comes configured the same
// way: `stream`, host pointer mode, f32 accumulation also inside split-K reductions
// (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION), cuBLAS's default workspace until
// set_workspace is called.
class BlasHandle {
 public:
  BlasHandle(int device, cudaStream_t stream);
  ~BlasHandle();
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;

  cublasHandle_t get() const { return h_; }
  // Makes the GEMMs of this lease use `bytes` of caller-owned (counted) scratch at `p`
  // (256-byte aligned, at least 16 KiB) instead of cuBLAS's own workspace.
  void set_workspace(void* p, size_t bytes);

 private:
  void give_back() noexcept;
  cublasHandle_t h_ = nullptr;
  int device_ = 0;
};

// Number of cuBLAS handles the pool of `device` has created so far (tests).
size_t blas_handles_created(int device);

// Column-major C[m,n] = alpha·op(A)[m,k]·op(B)[k,n] + beta·C with host scalars (cublasGemmEx,
// CUBLAS_GEMM_DEFAULT). Dimensions are 64-bit here and checked against cuBLAS's int range.
struct GemmOperand {
  const void* ptr;
  cudaDataType type;
  int64_t ld;
};
void gemm_ex(cublasHandle_t h, cublasComputeType_t compute, cublasOperation_t ta, cublasOperation_t tb, int64_t m,
             int64_t n, int64_t k, float alpha, GemmOperand a, GemmOperand b, float beta, void* c, cudaDataType ct,
             int64_t ldc, const char* what);

}  // namespace tessera::cuda
