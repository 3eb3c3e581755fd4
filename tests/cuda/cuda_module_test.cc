// The CUDA module, loaded (this executable forces the load on machines without a driver:
// force_module.cc): found next to libtessera.so, initialized, and everything it provides is
// registered: the "cuda" implementation in the place of its placeholder, the allocator and
// the harness hooks. Without a device they all report instead of crashing.
#include <gtest/gtest.h>

#include <string>

#include "core/device_module.h"
#include "harness/device_hooks.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace dm = tessera::device_module;
using tessera::DeviceType;

TEST(CudaModule, LoadsAndRegistersEverything) {
  const dm::Status& s = dm::load(DeviceType::kCUDA);
  ASSERT_TRUE(s.loaded) << s.reason;
  EXPECT_NE(s.path.find("libtessera_cuda.so"), std::string::npos) << s.path;
  EXPECT_TRUE(tessera::has_device_allocator(DeviceType::kCUDA));
  EXPECT_NE(tessera::harness::device_hooks(DeviceType::kCUDA), nullptr);
  bool listed = false;
  for (const auto& info : tessera::linear_cross_entropy::implementations()) {
    if (info.name != "cuda") continue;
    listed = true;
    EXPECT_EQ(info.description.find("from the CUDA module"), std::string::npos)
        << "still the placeholder: " << info.description;
    if (!info.available) EXPECT_NE(info.unavailable_reason.find("CUDA device"), std::string::npos) << info.unavailable_reason;
  }
  EXPECT_TRUE(listed);
}

TEST(CudaModule, WithoutADeviceAllocationThrows) {
  const auto* h = tessera::harness::device_hooks(DeviceType::kCUDA);
  ASSERT_NE(h, nullptr);
  if (h->device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW((void)tessera::Tensor::empty(tessera::DType::kF32, {4}, tessera::Device::cuda()), tessera::Error);
}
