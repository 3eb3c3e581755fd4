// grouped_matmul: the cuda backend against the reference (host copies) over the whole check grid,
// forward / backward / fused; dispatch of device inputs; device group sizes refused clearly.
// Compiled only when the CUDA backend is built; every GPU test skips cleanly without a device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cuda_test_util.h"
#include "kernels/grouped_matmul/testing.h"
#include "tessera/error.h"
#include "tessera/grouped_matmul.h"

namespace tessera::grouped_matmul {
namespace {

const ImplementationInfo* cuda_info() {
  static const std::vector<ImplementationInfo> infos = implementations();
  for (const auto& i : infos)
    if (i.name == "cuda") return &i;
  return nullptr;
}

#define SKIP_WITHOUT_GPU()                                                                       \
  do {                                                                                           \
    const auto* info_ = cuda_info();                                                             \
    ASSERT_NE(info_, nullptr) << "the cuda implementation is not registered";                    \
    if (!info_->available) GTEST_SKIP() << "no usable CUDA device: " << info_->unavailable_reason; \
  } while (0)

TEST(GroupedMatmulCuda, CheckGridMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  for (const testing::CaseSpec& s : testing::check_grid(false))
    for (Pass pass : {Pass::kForward, Pass::kBackward, Pass::kFused}) {
      const harness::ParityReport r = testing::check_parity(s, "cuda", pass, Device::cuda());
      // The cuda backend declares no grid case unsupported (host group sizes, int-sized dims).
      TESSERA_SKIP_DECLARED_UNSUPPORTED(r.skipped, false, s.name() + " " + pass_name(pass) + ": " + r.error);
      ASSERT_TRUE(r.ran) << s.name() << " " << pass_name(pass) << ": " << r.error;
      for (const auto& f : r.fields)
        EXPECT_TRUE(f.dev.ok()) << s.name() << " " << pass_name(pass) << " " << f.field << ": " << f.dev.str();
    }
}

TEST(GroupedMatmulCuda, DeviceInputsDispatchToCudaAndDeviceGroupSizesAreRefused) {
  SKIP_WITHOUT_GPU();
  testing::CaseSpec s;
  const testing::CaseData d = testing::make_case(s);
  const Tensor lhs = d.lhs.to(Device::cuda()), rhs = d.rhs.to(Device::cuda());
  const Result r = compute({lhs.view(), rhs.view(), d.group_sizes.view()}, testing::options_of(s));
  EXPECT_EQ(r.implementation, "cuda");
  EXPECT_EQ(r.out.device().type, DeviceType::kCUDA);
  const Tensor gs_dev = d.group_sizes.to(Device::cuda());
  try {
    compute({lhs.view(), rhs.view(), gs_dev.view()}, testing::options_of(s));
    ADD_FAILURE() << "device group sizes were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group_sizes must be in host memory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::grouped_matmul
