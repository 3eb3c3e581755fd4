// Tessera: CUDA runtime glue (see cuda_util.h).
#include "core/cuda_util.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/log.h"
#include "tessera/error.h"
#include "tessera/tensor.h"
#include "tune/device_kind.h"

namespace tessera::cuda {

void throw_error(cudaError_t e, const std::string& what) {
  (void)cudaGetLastError();  // clear a non-sticky error so later calls start clean
  const std::string msg = "CUDA error in " + what + ": " + cudaGetErrorName(e) + " (" +
                          cudaGetErrorString(e) + ")";
  throw Error(e == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kInternal, msg);
}

// ---- launch checks ----

bool sync_check_enabled() {
  static const bool on = env::flag("TESSERA_CUDA_SYNC_CHECK", false);
  return on;
}

std::string launch_error_message(const std::string& kernel, const std::string& error_name,
                                 const std::string& error_string, bool after_sync) {
  return "CUDA error in " + kernel +
         (after_sync ? " (found by TESSERA_CUDA_SYNC_CHECK=1 when its stream was synchronized right after the launch)"
                     : " (launch)") +
         ": " + error_name + " (" + error_string + ")";
}

namespace {

[[noreturn]] void throw_launch_error(cudaError_t e, const char* kernel, bool after_sync) {
  (void)cudaGetLastError();
  throw Error(e == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kInternal,
              launch_error_message(kernel, cudaGetErrorName(e), cudaGetErrorString(e), after_sync));
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // cannot tell: do nothing that would break a capture
  }
  return st != cudaStreamCaptureStatusNone;
}

}  // namespace

void check_launch(const char* kernel, cudaStream_t stream) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_launch_error(e, kernel, false);
  if (!sync_check_enabled() || capturing(stream)) return;  // a capture cannot be synchronized
  const cudaError_t s = cudaStreamSynchronize(stream);
  if (s != cudaSuccess) throw_launch_error(s, kernel, true);
}

std::string capture_refusal(cudaStream_t stream, const std::string& because) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(stream, &st);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cannot tell whether the stream is being captured into a CUDA graph (cudaStreamIsCapturing: ") +
           cudaGetErrorString(e) + "; the legacy stream while another stream captures?)";
  }
  if (st == cudaStreamCaptureStatusNone) return "";
  return "the stream is being captured into a CUDA graph, and " + because +
         ", which a capture cannot record: call it outside the capture";
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

std::string device_kind(int index) {
  static std::mutex mu;
  static std::map<int, std::string> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find(index);
  if (it != cache.end()) return it->second;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties (device kind)");
  return cache[index] = tune::gpu_device_kind("cuda", prop.name, prop.multiProcessorCount);
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

cudaMemPool_t create_pool(int d) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = d;
  cudaMemPool_t pool = nullptr;
  check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate (device scratch pool)");
  uint64_t keep = pool_keep_bytes();
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
        "cudaMemPoolSetAttribute (release threshold of the scratch pool)");
  return pool;
}

}  // namespace

uint64_t pool_keep_bytes(int env_mib) { return env_mib < 0 ? kDefaultPoolKeep : static_cast<uint64_t>(env_mib) << 20; }

uint64_t pool_keep_bytes() {
  static const uint64_t keep = pool_keep_bytes(env::integer("TESSERA_CUDA_POOL_KEEP_MIB", -1));
  return keep;
}

void trim_scratch(int device, uint64_t keep) {
  if (!pools_supported(device)) return;
  if (cudaMemPoolTrimTo(scratch_pool(device), static_cast<size_t>(std::min<uint64_t>(keep, SIZE_MAX))) != cudaSuccess)
    (void)cudaGetLastError();
}

cudaMemPool_t scratch_pool(int device) {
  if (!pools_supported(device)) return nullptr;
  static std::mutex mu;
  static std::vector<cudaMemPool_t> pools;  // never destroyed (teardown order), one per device
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(pools.size())) pools.resize(static_cast<size_t>(device) + 1, nullptr);
  cudaMemPool_t& p = pools[static_cast<size_t>(device)];
  if (!p) p = create_pool(device);
  return p;
}

