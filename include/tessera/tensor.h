// Tessera: non-owning TensorView and owning Tensor.
//
// A TensorView names memory it does not own: data pointer, dtype, shape and strides (in
// elements, row-major by default) and the device the memory lives on. Kernels take views; the
// caller keeps the memory alive for the call. Tensor owns its memory (host, or a device whose
// backend registered an allocator) and hands out views.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tessera/dtype.h"

namespace tessera {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;  // "cpu", "cuda:0"
};

using Shape = std::vector<int64_t>;

// Row-major strides for `shape`, in elements.
Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);  // product of dims; 1 for a 0-d shape
std::string shape_str(const Shape& shape);  // "[2, 3]"

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Shape strides;  // elements; same length as shape
  Device device;

  TensorView() = default;
  // Contiguous row-major view.
  TensorView(void* data, DType dtype, Shape shape, Device device = {});
  // Arbitrary strides (elements).
  TensorView(void* data, DType dtype, Shape shape, Shape strides, Device device = {});

  int64_t ndim() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const { return shape_numel(shape); }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  bool is_contiguous() const;      // row-major dense (size-1 dims may have any stride)
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  std::string str() const;         // "bf16[8, 16] cpu"

  template <class T>
  T* data_as() const {
    return static_cast<T*>(data);
  }
};

// Direction of a DeviceAllocator copy.
enum class CopyKind : unsigned char { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// Allocator hooks for a device type: backends that own a device register one. A device
// backend is a module loaded on first use: the first allocation or copy on its device type (or
// has_device_allocator) loads it; without it (no driver, not built) those throw kUnsupported
// saying why.
struct DeviceAllocator {
  std::function<void*(size_t bytes, int device_index)> allocate;
  std::function<void(void* ptr, int device_index)> deallocate;
  // Copies `bytes` between host and device memory, finished when it returns.
  std::function<void(void* dst, const void* src, size_t bytes, CopyKind kind, int device_index)> copy;
  std::function<void(void* ptr, int value, size_t bytes, int device_index)> memset;
  // Waits for the work queued so far on `stream` (a cudaStream_t; nullptr: the default stream).
  std::function<void(void* stream, int device_index)> synchronize;
  // The index of the device whose memory `ptr` points into, or -1 (not this device type's).
  std::function<int(const void* ptr)> device_of;
};
void register_device_allocator(DeviceType type, DeviceAllocator allocator);
bool has_device_allocator(DeviceType type);
// Through the allocator of `device`'s type (its module loaded on first use; kUnsupported without
// one): synchronize(device, stream) waits for `stream`'s queued work; device_index_of(type, ptr) is
// the device index `ptr` lives on, or -1. For callers that hold another library's stream and
// buffers (the XLA FFI handler) without linking a device runtime.
void synchronize(Device device, void* stream);
int device_index_of(DeviceType type, const void* ptr);

// Sets every byte of a contiguous view to zero (host memset, or the device allocator's memset).
void zero_fill(const TensorView& t);

class Tensor {
 public:
  Tensor() = default;
  // Uninitialized storage. Throws Error(kUnsupported) for a device with no allocator,
  // Error(kOutOfMemory) when the allocation fails.
  static Tensor empty(DType dtype, Shape shape, Device device = {});
  static Tensor zeros(DType dtype, Shape shape, Device device = {});
  // Uninitialized storage of `dtype` with the shape, device and memory layout of `like`: row-major
  // when `like` is contiguous, the same transposed layout when `like` is a transposed 2-D view of
  // a contiguous array (e.g. a gradient in a weight's layout). Other strides: Error(kInvalidArgument).
  static Tensor empty_like_layout(const TensorView& like, DType dtype);
  // A tensor over memory it does not own (a caller's contiguous view): the caller keeps the
  // memory alive as long as any copy of the tensor. Error(kInvalidArgument) if not contiguous.
  static Tensor borrow(const TensorView& v);

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: views are the currency
  void* data() const { return view_.data; }
  template <class T>
  T* data_as() const {
    return static_cast<T*>(view_.data);
  }
  DType dtype() const { return view_.dtype; }
  const Shape& shape() const { return view_.shape; }
  int64_t numel() const { return view_.numel(); }
  const Device& device() const { return view_.device; }
  bool defined() const { return static_cast<bool>(storage_); }

  // Host copy / device copy (contiguous). Same-device copies are deep copies.
  Tensor to(Device device) const;
  // A tensor sharing this storage with another shape / strides (e.g. a transposed view).
  // Throws Error(kInvalidArgument) if the view would reach outside the storage.
  Tensor as_strided(Shape shape, Shape strides) const;

 private:
  std::shared_ptr<void> storage_;
  size_t storage_bytes_ = 0;
  TensorView view_;
};

}  // namespace tessera
