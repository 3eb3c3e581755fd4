// tessera._ext: the nanobind extension. It knows no kernel: every entry goes through the kernel
// registry (src/kernels/registry.h), so a kernel that registers a CallSpec is callable from
// Python (NumPy, PyTorch, JAX, CuPy) with no code here.
//
//   kernels()                      what each kernel takes, its options and passes (Python
//                                  generates its wrappers from this)
//   outputs(kernel, pass, metas, options)
//                                  what a pass writes, from shapes and dtypes only (to allocate
//                                  outputs, and for torch's fake tensors / JAX's abstract eval)
//   call(kernel, pass, tensors, outputs, options, implementation, num_threads, stream, memory_budget)
//                                  runs a pass on DLPack views taken zero-copy, writing the
//                                  caller's preallocated outputs, with the GIL released
//   view(array)                    how an array is seen through DLPack (tests prove no copy)
//   ffi_targets()                  XLA FFI handlers (python/src/ffi.cc), one per platform
//
// tessera::Error becomes ValueError (bad argument; unknown kernel or implementation), TypeError
// (wrong dtype), NotImplementedError (unsupported here), MemoryError, OSError or RuntimeError,
// with the C++ one-line message unchanged.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <set>
#include <regex>

#include "ext.h"
#include "kernels/registry.h"
#include "tessera/error.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessera::python {

harness::OptionValues option_values(const kernels::CallSpec& spec, const std::string& kernel,
                                    const std::map<std::string, std::string>& given) {
  harness::OptionValues v = harness::defaults_of(spec.options);
  for (const auto& [name, value] : given) {
    bool known = false;
    for (const auto& o : spec.options) known |= o.name == name;
    if (!known) {
      std::string names;
      for (const auto& o : spec.options) names += (names.empty() ? "" : ", ") + o.name;
      throw Error(ErrorCode::kInvalidArgument, kernel + ": unknown option '" + name + "' (options: " + names + ")");
    }
    v.set(name, value);
  }
  return v;
}