DeviceBuffer::DeviceBuffer(size_t bytes, cudaStream_t stream, int device) : stream_(stream) {
  if (bytes == 0) return;
  cudaMemPool_t pool = scratch_pool(device);
  async_ = pool != nullptr;
  auto attempt = [&] {
    return async_ ? cudaMallocFromPoolAsync(&ptr_, bytes, pool, stream) : cudaMalloc(&ptr_, bytes);
  };
  // On out-of-memory: let frees queued on other streams land and give back what the pool keeps,
  // then try once more (not while the stream is captured: a capture cannot be synchronized).
  auto recover = [&] {
    (void)cudaGetLastError();
    if (capturing(stream)) return;
    log::warn_once("CUDA scratch allocation of " + std::to_string(bytes) +
                   " bytes ran out of memory; synchronizing the device, trimming the scratch pool and retrying once");
    (void)cudaDeviceSynchronize();
    if (pool) (void)cudaMemPoolTrimTo(pool, 0);
    (void)cudaGetLastError();
  };
  const cudaError_t e = allocate_with_retry(attempt, recover);
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

// ---- host-to-device copies through owned pinned staging buffers ----

namespace {

struct Staging {
  int device = 0;
  void* host = nullptr;       // pinned (cudaHostAlloc), never freed (teardown order)
  size_t capacity = 0;
  cudaEvent_t done = nullptr; // recorded behind the last copy out of `host`
  bool busy = false;          // being filled by a caller right now
};

struct StagingPool {
  std::mutex mu;
  std::vector<Staging*> slots;  // never destroyed
};

StagingPool& staging_pool() {
  static StagingPool* p = new StagingPool;
  return *p;
}

// True when the slot's last copy has completed (or it never had one).
bool slot_idle(const Staging& s) {
  const cudaError_t e = cudaEventQuery(s.done);
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) (void)cudaGetLastError();
  return false;
}

// A free slot of `device` holding at least `bytes`, marked busy; a new one when none is free.
Staging* acquire_staging(int device, size_t bytes) {
  StagingPool& pool = staging_pool();
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    for (Staging* s : pool.slots)
      if (s->device == device && !s->busy && s->capacity >= bytes && slot_idle(*s)) {
        s->busy = true;
        return s;
      }
  }
  auto s = std::make_unique<Staging>();
  s->device = device;
  s->capacity = std::max<size_t>(bytes, 4096);
  check(cudaHostAlloc(&s->host, s->capacity, cudaHostAllocPortable), "cudaHostAlloc (staging buffer)");
  const cudaError_t e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    (void)cudaFreeHost(s->host);
    throw_error(e, "cudaEventCreateWithFlags (staging buffer)");
  }
  s->busy = true;
  std::lock_guard<std::mutex> lock(pool.mu);
  pool.slots.push_back(s.get());
  return s.release();
}

void release_staging(Staging* s) {
  std::lock_guard<std::mutex> lock(staging_pool().mu);
  s->busy = false;
}

}  // namespace

void copy_host_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream, int device, const char* what) {
  if (bytes == 0) return;
  const std::string refusal =
      capture_refusal(stream, std::string(what) + " copies host memory through a staging buffer");
  if (!refusal.empty()) throw Error(ErrorCode::kUnsupported, std::string(what) + ": " + refusal);
  Staging* s = acquire_staging(device, bytes);
  struct Release {
    Staging* s;
    ~Release() { release_staging(s); }
  } release{s};
  std::memcpy(s->host, src, bytes);
  check(cudaMemcpyAsync(dst, s->host, bytes, cudaMemcpyHostToDevice, stream), what);
  check(cudaEventRecord(s->done, stream), "cudaEventRecord (staging buffer)");
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

void require_accessible(const void* ptr, int device, const std::string& who, const std::string& what) {
  if (!is_device_accessible(ptr, device))
    throw Error(ErrorCode::kInvalidArgument, who + ": " + what + " is labelled cuda:" + std::to_string(device) +
                                                 " but its memory is not accessible from that device "
                                                 "(pageable host memory or another device?)");
}

// ---- cuBLAS ----

void blas_check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw Error(s == CUBLAS_STATUS_ALLOC_FAILED ? ErrorCode::kOutOfMemory : ErrorCode::kInternal,
              std::string("cuBLAS error in ") + what + ": " + cublasGetStatusString(s));
}

cudaDataType blas_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: throw Error(ErrorCode::kInvalidArgument, std::string("no cuBLAS data type for ") + dtype_name(t));
  }
}

