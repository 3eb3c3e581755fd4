// Every kernel's call (the CallSpec the Python bindings use) with CUDA-labelled views whose memory
// the host cannot read: the API's host code must never dereference device data (a label range,
// a finiteness scan, a metric, a zero fill, the upstream scalar...). Each device view points into
// its own PROT_NONE mapping, so a host read or write of it is a SIGSEGV here instead of a silent
// read of the wrong memory; the call must end in a tessera::Error instead (no usable CUDA device
// or module on a CPU machine; on a GPU machine the backend's accessibility check refuses host
// memory). Host-only inputs (sizes, page tables: CallInput::host_only) stay real host tensors.
//
// The first GPU run of tessera.torch (python/tests/test_cuda.py) died with a segfault in the
// fused linear_cross_entropy call; this suite runs that call path, and every other kernel's, for
// every pass and with each flag option turned on, without a GPU.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/registry.h"
#include "tessera/error.h"

namespace tessera {
namespace {

// A PROT_NONE mapping of at least `bytes`: any host access faults.
class Unreadable {
 public:
  explicit Unreadable(size_t bytes) : size_(std::max<size_t>(bytes, 1)) {
    ptr_ = mmap(nullptr, size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr_ == MAP_FAILED) throw Error(ErrorCode::kOutOfMemory, "mmap of a PROT_NONE region failed");
  }
  ~Unreadable() { munmap(ptr_, size_); }
  Unreadable(const Unreadable&) = delete;
  Unreadable& operator=(const Unreadable&) = delete;
  void* get() const { return ptr_; }

 private:
  size_t size_;
  void* ptr_;
};

// Views labelled cuda:0 over PROT_NONE memory, owned here.
struct DeviceViews {
  std::vector<std::unique_ptr<Unreadable>> regions;
  TensorView make(DType dt, const Shape& shape, const Shape& strides) {
    int64_t span = 1;  // elements up to the furthest one (strides may be a transposed layout)
    for (size_t i = 0; i < shape.size(); ++i) span += (shape[i] - 1) * (strides.empty() ? 0 : strides[i]);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = static_cast<size_t>(std::max(span, n)) * dtype_size(dt);
    regions.push_back(std::make_unique<Unreadable>(bytes));
    TensorView v(regions.back()->get(), dt, shape, Device::cuda(0));
    if (!strides.empty()) v.strides = strides;
    return v;
  }
};

bool host_only(const kernels::CallSpec& s, const std::string& name) {
  for (const kernels::CallInput& in : s.inputs)
    if (in.name == name) return in.host_only;
  return false;
}

// A small problem of `k` (every dim 8, the bench options' defaults).
std::unique_ptr<harness::BenchProblem> small_problem(const kernels::KernelSpec& k) {
  harness::GridShape shape;
  shape.name = "device_views";
  for (const std::string& d : k.dims) shape.dims[d] = 8;
  return k.bench.make_problem(shape, DType::kF32, harness::defaults_of(k.bench.options), 7);
}

struct Param {
  std::string kernel;
  Pass pass;
  std::string flag;  // a flag option turned on ("" for none)
  bool host_only_on_device = false;  // the host-only inputs too (python/tests/test_cuda.py moves every input)
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.kernel << "/" << pass_name(p.pass) << "/" << p.flag << (p.host_only_on_device ? "/host_only_on_device" : "");
}

bool has_host_only(const kernels::CallSpec& s) {
  for (const kernels::CallInput& in : s.inputs)
    if (in.host_only) return true;
  return false;
}

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (const kernels::KernelSpec* k : kernels::all()) {
    if (!k->call.call) continue;
    for (Pass p : k->passes) {
      out.push_back({k->name, p, ""});
      if (has_host_only(k->call)) out.push_back({k->name, p, "", true});
      for (const harness::OptionSpec& o : k->call.options)
        if (o.kind == harness::OptionSpec::Kind::kFlag) out.push_back({k->name, p, o.name});
    }
  }
  return out;
}

class DeviceViewsAreNotReadOnTheHost : public ::testing::TestWithParam<Param> {};

TEST_P(DeviceViewsAreNotReadOnTheHost, CallEndsInAnError) {
  const Param& prm = GetParam();
  const kernels::KernelSpec& k = kernels::get(prm.kernel);
  const auto problem = small_problem(k);
  const harness::BenchProblem::CallData data = problem->call_data();
  ASSERT_FALSE(data.tensors.empty()) << k.name << ": its bench problem does not go through the call";

  kernels::CallArgs args;
  args.pass = prm.pass;
  args.options = harness::defaults_of(k.call.options);
  for (const auto& [name, value] : data.options.all()) args.options.set(name, value);
  if (!prm.flag.empty()) args.options.set(prm.flag, "true");
  DeviceViews dev;
  for (const auto& [name, t] : data.tensors) {
    if (prm.pass == Pass::kForward && name.rfind("grad_", 0) == 0) continue;  // upstream gradients: not forward's
    args.tensors.push_back({name, host_only(k.call, name) && !prm.host_only_on_device ? t.view() : dev.make(t.dtype(), t.shape(), t.view().strides)});
  }
  std::vector<kernels::OutputDesc> descs;
  try {
    descs = k.call.outputs(args);
  } catch (const Error& e) {  // an option this problem does not take (metadata only: nothing ran)
    GTEST_SKIP() << "outputs refused these options: " << e.what();
  }
  std::vector<TensorView> outs;
  for (const kernels::OutputDesc& d : descs) outs.push_back(dev.make(d.dtype, d.shape, d.strides));
  // No CUDA device here (or PROT_NONE memory refused by the backend): an Error, never a fault.
  try {
    const std::string ran = k.call.call(args, outs);
    FAIL() << "ran '" << ran << "' on memory no device or host can read";
  } catch (const Error& e) {
    std::printf("    -> %s\n", e.what());
  }
}

INSTANTIATE_TEST_SUITE_P(AllKernels, DeviceViewsAreNotReadOnTheHost, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.kernel + "_" + pass_name(info.param.pass) +
                                  (info.param.flag.empty() ? "" : "_" + info.param.flag) +
                                  (info.param.host_only_on_device ? "_host_only_on_device" : "");
                         });

}  // namespace
}  // namespace tessera
