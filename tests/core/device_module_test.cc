// Device backends are modules loaded on first use (core/device_module.h). Without forcing
// anything (as every user process runs):
//   - CPU work never tries to load a device module, so no GPU runtime is ever mapped;
//   - on a machine without an NVIDIA driver, the first CUDA use tries once, loads no runtime
//     and reports why, the same way everywhere: the listing, an allocation, the harness hooks
//     and a request for the "cuda" implementation.
// The module's own behaviour once loaded is tested by tessera_cuda_tests (tests/cuda/).
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/device_module.h"
#include "harness/device_hooks.h"
#include "kernels/lce_test_util.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace dm = tessera::device_module;
namespace lce = tessera::linear_cross_entropy;
using tessera::Device;
using tessera::DeviceType;
using tessera::DType;
using tessera::ErrorCode;
using tessera::Tensor;

namespace {

// The GPU runtime libraries mapped into this process ("" when none).
std::string gpu_runtime_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    for (const char* lib : {"libcudart", "libcublas", "libtessera_cuda", "libcuda.so"})
      if (line.find(lib) != std::string::npos) return line;
  return {};
}

int use_count_dummy = 0;  // a host address to ask about

bool no_nvidia_driver() { return ::access("/dev/nvidiactl", F_OK) != 0 && ::access("/dev/dxg", F_OK) != 0; }

std::string expected_reason() {
  return TESSERA_TEST_CUDA_MODULE_BUILT ? "no CUDA device" : "built without the CUDA backend";
}

}  // namespace

TEST(DeviceModule, CpuWorkLoadsNoDeviceModule) {
  if (dm::attempted(DeviceType::kCUDA))
    GTEST_SKIP() << "an earlier test in this process used a CUDA device (run it alone, as ctest does)";
  using namespace tessera::lce_test;
  lce::Inputs in;
  Tensor x = f32_tensor({2, 3}, {0.1f, 0.2f, 0.3f, -0.1f, 0.0f, 0.5f});
  Tensor w = f32_tensor({3, 4}, {1, 0, 0, 1, 0, 1, 0, 1, 0, 0, 1, 1});
  Tensor y = i64_tensor({2}, {1, 3});
  in.x = x.view();
  in.w = w.view();
  in.labels = y.view();
  const lce::Result r = lce::compute(in);  // the default order for CPU inputs
  EXPECT_FALSE(r.implementation.empty());
  lce::Options opt;
  opt.implementation = "reference";
  (void)lce::compute_with_grad(in, opt);
  (void)Tensor::zeros(DType::kF32, {4}).to(Device::cpu());

  EXPECT_FALSE(dm::attempted(DeviceType::kCUDA));
  EXPECT_EQ(gpu_runtime_mapped(), "");
}

TEST(DeviceModule, WithoutADriverEveryUseSaysWhyAndLoadsNoRuntime) {
  if (!no_nvidia_driver()) GTEST_SKIP() << "an NVIDIA driver is present";
  const std::string why = expected_reason();

  // The listing: "cuda  unavailable  <reason>".
  bool listed = false;
  for (const auto& info : lce::implementations()) {
    if (info.name != "cuda") continue;
    listed = true;
    EXPECT_EQ(info.device, DeviceType::kCUDA);
    EXPECT_FALSE(info.available);
    EXPECT_NE(info.unavailable_reason.find(why), std::string::npos) << info.unavailable_reason;
  }
  EXPECT_TRUE(listed);
  EXPECT_TRUE(dm::attempted(DeviceType::kCUDA));
  const dm::Status& s = dm::load(DeviceType::kCUDA);
  EXPECT_FALSE(s.loaded);
  EXPECT_NE(s.reason.find(why), std::string::npos) << s.reason;

  // An allocation on the device.
  try {
    (void)Tensor::empty(DType::kF32, {4}, Device::cuda());
    ADD_FAILURE() << "allocated on a CUDA device without one";
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  EXPECT_FALSE(tessera::has_device_allocator(DeviceType::kCUDA));
  // A stream's synchronization and a pointer's device (the XLA handler's): the same reason.
  for (const auto& use : std::vector<std::function<void()>>{
           [] { tessera::synchronize(Device::cuda(), nullptr); },
           [] { (void)tessera::device_index_of(DeviceType::kCUDA, &use_count_dummy); }}) {
    try {
      use();
      ADD_FAILURE() << "a CUDA hook ran without a driver";
    } catch (const tessera::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  tessera::synchronize(Device::cpu(), nullptr);  // the host: nothing to wait for
  EXPECT_EQ(tessera::device_index_of(DeviceType::kCPU, &use_count_dummy), -1);

  // The harness's hooks: none.
  EXPECT_EQ(tessera::harness::device_hooks(DeviceType::kCUDA), nullptr);

  // Asking for the cuda implementation: a known name that cannot run, with the reason.
  using namespace tessera::lce_test;
  lce::Inputs in;
  Tensor x = f32_tensor({1, 2}, {0.5f, -0.5f});
  Tensor w = f32_tensor({2, 2}, {1, 0, 0, 1});
  Tensor y = i64_tensor({1}, {0});
  in.x = x.view();
  in.w = w.view();
  in.labels = y.view();
  lce::Options opt;
  opt.w_layout = lce::WLayout::kHV;  // square w: the layout must be said
  opt.implementation = "cuda";
  try {
    (void)lce::compute(in, opt);
    ADD_FAILURE() << "cuda ran";
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }

  // The driver check kept every GPU runtime out of the process.
  EXPECT_EQ(gpu_runtime_mapped(), "");
}

TEST(DeviceModule, TheHostNeedsNoModule) {
  EXPECT_TRUE(dm::load(DeviceType::kCPU).loaded);
  EXPECT_EQ(dm::module_file_name(DeviceType::kCUDA), "libtessera_cuda.so");
}