namespace {

using Array = nb::ndarray<nb::ro>;

// ml_bits: the array holds an ml_dtypes type as its bits, bf16 as uint16 or f8e4m3 as uint8
// (NumPy's ml_dtypes.bfloat16 and float8_e4m3fn, which neither DLPack nor the buffer protocol can
// describe; tessera/__init__.py passes a uint16 / uint8 view of them).
DType dtype_of(const nb::dlpack::dtype& d, const std::string& name, bool ml_bits = false) {
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(d.code);
  if (ml_bits && d.lanes == 1 && code == C::UInt && d.bits == 16) return DType::kBF16;
  if (ml_bits && d.lanes == 1 && code == C::UInt && d.bits == 8) return DType::kF8E4M3;
  constexpr uint8_t kDLFloat8E4M3FN = 10;  // DLPack 1.0's kDLFloat8_e4m3fn (PyTorch's float8_e4m3fn)
  if (d.lanes == 1 && d.code == kDLFloat8E4M3FN && d.bits == 8) return DType::kF8E4M3;
  if (d.lanes == 1) {
    if (code == C::Float && d.bits == 32) return DType::kF32;
    if (code == C::Float && d.bits == 16) return DType::kF16;
    if (code == C::Bfloat && d.bits == 16) return DType::kBF16;
    if (code == C::Int && d.bits == 32) return DType::kI32;
    if (code == C::Int && d.bits == 64) return DType::kI64;
  }
  static const char* codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string kind = d.code < 7 ? codes[d.code] : "code" + std::to_string(d.code);
  throw nb::type_error((name + " has dtype " + kind + std::to_string(d.bits) +
                        " which Tessera does not take (f32, bf16, f16, i32, i64, f8e4m3)")
                           .c_str());
}

template <class A>
Device device_of(const A& a, const std::string& name) {
  if (a.device_type() == nb::device::cpu::value) return Device::cpu();
  if (a.device_type() == nb::device::cuda::value) return Device::cuda(a.device_id());
  throw nb::value_error((name + " is on a device Tessera cannot use (DLPack device type " +
                         std::to_string(a.device_type()) + "; cpu and cuda only)")
                            .c_str());
}

template <class A>
TensorView view_of(const A& a, const std::string& name, bool ml_bits = false) {
  TensorView v;
  v.data = const_cast<void*>(a.data());
  v.dtype = dtype_of(a.dtype(), name, ml_bits);
  v.device = device_of(a, name);
  v.shape.resize(a.ndim());
  v.strides.resize(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    v.shape[i] = static_cast<int64_t>(a.shape(i));
    v.strides[i] = static_cast<int64_t>(a.stride(i));
  }
  return v;
}

// A shape-only view: (dtype name, shape, strides or empty for row-major).
using Meta = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>>;

TensorView view_of(const Meta& m) {
  const auto& [dt, shape, strides] = m;
  TensorView v(nullptr, parse_dtype(dt), shape);
  if (!strides.empty()) v.strides = strides;
  return v;
}

nb::list describe_options(const std::vector<harness::OptionSpec>& opts) {
  nb::list out;
  for (const auto& o : opts) {
    static const char* kinds[] = {"flag", "int", "float", "str"};
    nb::dict d;
    d["name"] = o.name;
    d["kind"] = kinds[static_cast<int>(o.kind)];
    d["help"] = o.help;
    d["default"] = o.default_value;
    d["choices"] = o.choices;
    out.append(d);
  }
  return out;
}

nb::list describe_inputs(const std::vector<kernels::CallInput>& in) {
  nb::list out;
  for (const auto& i : in) {
    nb::dict d;
    d["name"] = i.name;
    d["help"] = i.help;
    d["required"] = i.required;
    d["differentiable"] = i.differentiable;
    d["host_only"] = i.host_only;
    d["autocast"] = i.autocast;
    d["transposed"] = i.transposed;
    d["seed_of"] = i.seed_of;
    out.append(d);
  }
  return out;
}

nb::list kernels_description() {
  nb::list out;
  for (const kernels::KernelSpec* k : kernels::all()) {
    if (!k->call.call) continue;  // not callable from Python (yet)
    nb::dict d;
    d["name"] = k->name;
    d["description"] = k->description;
    nb::list passes;
    for (Pass p : k->passes) passes.append(pass_name(p));
    d["passes"] = passes;
    d["inputs"] = describe_inputs(k->call.inputs);
    d["grad_inputs"] = describe_inputs(k->call.grad_inputs);
    d["options"] = describe_options(k->call.options);
    d["forward_outputs"] = k->call.forward_outputs;
    d["saved_outputs"] = k->call.saved_outputs;
    d["skippable"] = k->call.skippable;
    nb::list impls;
    for (const ImplementationInfo& i : k->implementations().infos()) {
      nb::dict e;
      e["name"] = i.name;
      e["description"] = i.description;
      e["device"] = i.device == DeviceType::kCUDA ? "cuda" : "cpu";
      e["available"] = i.available;
      e["unavailable_reason"] = i.unavailable_reason;
      e["status"] = version_status_name(i.status);
      impls.append(e);
    }
    d["implementations"] = impls;
    out.append(d);
  }
  return out;
}

using OutList = std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, std::vector<int64_t>>>;

OutList outputs(const std::string& kernel, const std::string& pass, const std::map<std::string, Meta>& metas,
                const std::map<std::string, std::string>& options, const std::vector<std::string>& skip) {
  const kernels::KernelSpec& k = kernels::get(kernel);
  kernels::CallArgs args;
  args.pass = parse_pass(pass);
  for (const auto& [name, m] : metas) args.tensors.push_back({name, view_of(m)});
  args.options = option_values(k.call, kernel, options);
  args.skip = skip;
  OutList out;
  for (const kernels::OutputDesc& o : kernels::outputs_of(k.call, args, kernel))
    out.push_back({o.name, dtype_name(o.dtype), o.shape, o.strides});
  return out;
}

std::string call(const std::string& kernel, const std::string& pass, const std::map<std::string, Array>& tensors,
                 const std::vector<nb::ndarray<>>& outs, const std::map<std::string, std::string>& options,
                 const std::string& implementation, int num_threads, uintptr_t stream, uint64_t memory_budget,
                 const std::vector<std::string>& skip, const std::set<std::string>& ml_bits,
                 const std::set<size_t>& ml_bits_outputs) {
  const kernels::KernelSpec& k = kernels::get(kernel);
  kernels::CallArgs args;
  args.pass = parse_pass(pass);
  args.skip = skip;
  kernels::check_skip(k.call, args, kernel);
  for (const auto& [name, a] : tensors) args.tensors.push_back({name, view_of(a, name, ml_bits.count(name) > 0)});
  args.options = option_values(k.call, kernel, options);
  args.exec.implementation = implementation;
  args.exec.num_threads = num_threads;
  args.exec.stream = reinterpret_cast<void*>(stream);
  args.exec.memory_budget = static_cast<size_t>(memory_budget);
  std::vector<TensorView> out;
  for (size_t i = 0; i < outs.size(); ++i)
    out.push_back(view_of(outs[i], "output " + std::to_string(i), ml_bits_outputs.count(i) > 0));
  nb::gil_scoped_release release;  // the kernel runs without the GIL
  return k.call.call(args, out);
}

nb::dict view_info(const Array& a, const std::string& name, bool ml_bits) {
  const TensorView v = view_of(a, name, ml_bits);
  nb::dict d;
  d["data"] = reinterpret_cast<uintptr_t>(v.data);
  d["dtype"] = dtype_name(v.dtype);
  d["shape"] = v.shape;
  d["strides"] = v.strides;
  d["device"] = v.device.str();
  return d;
}

bool is_dtype_error(const std::string& msg) {
  static const std::regex re(
      R"((must be (f32|bf16|f16|i32|i64|f8e4m3)[a-z0-9_, ()']*, got (f32|bf16|f16|i32|i64|f8e4m3)$)|(dtype (f32|bf16|f16) differs from))");
  return std::regex_search(msg, re);
}

}  // namespace
}  // namespace tessera::python

