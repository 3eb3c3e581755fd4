// Tessera core: error names, dtypes, devices, tensors.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "core/device_module.h"
#include "core/memory.h"
#include "tessera/dtype.h"
#include "tessera/error.h"
#include "tessera/tensor.h"
#include "tessera/version.h"

namespace tessera {

const char* version() noexcept { return TESSERA_VERSION; }

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kOutOfMemory: return "out of memory";
    case ErrorCode::kIo: return "i/o error";
    case ErrorCode::kInternal: return "internal error";
  }
  return "error";
}

size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kF8E4M3: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) noexcept {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kF8E4M3: return "f8e4m3";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "float16" || name == "half") return DType::kF16;
  if (name == "i32" || name == "int32") return DType::kI32;
  if (name == "i64" || name == "int64") return DType::kI64;
  if (name == "f8e4m3" || name == "float8_e4m3fn" || name == "f8_e4m3fn") return DType::kF8E4M3;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown dtype '" + std::string(name) + "' (expected f32, bf16, f16, i32, i64 or f8e4m3)");
}

std::string Device::str() const {
  return type == DeviceType::kCPU ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Shape contiguous_strides(const Shape& shape) {
  Shape s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    // A zero dim makes the tensor empty but not its strides: (0, 2^40, 2^40) has none to
    // represent, and would overflow here.
    if (__builtin_mul_overflow(acc, std::max<int64_t>(shape[i], 1), &acc))
      throw Error(ErrorCode::kInvalidArgument, "shape " + shape_str(shape) + " has strides past 2^63 elements");
  }
  return s;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n))
      throw Error(ErrorCode::kInvalidArgument, "shape " + shape_str(shape) + " has more than 2^63 elements");
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

TensorView::TensorView(void* d, DType t, Shape s, Device dev)
    : data(d), dtype(t), shape(std::move(s)), device(dev) {
  strides = contiguous_strides(shape);
}

TensorView::TensorView(void* d, DType t, Shape s, Shape st, Device dev)
    : data(d), dtype(t), shape(std::move(s)), strides(std::move(st)), device(dev) {
  check(strides.size() == shape.size(), ErrorCode::kInvalidArgument,
        "TensorView: strides " + shape_str(strides) + " do not match shape " + shape_str(shape));
}

int64_t TensorView::size(int64_t dim) const {
  const int64_t n = ndim();
  const int64_t d = dim < 0 ? dim + n : dim;
  check(d >= 0 && d < n, ErrorCode::kInvalidArgument,
        "dimension " + std::to_string(dim) + " out of range for a " + std::to_string(n) +
            "-d tensor");
  return shape[static_cast<size_t>(d)];
}

bool TensorView::is_contiguous() const {
  if (strides.size() != shape.size()) return false;
  // No element to address (a zero dim): every strides describe it, as in NumPy and PyTorch
  // (contiguous_strides() gives such a tensor the strides of its nonzero dims).
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return true;
  int64_t expect = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

std::string TensorView::str() const {
  return std::string(dtype_name(dtype)) + shape_str(shape) + " " + device.str();
}

namespace {
std::mutex g_alloc_mu;
std::unordered_map<int, DeviceAllocator>& allocators() {
  static std::unordered_map<int, DeviceAllocator> m;
  return m;
}
}  // namespace

void register_device_allocator(DeviceType type, DeviceAllocator allocator) {
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  allocators()[static_cast<int>(type)] = std::move(allocator);
}

namespace {
bool allocator_registered(DeviceType type) {
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  return allocators().count(static_cast<int>(type)) > 0;
}
}  // namespace

// A device's allocator comes from its backend module, loaded here on first use (never for the
// host; never with g_alloc_mu held: the module registers its allocator while loading).
bool has_device_allocator(DeviceType type) {
  if (type != DeviceType::kCPU && !allocator_registered(type)) (void)device_module::load(type);
  return allocator_registered(type);
}

static DeviceAllocator get_allocator(DeviceType type) {
  std::string why;
  if (!allocator_registered(type)) {
    const device_module::Status& s = device_module::load(type);
    why = s.loaded ? "its module registered none" : s.reason;
  }
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  auto it = allocators().find(static_cast<int>(type));
  if (it == allocators().end())
    throw Error(ErrorCode::kUnsupported,
                "no allocator for device type " + Device{type, 0}.str() + ": " + why);
  return it->second;
}

Tensor Tensor::empty(DType dtype, Shape shape, Device device) {
  for (int64_t d : shape)  // the message is built only for a failure (a loop over many dims)
    if (d < 0) throw Error(ErrorCode::kInvalidArgument, "negative dimension in " + shape_str(shape));
  Tensor t;
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(shape_numel(shape)), dtype_size(dtype), &bytes) ||
      bytes > std::numeric_limits<size_t>::max() / 2)
    throw Error(ErrorCode::kOutOfMemory, std::string("a ") + dtype_name(dtype) + shape_str(shape) +
                                             " tensor has more bytes than a 64-bit size can hold");
  const size_t alloc_bytes = std::max<size_t>(bytes, 64);
  // Named only on the error paths (an allocation is often on a hot path).
  auto what = [&] { return std::string("a ") + dtype_name(dtype) + shape_str(shape) + " tensor"; };
  try {
    if (device.type == DeviceType::kCPU) {
      if (!memory::host_fits(bytes)) memory::check_host_fits(bytes, what());
      void* p = std::aligned_alloc(64, (alloc_bytes + 63) / 64 * 64);
      if (!p)
        throw Error(ErrorCode::kOutOfMemory, "could not allocate " + memory::bytes_str(bytes) + " on the host for " + what());
      t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });  // frees p if it throws
    } else {
      DeviceAllocator a = get_allocator(device.type);
      void* p = a.allocate(alloc_bytes, device.index);
      const int idx = device.index;
      auto dealloc = a.deallocate;
      t.storage_ = std::shared_ptr<void>(p, [dealloc, idx](void* q) { dealloc(q, idx); });
    }
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kOutOfMemory, "could not allocate " + memory::bytes_str(bytes) + " for " + what());
  }
  t.storage_bytes_ = bytes;
  t.view_ = TensorView(t.storage_.get(), dtype, std::move(shape), device);
  return t;
}

