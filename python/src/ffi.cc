// XLA FFI handlers: JAX calls Tessera's kernels inside its compiled programs (jax.jit, grad)
// with no host round trip and no Python callback. One generic handler per platform, driven by
// the kernel registry like the rest of the extension:
//   args:  the present tensors, named in order by the attribute `names` ("x,w,labels,grad_loss")
//   rets:  the pass's outputs in the order CallSpec::outputs gives them
//   attrs: kernel, pass, names, options ("reduction=mean;softcap=30"), implementation,
//          memory_budget (i64 bytes, 0: the backend's default)
// XLA owns every buffer; the handler wraps them as TensorViews (no copy) and returns an ffi::Error
// with Tessera's one-line message when the call is rejected.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ext.h"
#include "tessera/error.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace tessera::python {
namespace {

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    out.emplace_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

DType dtype_of(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return DType::kF32;
    case ffi::DataType::BF16: return DType::kBF16;
    case ffi::DataType::F16: return DType::kF16;
    case ffi::DataType::S32: return DType::kI32;
    case ffi::DataType::S64: return DType::kI64;
    case ffi::DataType::F8E4M3FN: return DType::kF8E4M3;
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  "a buffer has an XLA dtype Tessera does not take (f32, bf16, f16, i32, i64, f8e4m3)");
  }
}

TensorView view_of(const ffi::AnyBuffer& b, Device dev) {
  Shape shape(b.dimensions().begin(), b.dimensions().end());
  return TensorView(b.untyped_data(), dtype_of(b.element_type()), std::move(shape), dev);
}

// Whether the kernel reads input `name` on the host whatever the device (group sizes, page
// tables, sequence lengths: CallInput::host_only).
bool host_only(const kernels::CallSpec& c, const std::string& name) {
  for (const auto* list : {&c.inputs, &c.grad_inputs})
    for (const kernels::CallInput& in : *list)
      if (in.name == name) return in.host_only;
  return false;
}

// A device buffer's contents in host memory (nullptr: the call is on the host already).
using HostCopy = Tensor (*)(void* stream, const TensorView& t);

ffi::Error run(Device dev, void* stream, HostCopy host_copy, ffi::RemainingArgs args, ffi::RemainingRets rets,
               std::string_view kernel, std::string_view pass, std::string_view names, std::string_view options,
               std::string_view implementation, int64_t memory_budget, std::string_view skip) {
  try {
    const kernels::KernelSpec& k = kernels::get(std::string(kernel));
    kernels::CallArgs call;
    call.pass = parse_pass(std::string(pass));
    for (const std::string& s : split(skip, ','))  // gradients left out: their work skipped
      if (!s.empty()) call.skip.push_back(s);
    const std::vector<std::string> n = split(names, ',');
    if (n.size() != args.size())
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tessera: " + std::to_string(args.size()) +
                                                              " buffers for " + std::to_string(n.size()) + " names");
    // XLA hands every operand in device memory on a GPU: the ones read on the host are copied
    // there (kept alive for the call), as the torch front end does with .cpu().
    std::vector<Tensor> on_host;
    on_host.reserve(n.size());
    for (size_t i = 0; i < n.size(); ++i) {
      auto b = args.get<ffi::AnyBuffer>(i);
      if (b.has_error()) return b.error();
      TensorView v = view_of(*b, dev);
      if (host_copy && host_only(k.call, n[i])) on_host.push_back(host_copy(stream, v)), v = on_host.back().view();
      call.tensors.push_back({n[i], v});
    }
    std::map<std::string, std::string> given;
    for (const std::string& kv : split(options, ';')) {
      const size_t eq = kv.find('=');
      given[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
    }
    call.options = option_values(k.call, k.name, given);
    kernels::check_skip(k.call, call, k.name);
    call.exec.implementation = std::string(implementation);
    call.exec.stream = stream;
    if (memory_budget < 0)
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tessera: memory_budget must be >= 0 bytes");
    call.exec.memory_budget = static_cast<size_t>(memory_budget);
    std::vector<TensorView> out;
    for (size_t i = 0; i < rets.size(); ++i) {
      auto r = rets.get<ffi::AnyBuffer>(i);
      if (r.has_error()) return r.error();
      out.push_back(view_of(**r, dev));
    }
    k.call.call(call, out);
    return ffi::Error::Success();
  } catch (const Error& e) {
    const auto code = e.code() == ErrorCode::kInvalidArgument ? ffi::ErrorCode::kInvalidArgument
                      : e.code() == ErrorCode::kUnsupported   ? ffi::ErrorCode::kUnimplemented
                                                              : ffi::ErrorCode::kInternal;
    return ffi::Error(code, e.what());
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("tessera: ") + e.what());
  }
}

