// paged_attention: the cuda backend against the reference (host copies) over the whole check grid
// (inputs on the device, index arrays in host memory); dispatch picks it for device inputs; host
// memory labelled as device memory is refused. Skips without a usable CUDA device.
#include <gtest/gtest.h>

#include "kernels/cuda_test_util.h"
#include "kernels/paged_attention/testing.h"
#include "tessera/error.h"
#include "tessera/paged_attention.h"

namespace tessera::paged_attention {
namespace {

TEST(PagedAttentionCuda, CheckGridMatchesTheReference) {
  TESSERA_SKIP_UNLESS_AVAILABLE(implementations(), "cuda");
  for (const testing::CaseSpec& c : testing::check_grid(false)) {
    const harness::ParityReport r = testing::check_parity(c, "cuda", Device::cuda());
    TESSERA_SKIP_DECLARED_UNSUPPORTED(r.skipped, false, c.name() + ": " + r.error);
    ASSERT_TRUE(r.ran) << c.name() << ": " << r.error;
    for (const auto& f : r.fields) EXPECT_TRUE(f.dev.ok()) << c.name() << " " << f.field << ": " << f.dev.str();
  }
}

TEST(PagedAttentionCuda, DispatchPicksCudaForDeviceInputs) {
  TESSERA_SKIP_UNLESS_AVAILABLE(implementations(), "cuda");
  testing::CaseSpec c;
  c.sinks = true;
  const testing::CaseData d = testing::make_case(c);
  Inputs in = d.inputs();
  const Tensor q = d.q.to(Device::cuda()), k = d.k_cache.to(Device::cuda()), v = d.v_cache.to(Device::cuda());
  const Tensor s = d.sinks.to(Device::cuda());
  in.q = q.view(), in.k_cache = k.view(), in.v_cache = v.view(), in.sinks = s.view();
  const Result r = compute(in, testing::options_of(c));
  EXPECT_EQ(r.implementation, "cuda");
}

TEST(PagedAttentionCuda, HostMemoryLabelledAsDeviceIsRefused) {
  TESSERA_SKIP_UNLESS_AVAILABLE(implementations(), "cuda");
  testing::CaseSpec c;
  const testing::CaseData d = testing::make_case(c);
  Inputs in = d.inputs();
  const Tensor k = d.k_cache.to(Device::cuda()), v = d.v_cache.to(Device::cuda());
  TensorView q = d.q.view();
  q.device = Device::cuda();  // a host pointer that claims to be device memory
  in.q = q, in.k_cache = k.view(), in.v_cache = v.view();
  Tensor o = Tensor::empty(DType::kF32, {d.q.shape()[0], c.Hq, c.Dv}, Device::cuda());
  Tensor lse = Tensor::empty(DType::kF32, {d.q.shape()[0], c.Hq}, Device::cuda());
  Options opt;
  opt.implementation = "cuda";
  EXPECT_THROW(forward(in, {o.view(), lse.view()}, opt), Error);
}

}  // namespace
}  // namespace tessera::paged_attention
