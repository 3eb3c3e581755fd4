// Tessera: CUDA runtime glue (see cuda_util.h).
#include "core/cuda_util.h"

#include <cuda_runtime.h>

#include <mutex>
#include <utility>
#include <vector>

#include "tessera/error.h"
#include "tessera/tensor.h"

namespace tessera::cuda {

void throw_error(cudaError_t e, const std::string& what) {
  (void)cudaGetLastError();  // clear a non-sticky error so later calls start clean
  const std::string msg = "CUDA error in " + what + ": " + cudaGetErrorName(e) + " (" +
                          cudaGetErrorString(e) + ")";
  throw Error(e == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kInternal, msg);
}

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device (cudaGetDeviceCount returned 0)";
  return n;
}

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&prev_), "cudaGetDevice");
  if (prev_ != device) {
    check(cudaSetDevice(device), "cudaSetDevice");
  } else {
    prev_ = -1;  // nothing to restore
  }
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) (void)cudaSetDevice(prev_);
}

namespace {

// Whether device `d` supports stream-ordered allocation (cached per device).
bool pools_supported(int d) {
  static std::mutex mu;
  static std::vector<int> cache;  // -1 unknown, 0 no, 1 yes
  std::lock_guard<std::mutex> lock(mu);
  if (d >= static_cast<int>(cache.size())) cache.resize(static_cast<size_t>(d) + 1, -1);
  if (cache[static_cast<size_t>(d)] < 0) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMemoryPoolsSupported, d) != cudaSuccess) {
      (void)cudaGetLastError();
      v = 0;
    }
    cache[static_cast<size_t>(d)] = v ? 1 : 0;
  }
  return cache[static_cast<size_t>(d)] == 1;
}

}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes, cudaStream_t stream, int device) : stream_(stream) {
  if (bytes == 0) return;
  async_ = pools_supported(device);
  cudaError_t e = async_ ? cudaMallocAsync(&ptr_, bytes, stream) : cudaMalloc(&ptr_, bytes);
  if (e != cudaSuccess) {
    ptr_ = nullptr;
    throw_error(e, "allocating " + std::to_string(bytes) + " bytes of device scratch");
  }
  bytes_ = bytes;
  memory::note_alloc(memory::Space::kDevice, bytes_);
}

void DeviceBuffer::release() noexcept {
  if (!ptr_) return;
  if (async_)
    (void)cudaFreeAsync(ptr_, stream_);
  else
    (void)cudaFree(ptr_);
  memory::note_free(memory::Space::kDevice, bytes_);
  ptr_ = nullptr;
  bytes_ = 0;
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      stream_(o.stream_),
      async_(o.async_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    stream_ = o.stream_;
    async_ = o.async_;
  }
  return *this;
}

bool is_device_accessible(const void* ptr, int device) {
  if (ptr == nullptr) return true;  // empty tensors: nothing is dereferenced
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  switch (a.type) {
    case cudaMemoryTypeDevice: return a.device == device;
    case cudaMemoryTypeManaged: return true;
    case cudaMemoryTypeHost: return a.devicePointer != nullptr;
    default: return false;  // cudaMemoryTypeUnregistered: pageable host memory
  }
}

// ---- the DeviceAllocator for Tensor on cuda ----

namespace {

void* allocate(size_t bytes, int device) {
  DeviceGuard g(device);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) throw_error(e, "cudaMalloc of " + std::to_string(bytes) + " bytes on cuda:" + std::to_string(device));
  return p;
}

void deallocate(void* p, int device) {
  if (!p) return;
  int prev = -1;
  if (cudaGetDevice(&prev) == cudaSuccess && prev != device) (void)cudaSetDevice(device);
  (void)cudaFree(p);  // never throws from a deleter
  if (prev >= 0 && prev != device) (void)cudaSetDevice(prev);
}

void copy(void* dst, const void* src, size_t bytes, int kind, int device) {
  DeviceGuard g(device);
  const cudaMemcpyKind k = kind == 0 ? cudaMemcpyHostToDevice
                           : kind == 1 ? cudaMemcpyDeviceToHost
                                       : cudaMemcpyDeviceToDevice;
  // Synchronous with respect to the host (Tensor::to returns a usable tensor); cudaMemcpy on
  // the legacy default stream also waits for work queued there.
  check(cudaMemcpy(dst, src, bytes, k), "cudaMemcpy (Tensor::to)");
  // cudaMemcpy may return before the data has landed (device-to-device copies; pageable
  // host-to-device copies return once staged). Finish it so that work on any stream, also a
  // non-blocking one, sees the copy.
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
}

void fill(void* p, int value, size_t bytes, int device) {
  DeviceGuard g(device);
  check(cudaMemset(p, value, bytes), "cudaMemset (Tensor::zeros / zero_fill)");
  // cudaMemset is asynchronous; finish it so that kernels on non-blocking streams see zeros.
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
}

std::once_flag g_registered;

// Registration at load time for programs that link this object; the factories call
// register_allocator() too.
[[maybe_unused]] const bool g_static_registration = [] {
  register_allocator();
  return true;
}();

}  // namespace

void register_allocator() {
  std::call_once(g_registered, [] {
    DeviceAllocator a;
    a.allocate = allocate;
    a.deallocate = deallocate;
    a.copy = copy;
    a.memset = fill;
    register_device_allocator(DeviceType::kCUDA, std::move(a));
  });
}

}  // namespace tessera::cuda