cublasComputeType_t blas_compute(DType operands) {
  const bool tf32 = operands == DType::kF32 && env::flag("TESSERA_CUDA_TF32", false);
  return tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

namespace {

struct HandlePool {
  std::mutex mu;
  std::vector<std::vector<cublasHandle_t>> idle;  // per device
  std::vector<size_t> created;                    // per device
  void fit(int d) {
    if (d >= static_cast<int>(idle.size())) {
      idle.resize(static_cast<size_t>(d) + 1);
      created.resize(static_cast<size_t>(d) + 1, 0);
    }
  }
};

HandlePool& handle_pool() {
  static HandlePool* pool = new HandlePool;  // never destroyed: see BlasHandle
  return *pool;
}

void configure(cublasHandle_t h, cudaStream_t stream) {
  blas_check(cublasSetStream(h, stream), "cublasSetStream");  // also resets the workspace
  blas_check(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
  blas_check(cublasSetMathMode(h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                            CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
             "cublasSetMathMode");
}

}  // namespace

BlasHandle::BlasHandle(int device, cudaStream_t stream) : device_(device) {
  HandlePool& pool = handle_pool();
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    pool.fit(device);
    auto& idle = pool.idle[static_cast<size_t>(device)];
    if (!idle.empty()) {
      h_ = idle.back();
      idle.pop_back();
    }
  }
  if (!h_) {
    DeviceGuard g(device);  // a handle belongs to the device current at its creation
    blas_check(cublasCreate(&h_), "cublasCreate");
    std::lock_guard<std::mutex> lock(pool.mu);
    ++pool.created[static_cast<size_t>(device)];
  }
  try {
    configure(h_, stream);
  } catch (...) {
    give_back();  // the handle itself is fine
    throw;
  }
}

BlasHandle::~BlasHandle() { give_back(); }

void BlasHandle::give_back() noexcept {
  if (!h_) return;
  HandlePool& pool = handle_pool();
  std::lock_guard<std::mutex> lock(pool.mu);
  pool.idle[static_cast<size_t>(device_)].push_back(h_);
  h_ = nullptr;
}

void BlasHandle::set_workspace(void* p, size_t bytes) { blas_check(cublasSetWorkspace(h_, p, bytes), "cublasSetWorkspace"); }

size_t blas_handles_created(int device) {
  HandlePool& pool = handle_pool();
  std::lock_guard<std::mutex> lock(pool.mu);
  return device < static_cast<int>(pool.created.size()) ? pool.created[static_cast<size_t>(device)] : 0;
}

namespace {

int blas_int(int64_t v, const char* dim, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw Error(ErrorCode::kInternal, std::string(what) + ": " + dim + " = " + std::to_string(v) +
                                          " is outside the cuBLAS int range");
  return static_cast<int>(v);
}

}  // namespace

void gemm_ex(cublasHandle_t h, cublasComputeType_t compute, cublasOperation_t ta, cublasOperation_t tb, int64_t m,
             int64_t n, int64_t k, float alpha, GemmOperand a, GemmOperand b, float beta, void* c, cudaDataType ct,
             int64_t ldc, const char* what) {
  blas_check(cublasGemmEx(h, ta, tb, blas_int(m, "m", what), blas_int(n, "n", what), blas_int(k, "k", what), &alpha,
                          a.ptr, a.type, blas_int(a.ld, "lda", what), b.ptr, b.type, blas_int(b.ld, "ldb", what), &beta,
                          c, ct, blas_int(ldc, "ldc", what), compute, CUBLAS_GEMM_DEFAULT),
             what);
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

void copy(void* dst, const void* src, size_t bytes, CopyKind kind, int device) {
  DeviceGuard g(device);
  const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
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

void synchronize_stream(void* stream, int device) {
  DeviceGuard g(device);
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize (tessera::synchronize)");
}

// Host memory CUDA does not know is cudaMemoryTypeUnregistered (a success); an invalid value
// (null) is -1 too; any other error (no device, a sticky fault left by earlier work) is thrown.
int device_of(const void* ptr) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, ptr);
  if (e == cudaErrorInvalidValue) {
    (void)cudaGetLastError();  // not sticky: cleared so that it is not reported later
    return -1;
  }
  if (e != cudaSuccess) throw_error(e, "cudaPointerGetAttributes (tessera::device_index_of)");
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
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
    a.synchronize = synchronize_stream;
    a.device_of = device_of;
    register_device_allocator(DeviceType::kCUDA, std::move(a));
  });
}

}  // namespace tessera::cuda
