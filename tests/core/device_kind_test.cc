// tune/device_kind.h: the GPU device kind's format and the registration a device module makes.
#include <gtest/gtest.h>

#include <string>

#include "tune/device_kind.h"

namespace tessera::tune {
namespace {

TEST(DeviceKind, GpuKindIsNamePlusMultiprocessors) {
  EXPECT_EQ(gpu_device_kind("cuda", "NVIDIA H100 80GB HBM3", 132), "cuda:NVIDIA H100 80GB HBM3:132sm");
  // Cleaned like every device name; ':' would split the fields, so it becomes '_'.
  EXPECT_EQ(gpu_device_kind("cuda", "  Odd\t\"GPU\":X  ", 7), "cuda:Odd _GPU__X:7sm");
  EXPECT_EQ(gpu_device_kind("cuda", "", 1), "cuda:unknown:1sm");
}

std::string fake_kind(int index) { return "cuda:Fake GPU:" + std::to_string(index) + "sm"; }
std::string throwing_kind(int) { throw 1; }

TEST(DeviceKind, DefaultKindAsksTheRegisteredNamer) {
  EXPECT_EQ(default_device_kind(DeviceType::kCPU), cpu_device_kind());
  const DeviceKindFn before = register_device_kind(DeviceType::kCUDA, fake_kind);
  EXPECT_EQ(default_device_kind(DeviceType::kCUDA, 3), "cuda:Fake GPU:3sm");
  register_device_kind(DeviceType::kCUDA, throwing_kind);
  EXPECT_EQ(default_device_kind(DeviceType::kCUDA, 0), "cuda:unknown");  // a failing query is not fatal
  EXPECT_EQ(register_device_kind(DeviceType::kCUDA, before), throwing_kind);  // the previous namer comes back
  // (No call without a namer here: it would load the CUDA module, which the CPU-only tests of
  // this process must not; tessera_cuda_tests' CudaUtil.TheModuleNamesGpusForTheTuner covers it.)
}

}  // namespace
}  // namespace tessera::tune