Tensor Tensor::empty_like_layout(const TensorView& like, DType dtype) {
  if (like.is_contiguous()) return empty(dtype, like.shape, like.device);
  const Shape& s = like.shape;
  check(s.size() == 2 && like.strides == Shape{1, s[0]}, ErrorCode::kInvalidArgument,
        "empty_like_layout: " + like.str() + " with strides " + shape_str(like.strides) +
            " is neither contiguous nor a transposed 2-D view of a contiguous array");
  return empty(dtype, {s[1], s[0]}, like.device).as_strided(s, {1, s[0]});
}

Tensor Tensor::borrow(const TensorView& v) {
  check(v.is_contiguous(), ErrorCode::kInvalidArgument, "Tensor::borrow needs a contiguous view, got " + v.str());
  Tensor t;
  t.storage_ = std::shared_ptr<void>(v.data, [](void*) {});  // not owned
  t.storage_bytes_ = static_cast<size_t>(v.numel()) * dtype_size(v.dtype);
  t.view_ = v;
  return t;
}

Tensor Tensor::as_strided(Shape shape, Shape strides) const {
  check(shape.size() == strides.size(), ErrorCode::kInvalidArgument,
        "as_strided: shape and strides differ in length");
  int64_t last = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    check(shape[i] >= 0 && strides[i] >= 0, ErrorCode::kInvalidArgument,
          "as_strided: negative shape or stride");
    if (shape[i] == 0) last = -1;
    if (last >= 0) last += (shape[i] - 1) * strides[i];
  }
  check(last < 0 || static_cast<size_t>(last + 1) * dtype_size(view_.dtype) <= storage_bytes_,
        ErrorCode::kInvalidArgument,
        "as_strided: view " + shape_str(shape) + " strides " + shape_str(strides) +
            " reaches outside the storage");
  Tensor t = *this;
  t.view_ = TensorView(view_.data, view_.dtype, std::move(shape), std::move(strides), view_.device);
  return t;
}

void zero_fill(const TensorView& t) {
  check(t.is_contiguous(), ErrorCode::kInvalidArgument, "zero_fill needs a contiguous view");
  const size_t bytes = t.nbytes();
  if (bytes == 0) return;
  if (t.device.type == DeviceType::kCPU) {
    std::memset(t.data, 0, bytes);
  } else {
    get_allocator(t.device.type).memset(t.data, 0, bytes, t.device.index);
  }
}

void synchronize(Device device, void* stream) {
  if (device.type == DeviceType::kCPU) return;
  const DeviceAllocator a = get_allocator(device.type);
  check(static_cast<bool>(a.synchronize), ErrorCode::kUnsupported, device.str() + "'s allocator cannot synchronize a stream");
  a.synchronize(stream, device.index);
}

int device_index_of(DeviceType type, const void* ptr) {
  if (type == DeviceType::kCPU) return -1;
  const DeviceAllocator a = get_allocator(type);
  check(static_cast<bool>(a.device_of), ErrorCode::kUnsupported,
        Device{type, 0}.str() + "'s allocator cannot tell a pointer's device");
  return a.device_of(ptr);
}

Tensor Tensor::zeros(DType dtype, Shape shape, Device device) {
  Tensor t = empty(dtype, std::move(shape), device);
  zero_fill(t.view());
  return t;
}

Tensor Tensor::to(Device device) const {
  check(defined(), ErrorCode::kInvalidArgument, "Tensor::to on an undefined tensor");
  Tensor out = empty(view_.dtype, view_.shape, device);
  const size_t bytes = view_.nbytes();
  const bool src_host = view_.device.type == DeviceType::kCPU;
  const bool dst_host = device.type == DeviceType::kCPU;
  if (src_host && dst_host) {
    if (bytes) std::memcpy(out.data(), data(), bytes);
  } else {
    const DeviceType dt = src_host ? device.type : view_.device.type;
    const int idx = src_host ? device.index : view_.device.index;
    const CopyKind kind = src_host ? CopyKind::kHostToDevice
                          : dst_host ? CopyKind::kDeviceToHost : CopyKind::kDeviceToDevice;
    if (bytes) get_allocator(dt).copy(out.data(), data(), bytes, kind, idx);
  }
  return out;
}

}  // namespace tessera
