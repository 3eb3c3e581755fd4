// Tessera tests: shared by the GPU test files (tests/kernels/*_cuda_test.cc).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/tensor.h"  // Device

// Implementation `name` of a kernel's implementations() list, or nullptr when not registered.
template <class Info>
const Info* find_info(const std::vector<Info>& infos, const std::string& name) {
  for (const auto& i : infos)
    if (i.name == name) return &i;
  return nullptr;
}

// Copies `bytes` from host memory to device memory (a test's hand-placed data, e.g. pages of a
// cache far from its start); fails the calling test on a CUDA error.
inline void copy_to_device(void* dst, const void* src, size_t bytes) {
  ASSERT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
}

// Sets every byte of device memory to 0xFF: NaN in f32, bf16 and f16, so that a read of memory a
// test never wrote shows in its results (cudaMalloc'd memory is often zero).
inline void poison_device(void* dst, size_t bytes) { ASSERT_EQ(cudaMemset(dst, 0xFF, bytes), cudaSuccess); }

// Skips the calling test, with the reason, when implementation `name` of `infos` is unavailable
// here (no device, no cuDNN); fails when it is not registered at all. `infos` is usually a
// kernel's implementations(), a temporary: the macro keeps its own copy for as long as it reads it.
#define TESSERA_SKIP_UNLESS_AVAILABLE(infos, name)                                                 \
  do {                                                                                            \
    const auto infos_ = (infos);                                                                  \
    const auto* info_ = find_info(infos_, name);                                                  \
    ASSERT_NE(info_, nullptr) << "the " << (name) << " implementation is not registered";         \
    if (!info_->available) GTEST_SKIP() << (name) << " is unavailable: " << info_->unavailable_reason; \
  } while (0)

// A case that a device implementation refuses as unsupported (Error kUnsupported: the parity
// report's `skipped`) is skipped, with the reason printed, when the suite declares that refusal
// (`declared`: a documented limitation, e.g. linear_cross_entropy's class weights on the device);
// any other refusal fails, so that a regression of supports() cannot hide as a skip. Returns
// from the calling (void) function in both cases.
#define TESSERA_SKIP_DECLARED_UNSUPPORTED(skipped, declared, reason)                                   \
  do {                                                                                                 \
    if (skipped) {                                                                                     \
      if (declared) GTEST_SKIP() << "declared unsupported by the device implementation: " << (reason); \
      FAIL() << "refused as unsupported, which this case is not declared to be: " << (reason);        \
    }                                                                                                  \
  } while (0)

// Every case of `grid` through `check(case, impl, device)` (a kernel's testing::check_parity) on
// the CUDA device: it ran (a refusal is a failure: none is declared here) and every field is
// within its tolerance.
template <class Spec, class Check>
void expect_grid_parity(const std::string& impl, const std::vector<Spec>& grid, Check check) {
  for (const Spec& c : grid) {
    const auto r = check(c, impl, tessera::Device::cuda());
    TESSERA_SKIP_DECLARED_UNSUPPORTED(r.skipped, false, c.name() + ": " + r.error);
    ASSERT_TRUE(r.ran) << impl << " " << c.name() << ": " << r.error;
    for (const auto& f : r.fields)
      EXPECT_TRUE(f.dev.ok()) << impl << " " << c.name() << " " << f.field << ": " << f.dev.str();
  }
}
