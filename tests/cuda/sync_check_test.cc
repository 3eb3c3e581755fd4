// TESSERA_CUDA_SYNC_CHECK=1 (core/cuda_util.h): a kernel's fault is reported by the launch that
// caused it, naming the kernel. The fault is sticky (it poisons the CUDA context), so it happens
// in a child process: a death test of the "threadsafe" style re-runs this binary with only this
// test, so the child starts with a fresh CUDA context and reads the switch afresh.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/cuda_util.h"
#include "tessera/error.h"

namespace tessera::testing {
void launch_faulting_kernel(cudaStream_t stream);  // fault_kernel.cu
}

namespace tessera::cuda {
namespace {

// In the child: launch, check as every backend does, print what check_launch threw, exit 0 when
// it named the kernel and the switch.
[[noreturn]] void fault_and_report() {
  ::setenv("TESSERA_CUDA_SYNC_CHECK", "1", 1);
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) std::_Exit(2);
  testing::launch_faulting_kernel(s);
  try {
    check_launch("test faulting_kernel", s);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    const std::string m = e.what();
    std::_Exit(m.find("test faulting_kernel") != std::string::npos &&
                       m.find("TESSERA_CUDA_SYNC_CHECK=1") != std::string::npos
                   ? 0
                   : 3);
  }
  std::fprintf(stderr, "check_launch did not report the fault\n");
  std::_Exit(4);
}

TEST(CudaSyncCheck, AFaultIsReportedByItsLaunchNamingTheKernel) {
  std::string why;
  if (device_count(&why) == 0) GTEST_SKIP() << why;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fault_and_report(), ::testing::ExitedWithCode(0),
              "CUDA error in test faulting_kernel \\(found by TESSERA_CUDA_SYNC_CHECK=1");
}

}  // namespace
}  // namespace tessera::cuda
