// Tessera internal: CUDA runtime glue shared by the CUDA backends (only compiled when the CUDA
// backend is built). Errors become tessera::Error; device scratch is counted in
// memory::Space::kDevice; the DeviceAllocator for DeviceType::kCUDA is registered here.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "core/memory.h"

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

// Stream-ordered device scratch: cudaMallocAsync / cudaFreeAsync on `stream` where the device
// supports memory pools (no synchronization), else cudaMalloc / cudaFree. Counted through
// memory::note_alloc / note_free (Space::kDevice).
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

}  // namespace tessera::cuda
