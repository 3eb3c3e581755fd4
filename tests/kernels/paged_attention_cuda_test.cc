// paged_attention: the cuda backend against the reference (host copies) over the whole check grid
// (inputs on the device, index arrays in host memory); dispatch picks it for device inputs; host
// memory labelled as device memory is refused. Skips without a usable CUDA device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cuda_test_util.h"
#include "kernels/paged_attention/testing.h"
#include "tessera/error.h"
#include "tessera/paged_attention.h"

namespace tessera::paged_attention {
namespace {

TEST(PagedAttentionCuda, CheckGridMatchesTheReference) {
  TESSERA_SKIP_UNLESS_AVAILABLE(implementations(), "cuda");
  expect_grid_parity("cuda", testing::check_grid(false), testing::check_parity);
}

// cuda_v2 over the same grid, and where its own layout has edges: GQA groups of 1, 2, 3 (R = 2,
// a partial item), 4, 8 and 16 (two items a row), prefill rows sharing an item, a window, sinks, keys over several
// chunks and tiles with a ragged end, an empty sequence, every dtype, D not a multiple of 8.
TEST(PagedAttentionCuda, V2MatchesTheReference) {
  TESSERA_SKIP_UNLESS_AVAILABLE(implementations(), "cuda_v2");
  expect_grid_parity("cuda_v2", testing::check_grid(false), testing::check_parity);
  std::vector<testing::CaseSpec> edges;
  uint64_t seed = 900;
  for (const int64_t g : {1, 2, 3, 4, 8, 16})  // 16: R = 8, two items a row
    for (const DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      testing::CaseSpec c;
      c.dtype = dt, c.Hkv = 2, c.Hq = 2 * g, c.D = g == 3 ? 20 : 64, c.Dv = g == 3 ? 24 : 64;
      c.kv_lens = {1300, 0, 37, 300};
      c.q_lens = {1, 0, 5, 3};
      c.page_size = 16, c.causal = true, c.sinks = g == 2, c.window = g == 4 ? 100 : -1;
      c.seed = ++seed;
      edges.push_back(c);
    }
  expect_grid_parity("cuda_v2", edges, testing::check_parity);
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
