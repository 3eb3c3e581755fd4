// The CUDA glue's host logic (core/cuda_util.h), on any machine with the CUDA build: launch-error
// messages of TESSERA_CUDA_SYNC_CHECK, the scratch pool's keep threshold, the retry-once rule of
// scratch allocation (with fakes), the GPU's device kind, and the tunable linear_cross_entropy
// cuda implementation (candidates, no GPU needed).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <thread>
#include <string>
#include <vector>

#include "core/cuda_util.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "tune/device_kind.h"

namespace tessera::cuda {
namespace {

TEST(CudaUtil, LaunchErrorMessageNamesTheKernelAndHowItWasFound) {
  const std::string launch = launch_error_message("attention dq_kernel", "cudaErrorInvalidConfiguration",
                                                  "invalid configuration argument", false);
  EXPECT_EQ(launch,
            "CUDA error in attention dq_kernel (launch): cudaErrorInvalidConfiguration (invalid configuration argument)");
  const std::string synced =
      launch_error_message("linear_cross_entropy row_kernel", "cudaErrorIllegalAddress", "an illegal memory access", true);
  EXPECT_NE(synced.find("linear_cross_entropy row_kernel"), std::string::npos) << synced;
  EXPECT_NE(synced.find("TESSERA_CUDA_SYNC_CHECK=1"), std::string::npos) << synced;
  EXPECT_NE(synced.find("cudaErrorIllegalAddress"), std::string::npos) << synced;
  EXPECT_EQ(synced.find('\n'), std::string::npos) << "one line";
}

TEST(CudaUtil, PoolKeepsTheDefaultBudgetUnlessTold) {
  EXPECT_EQ(pool_keep_bytes(-1), uint64_t{1} << 30);  // unset: the default memory budget, not everything
  EXPECT_EQ(pool_keep_bytes(0), 0u);                  // give everything back
  EXPECT_EQ(pool_keep_bytes(3000), uint64_t{3000} << 20);
}

// A fake allocator: the results of successive attempts, and how often recovery ran.
struct Fake {
  std::vector<cudaError_t> results;
  size_t attempts = 0;
  int recoveries = 0;
  cudaError_t run() {
    return allocate_with_retry([&] { return results.at(attempts++); }, [&] { ++recoveries; });
  }
};

TEST(CudaUtil, AllocationRetriesOnceAfterRecoveringFromOutOfMemory) {
  Fake ok{{cudaSuccess}};
  EXPECT_EQ(ok.run(), cudaSuccess);
  EXPECT_EQ(ok.attempts, 1u);
  EXPECT_EQ(ok.recoveries, 0);

  Fake second{{cudaErrorMemoryAllocation, cudaSuccess}};
  EXPECT_EQ(second.run(), cudaSuccess);
  EXPECT_EQ(second.attempts, 2u);
  EXPECT_EQ(second.recoveries, 1);

  Fake never{{cudaErrorMemoryAllocation, cudaErrorMemoryAllocation, cudaSuccess}};
  EXPECT_EQ(never.run(), cudaErrorMemoryAllocation);  // once only
  EXPECT_EQ(never.attempts, 2u);
  EXPECT_EQ(never.recoveries, 1);

  Fake other{{cudaErrorInvalidValue, cudaSuccess}};  // not a memory shortage: no retry
  EXPECT_EQ(other.run(), cudaErrorInvalidValue);
  EXPECT_EQ(other.attempts, 1u);
  EXPECT_EQ(other.recoveries, 0);
}

TEST(CudaUtil, TheModuleNamesGpusForTheTuner) {
  // The module's entry point registered cuda::device_kind (tests/cuda/force_module.cc loads it).
  const std::string k = tune::default_device_kind(DeviceType::kCUDA, 0);
  std::string why;
  if (device_count(&why) == 0) {
    EXPECT_EQ(k, "cuda:unknown") << why;
  } else {
    EXPECT_EQ(k.rfind("cuda:", 0), 0u) << k;
    EXPECT_EQ(k.substr(k.size() - 2), "sm") << k;
    EXPECT_EQ(k, device_kind(0));
  }
}

// The allocator's hooks for callers that hold another library's stream and buffers (the XLA FFI
// handler): a pointer's device, a stream's synchronization.
TEST(CudaUtil, PointersNameTheirDeviceAndStreamsSynchronize) {
  std::string why;
  if (device_count(&why) == 0) GTEST_SKIP() << why;
  const Tensor on_gpu = Tensor::zeros(DType::kF32, {256}, Device::cuda());
  const int host = 0;
  EXPECT_EQ(device_index_of(DeviceType::kCUDA, on_gpu.data()), 0);
  EXPECT_EQ(device_index_of(DeviceType::kCUDA, &host), -1);
  EXPECT_EQ(device_index_of(DeviceType::kCUDA, nullptr), -1);
  if (device_count(&why) > 1) {  // the device comes from the address, not the current device
    const Tensor on_second = Tensor::zeros(DType::kF32, {16}, Device::cuda(1));
    EXPECT_EQ(device_index_of(DeviceType::kCUDA, on_second.data()), 1);
  }
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  // The memset waits 50 ms behind a host function on the non-blocking stream: a synchronize that
  // did not wait leaves the plain copy (the legacy stream, which does not wait for s) the zeros.
  ASSERT_EQ(cudaLaunchHostFunc(s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(on_gpu.data(), 0x3f, on_gpu.view().nbytes(), s), cudaSuccess);
  tessera::synchronize(Device::cuda(), s);
  const Tensor back = on_gpu.to(Device::cpu());
  for (int i = 0; i < 256; ++i) ASSERT_EQ(reinterpret_cast<const uint32_t*>(back.data())[i], 0x3f3f3f3fu) << i;
  tessera::synchronize(Device::cuda(), nullptr);  // the default stream
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(LceCudaTuning, CudaIsTunableOverChunkSizesBelowTheDefault) {
  const linear_cross_entropy::Implementation* impl = linear_cross_entropy::find_implementation("cuda");
  ASSERT_NE(impl, nullptr);
  EXPECT_TRUE(impl->tunable());
  linear_cross_entropy::Problem p;
  p.B = 8192, p.H = 4096, p.V = 128256;
  p.dtype = DType::kBF16;
  p.device = Device::cuda();
  const auto def = impl->default_block_sizes(p);
  const auto cands = impl->candidate_block_sizes(p);
  ASSERT_FALSE(cands.empty());
  std::set<int64_t> seen{def.b};
  for (const auto& c : cands) {
    EXPECT_NO_THROW(impl->validate_block_sizes(c)) << c.str();
    EXPECT_LT(c.b, def.b) << c.str();  // a larger b would clamp to the default's chunk
    EXPECT_TRUE(seen.insert(c.b).second) << "duplicate " << c.str();
  }
}

}  // namespace
}  // namespace tessera::cuda
