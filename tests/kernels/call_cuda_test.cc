// Every kernel's call as the Python bindings make it (python/src/ext.cc: the CallSpec's outputs()
// and call(), implementation "" = the default order, a 0-d upstream gradient for a scalar loss)
// on CUDA tensors, against the same call on host tensors. The C++ GPU suites call each kernel's
// C++ API with implementation "cuda"; the first GPU run of python/tests/test_cuda.py died with a
// segfault inside the fused linear_cross_entropy call. When this suite passes on a GPU and the
// Python run still crashes, the fault is outside Tessera's call path (the process: PyTorch's CUDA
// libraries, DLPack), not in the API or the backend's host code.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda_test_util.h"
#include "kernels/registry.h"
#include "tessera/error.h"

namespace tessera {
namespace {

using Named = std::vector<std::pair<std::string, Tensor>>;

bool cuda_here() {
  for (const kernels::KernelSpec* k : kernels::all())
    for (const auto& i : k->implementations().infos())
      if (i.device == DeviceType::kCUDA && i.available) return true;
  return false;
}

// The outputs of one call through the CallSpec on `dev` (inputs copied there but host-only ones).
Named call_on(const kernels::KernelSpec& k, const Named& inputs, const harness::OptionValues& options, Pass pass,
              Device dev) {
  harness::BenchCall c = kernels::bind_call(k.call, inputs, options, "", dev, pass, ExecOptions{});
  if (c.prepare) c.prepare();
  c.run();
  Named out = c.outputs();
  for (auto& [name, t] : out) t = t.to(Device::cpu());
  return out;
}

// Elementwise |got - want| <= 2e-4 + 2e-3·|want| (python/tests/test_cuda.py's tolerance: f32
// accumulation in other orders, or TF32 products in cuBLAS); integer outputs exactly.
void expect_close(const Named& got, const Named& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t o = 0; o < got.size(); ++o) {
    const Tensor &g = got[o].second, &w = want[o].second;
    ASSERT_EQ(g.shape(), w.shape()) << what << " " << got[o].first;
    int bad = 0;
    for (int64_t i = 0; i < w.numel() && bad < 5; ++i) {
      const double a = load_as_f32(g.data(), g.dtype(), i), b = load_as_f32(w.data(), w.dtype(), i);
      const bool ok = is_float(w.dtype()) ? std::abs(a - b) <= 2e-4 + 2e-3 * std::abs(b) : a == b;
      if (!ok) ++bad;
      EXPECT_TRUE(ok) << what << " " << got[o].first << "[" << i << "]: cuda " << a << ", cpu " << b;
    }
  }
}

// The contract leaves some output elements unspecified (linear_cross_entropy's lse of an ignored
// row: the host skips the row and writes 0, cuda computes it): `unspecified` zeroes them on both sides.
using Unspecified = std::function<void(Named&)>;

void compare(const kernels::KernelSpec& k, const Named& inputs, const harness::OptionValues& options, Pass pass,
             const Unspecified& unspecified = {}) {
  Named want = call_on(k, inputs, options, pass, Device::cpu());
  Named got;
  try {
    got = call_on(k, inputs, options, pass, Device::cuda(0));
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kUnsupported) GTEST_SKIP() << "the cuda implementations refuse this problem: " << e.what();
    throw;
  }
  if (unspecified) {
    unspecified(want);
    unspecified(got);
  }
  expect_close(got, want, k.name + " " + pass_name(pass));
}

// python/tests/test_cuda.py's first case exactly: reference.problem(seed=5)'s shapes, w as
// PyTorch's lm_head.weight [V, H], every fifth label ignored, reduction mean, and the fused pass
// tessera.torch runs in the forward (grad_loss a 0-d 1).
TEST(CallCuda, LinearCrossEntropyFusedAsTesseraTorchCallsIt) {
  if (!cuda_here()) GTEST_SKIP() << "no usable CUDA implementation here";
  const int64_t B = 24, H = 32, V = 80;
  Tensor x = Tensor::empty(DType::kF32, {B, H}), w = Tensor::empty(DType::kF32, {V, H});
  Tensor y = Tensor::empty(DType::kI64, {B}), g = Tensor::empty(DType::kF32, {});
  for (int64_t i = 0; i < B * H; ++i) x.data_as<float>()[i] = 0.5f * std::sin(0.37f * static_cast<float>(i));
  for (int64_t i = 0; i < V * H; ++i) w.data_as<float>()[i] = 0.3f * std::cos(0.11f * static_cast<float>(i));
  for (int64_t t = 0; t < B; ++t) y.data_as<int64_t>()[t] = t % 5 == 0 ? -100 : (t * 37) % V;
  g.data_as<float>()[0] = 1.0f;
  const kernels::KernelSpec& k = kernels::get("linear_cross_entropy");
  const auto ignored_lse = [&](Named& out) {
    for (auto& [name, t] : out)
      if (name == "lse")
        for (int64_t r = 0; r < B; ++r)
          if (y.data_as<int64_t>()[r] == -100) t.data_as<float>()[r] = 0.0f;
  };
  compare(k, {{"x", x}, {"w", w}, {"labels", y}, {"grad_loss", g}}, harness::defaults_of(k.call.options), Pass::kFused,
          ignored_lse);
}

struct Param {
  std::string kernel;
  Pass pass;
};

void PrintTo(const Param& p, std::ostream* os) { *os << p.kernel << "/" << pass_name(p.pass); }

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (const kernels::KernelSpec* k : kernels::all())
    if (k->call.call)
      for (Pass p : k->passes) out.push_back({k->name, p});
  return out;
}

class CallCudaAllKernels : public ::testing::TestWithParam<Param> {};

// Each kernel's small bench problem (every dim 8) through its CallSpec, cuda against cpu.
TEST_P(CallCudaAllKernels, MatchesTheHostCall) {
  if (!cuda_here()) GTEST_SKIP() << "no usable CUDA implementation here";
  const kernels::KernelSpec& k = kernels::get(GetParam().kernel);
  harness::GridShape shape;
  shape.name = "call_cuda";
  for (const std::string& d : k.dims) shape.dims[d] = 8;
  const auto problem = k.bench.make_problem(shape, DType::kF32, harness::defaults_of(k.bench.options), 7);
  const harness::BenchProblem::CallData data = problem->call_data();
  ASSERT_FALSE(data.tensors.empty()) << k.name << ": its bench problem does not go through the call";
  harness::OptionValues options = harness::defaults_of(k.call.options);
  for (const auto& [name, value] : data.options.all()) options.set(name, value);
  compare(k, data.tensors, options, GetParam().pass);
}

INSTANTIATE_TEST_SUITE_P(Kernels, CallCudaAllKernels, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.kernel + "_" + pass_name(info.param.pass);
                         });

}  // namespace
}  // namespace tessera