ffi::Error call_cpu(ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view kernel, std::string_view pass,
                    std::string_view names, std::string_view options, std::string_view implementation,
                    int64_t memory_budget, std::string_view skip) {
  return run(Device::cpu(), nullptr, nullptr, args, rets, kernel, pass, names, options, implementation, memory_budget,
             skip);
}

// The CUDA handler links no CUDA runtime (importing tessera must not need one): the stream is an
// opaque pointer, and the device work goes through libtessera's device allocator, which loads the
// CUDA module on first use (without it: kUnsupported saying why, as an FFI error).
// Until 2026-11-28 this handler hid behind a macro nothing defined: JAX on a GPU found no handler.

// A host-read input on the host: after the work queued on XLA's stream (it may have produced it).
Tensor cuda_host_copy(void* stream, const TensorView& t) {
  if (t.numel() == 0) return Tensor::empty(t.dtype, t.shape);  // XLA passes null for an empty buffer
  synchronize(t.device, stream);
  return Tensor::borrow(t).to(Device::cpu());
}

// The device the buffers are on, from the first one's address: XLA's DeviceOrdinal is PJRT's
// logical id, which differs from the CUDA ordinal under jax_cuda_visible_devices or virtual GPUs.
// The first buffer in device memory decides (an operand in pinned host memory does not).
int cuda_device_of(ffi::RemainingArgs& args, ffi::RemainingRets& rets) {
  const auto device_of = [](const void* p) { return p ? device_index_of(DeviceType::kCUDA, p) : -1; };
  for (size_t i = 0; i < args.size(); ++i)
    if (auto b = args.get<ffi::AnyBuffer>(i); !b.has_error())
      if (const int d = device_of(b->untyped_data()); d >= 0) return d;
  for (size_t i = 0; i < rets.size(); ++i)
    if (auto r = rets.get<ffi::AnyBuffer>(i); !r.has_error())
      if (const int d = device_of((*r)->untyped_data()); d >= 0) return d;
  return -1;
}

ffi::Error call_cuda(void* stream, ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view kernel,
                     std::string_view pass, std::string_view names, std::string_view options,
                     std::string_view implementation, int64_t memory_budget, std::string_view skip) {
  int device = -1;
  try {
    device = cuda_device_of(args, rets);
  } catch (const Error& e) {  // no CUDA module (not built, no driver): its reason
    return ffi::Error(e.code() == ErrorCode::kUnsupported ? ffi::ErrorCode::kUnimplemented : ffi::ErrorCode::kInternal,
                      e.what());
  } catch (const std::exception& e) {  // nothing may cross the FFI boundary
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("tessera: ") + e.what());
  }
  if (device < 0) {  // every buffer null (empty) or in host memory
    bool empty = true;
    for (size_t i = 0; i < rets.size(); ++i)
      if (auto r = rets.get<ffi::AnyBuffer>(i); !r.has_error()) empty = empty && (*r)->size_bytes() == 0;
    if (!empty)
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "tessera: no buffer of the call is in CUDA device memory");
    device = 0;  // empty outputs: the call still validates everything, then writes nothing
  }
  return run(Device::cuda(device), stream, cuda_host_copy, args, rets, kernel, pass, names, options, implementation,
             memory_budget, skip);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TesseraCallCpu, call_cpu,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("kernel")
                                  .Attr<std::string_view>("pass_")
                                  .Attr<std::string_view>("names")
                                  .Attr<std::string_view>("options")
                                  .Attr<std::string_view>("implementation")
                                  .Attr<int64_t>("memory_budget")
                                  .Attr<std::string_view>("skip"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TesseraCallCuda, call_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void*>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("kernel")
                                  .Attr<std::string_view>("pass_")
                                  .Attr<std::string_view>("names")
                                  .Attr<std::string_view>("options")
                                  .Attr<std::string_view>("implementation")
                                  .Attr<int64_t>("memory_budget")
                                  .Attr<std::string_view>("skip"));

nb::dict ffi_targets() {
  nb::dict d;
  d["cpu"] = nb::capsule(reinterpret_cast<void*>(TesseraCallCpu));
  d["cuda"] = nb::capsule(reinterpret_cast<void*>(TesseraCallCuda));  // without the CUDA module: a clear error
  return d;
}

}  // namespace tessera::python