NB_MODULE(_ext, m) {
  using namespace tessera;
  m.doc() = "Tessera's kernels through the kernel registry (see tessera/__init__.py)";
  m.attr("__version__") = TESSERA_VERSION;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      const char* msg = e.what();
      switch (e.code()) {
        case ErrorCode::kInvalidArgument:
          if (python::is_dtype_error(msg)) {
            PyErr_SetString(PyExc_TypeError, msg);
          } else {
            PyErr_SetString(PyExc_ValueError, msg);
          }
          break;
        case ErrorCode::kNotFound: PyErr_SetString(PyExc_ValueError, msg); break;  // a name that is not registered
        case ErrorCode::kUnsupported: PyErr_SetString(PyExc_NotImplementedError, msg); break;
        case ErrorCode::kOutOfMemory: PyErr_SetString(PyExc_MemoryError, msg); break;
        case ErrorCode::kIo: PyErr_SetString(PyExc_OSError, msg); break;
        default: PyErr_SetString(PyExc_RuntimeError, msg); break;
      }
    }
  });
  m.def("kernels", &python::kernels_description, "What each kernel takes (inputs, options, passes, implementations)");
  m.def("outputs", &python::outputs, "kernel"_a, "pass_"_a, "metas"_a, "options"_a,
        "skip"_a = std::vector<std::string>{},
        "The outputs (name, dtype, shape, strides) a pass writes for inputs of these dtypes and shapes");
  m.def("call", &python::call, "kernel"_a, "pass_"_a, "tensors"_a, "outputs"_a, "options"_a,
        "implementation"_a = "", "num_threads"_a = 0, "stream"_a = 0, "memory_budget"_a = 0,
        "skip"_a = std::vector<std::string>{}, "ml_bits"_a = std::set<std::string>{},
        "ml_bits_outputs"_a = std::set<size_t>{},
        "Runs a pass on DLPack arrays (zero-copy), writing the preallocated outputs; returns the implementation. "
        "ml_bits / ml_bits_outputs: the inputs (by name) and outputs (by index) given as the bits of an "
        "ml_dtypes type: uint16 views of bf16, uint8 views of f8e4m3");
  m.def("view", &python::view_info, "array"_a, "name"_a = "array", "ml_bits"_a = false,
        "How Tessera sees an array through DLPack (no copy); ml_bits: a uint16 array holding bf16, or a "
        "uint8 array holding f8e4m3");
  m.def("ffi_targets", &python::ffi_targets, "XLA FFI handlers by platform");
  m.def("dtype_error", &python::is_dtype_error);
}
