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

// The tuner's device kind of cuda:`index` (tune/device_kind.h): "cuda:<name>:<SMs>sm", cached
// per device; throws Error when the device cannot be queried. Registered by the module's entry.
std::string device_kind(int index);

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

// ---- launch checks (TESSERA_CUDA_SYNC_CHECK) ----

// Whether TESSERA_CUDA_SYNC_CHECK=1 (read once per process): then check_launch synchronizes the
// launch's stream and checks it, so that a kernel's fault is reported by the call that launched
// it, naming the kernel, instead of by a later unrelated CUDA call (debugging; slow).
bool sync_check_enabled();
// After a kernel launch on `stream`: throws Error naming `kernel` when the launch failed
// (cudaGetLastError); with sync_check_enabled() also synchronizes `stream` and throws naming
// `kernel` when the kernel faulted.
void check_launch(const char* kernel, cudaStream_t stream);
// The one-line message of a launch failure (host logic; `after_sync`: found by the sync check).
std::string launch_error_message(const std::string& kernel, const std::string& error_name,
                                 const std::string& error_string, bool after_sync);

// ---- device scratch ----

// Bytes of freed scratch the pool keeps mapped across synchronizations (its release threshold):
// $TESSERA_CUDA_POOL_KEEP_MIB MiB when set (0 = give everything back at each synchronization),
// else kDefaultPoolKeep, the backends' default memory budget. A call's scratch beyond it (the
// f32 dw accumulator of linear_cross_entropy: 2.1 GB at H=4096, V=128256) is returned to the
// driver at the next synchronization instead of being kept for the life of the process.
inline constexpr uint64_t kDefaultPoolKeep = uint64_t{1} << 30;
uint64_t pool_keep_bytes(int env_mib);  // env_mib < 0: unset
uint64_t pool_keep_bytes();             // from the environment

// The stream-ordered pool that DeviceBuffer allocates from on `device` (created on first use,
// kept for the life of the process), or nullptr where the device has no memory-pool support.
// Its release threshold is pool_keep_bytes(): freed scratch up to that stays mapped for the
// next call instead of being returned to the driver at every synchronization (the default
// pool's threshold is 0, which unmaps and remaps ~1 GiB per training step).
cudaMemPool_t scratch_pool(int device);

// Returns unused memory of the scratch pool of `device` to the driver until at most `keep`
// bytes stay reserved (cudaMemPoolTrimTo; memory still in use or not yet freed in stream order
// stays). No-op without a pool. Never throws.
void trim_scratch(int device, uint64_t keep);

// One allocation attempt, then, when it failed with cudaErrorMemoryAllocation only, `recover()`
// (synchronize the device and trim the pool: memory freed in stream order on other streams, and
// memory the pool keeps, become available) and one more attempt. Host logic, tested with fakes.
template <class Try, class Recover>
cudaError_t allocate_with_retry(Try try_alloc, Recover recover) {
  const cudaError_t e = try_alloc();
  if (e != cudaErrorMemoryAllocation) return e;
  recover();
  return try_alloc();
}

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

// Copies `bytes` of host memory at `src` (pageable or pinned) to device memory `dst` on
// `stream` through a pinned staging buffer that Tessera owns; returns once `src` may be changed
// or freed (its bytes are in the staging buffer), the copy itself stream-ordered. A staging
// buffer is reused only once the event recorded behind its copy has completed, so neither the
// caller's memory nor a staging buffer is read after it changed. A stream being captured into a
// CUDA graph is refused (Error kUnsupported naming `what`): the graph would replay a copy of
// whatever the staging buffer then holds.
void copy_host_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream, int device, const char* what);

// "" when `stream` is not being captured into a CUDA graph, else why a call that must not be
// captured is refused (`because`: what the call does that a capture cannot record).
std::string capture_refusal(cudaStream_t stream, const std::string& because);

// True when `ptr` can be dereferenced by kernels on `device` (device or managed memory, or
// host memory registered / allocated with cudaHostAlloc). Pageable host memory gives false.
bool is_device_accessible(const void* ptr, int device);
// Throws Error(kInvalidArgument) "<who>: <what> is labelled cuda:N but its memory is not
// accessible from that device (...)" unless is_device_accessible(ptr, device).
void require_accessible(const void* ptr, int device, const std::string& who, const std::string& what);

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
