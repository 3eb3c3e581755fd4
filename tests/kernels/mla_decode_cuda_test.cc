// mla_decode: the cuda backend against the reference (host copies) over the whole check grid,
// split-KV equal to unsplit on the device, dispatch of device inputs, and host memory labelled as
// device memory refused. Compiled only when the CUDA backend is built; skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda_test_util.h"
#include "kernels/mla_decode/testing.h"
#include "tessera/error.h"
#include "tessera/mla_decode.h"

namespace tessera::mla_decode {
namespace {

#define SKIP_WITHOUT_GPU() TESSERA_SKIP_UNLESS_AVAILABLE(implementations(), "cuda")

TEST(MlaDecodeCuda, CheckGridMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  expect_grid_parity("cuda", testing::check_grid(false), testing::check_parity);
}

// cuda_v2 (primitives/cuda_split_kv.cuh) over the same grid and its own edges: Hq 1, 2, 3 (a
// partial item) and 128 (32 items a row), Sq > 1 causal rows sharing an item, a sequence shorter
// than Sq, an empty one, D 576 / Dv 512 in every dtype with bf16 / f16 outputs, D not a multiple of 8.
TEST(MlaDecodeCuda, V2MatchesTheReference) {
  TESSERA_SKIP_UNLESS_AVAILABLE(implementations(), "cuda_v2");
  expect_grid_parity("cuda_v2", testing::check_grid(false), testing::check_parity);
  std::vector<testing::CaseSpec> edges;
  uint64_t seed = 500;
  for (const int64_t hq : {1, 2, 3, 128})
    for (const DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      testing::CaseSpec s;
      s.dtype = dt, s.Hq = hq, s.Sq = hq == 128 ? 1 : 3, s.seqlens = {700, 2, 0, 65};
      s.D = hq == 3 ? 36 : 576, s.Dv = hq == 3 ? 20 : 512, s.page_size = hq == 3 ? 5 : 64;
      s.o_f32 = dt == DType::kF32 || hq != 2, s.opt.causal = hq != 1, s.seed = ++seed;
      edges.push_back(s);
    }
  expect_grid_parity("cuda_v2", edges, testing::check_parity);
}

// Every split size gives the unsplit result within f32 rounding of the combine (1e-5), on cuda and
// on cuda_v2 (its chunk length is the split, in whole 128-key tiles).
class MlaDecodeCudaSplits : public ::testing::TestWithParam<const char*> {};

TEST_P(MlaDecodeCudaSplits, SplitEqualsUnsplit) {
  const std::string impl = GetParam();
  TESSERA_SKIP_UNLESS_AVAILABLE(implementations(), impl);
  testing::CaseSpec s;
  s.seqlens = {300, 1, 0, 129};
  s.Sq = 3, s.Hq = 4, s.D = 40, s.Dv = 24, s.page_size = 10;
  s.opt.causal = true;
  const testing::CaseData d = testing::make_case(s);
  const Tensor q = d.q.to(Device::cuda()), kv = d.kv.to(Device::cuda());
  auto run = [&](int64_t split) {
    Tensor o = Tensor::zeros(DType::kF32, {s.B(), s.Sq, s.Hq, s.Dv}, Device::cuda());
    Tensor lse = Tensor::zeros(DType::kF32, {s.B(), s.Sq, s.Hq}, Device::cuda());
    Options opt = s.opt;
    opt.dv = s.Dv, opt.implementation = impl, opt.block_sizes = BlockSizes{split};
    EXPECT_EQ(forward({q.view(), kv.view(), d.page_table.view(), d.seqlens.view()}, {o.view(), lse.view()}, opt), impl);
    return std::pair{o.to(Device{}), lse.to(Device{})};
  };
  const auto whole = run(300);
  for (int64_t split : {1, 7, 64, 129, 0}) {
    const auto part = run(split);
    for (int64_t i = 0; i < whole.first.numel(); ++i)
      ASSERT_NEAR(part.first.data_as<float>()[i], whole.first.data_as<float>()[i], 1e-5) << split << " o " << i;
    for (int64_t i = 0; i < whole.second.numel(); ++i) {
      const float w = whole.second.data_as<float>()[i], g = part.second.data_as<float>()[i];
      if (std::isinf(w)) ASSERT_EQ(g, w) << i;
      else ASSERT_NEAR(g, w, 1e-5) << split << " lse " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, MlaDecodeCudaSplits, ::testing::Values("cuda", "cuda_v2"),
                         [](const auto& info) { return std::string(info.param); });

// Device inputs dispatch to cuda by default; host memory labelled cuda is refused before running.
TEST(MlaDecodeCuda, DispatchAndHostMemoryLabelledDevice) {
  SKIP_WITHOUT_GPU();
  testing::CaseSpec s;
  const testing::CaseData d = testing::make_case(s);
  const Tensor q = d.q.to(Device::cuda()), kv = d.kv.to(Device::cuda());
  Tensor o = Tensor::zeros(DType::kF32, {s.B(), s.Sq, s.Hq, s.Dv}, Device::cuda());
  Tensor lse = Tensor::zeros(DType::kF32, {s.B(), s.Sq, s.Hq}, Device::cuda());
  Options opt;
  opt.dv = s.Dv;
  EXPECT_EQ(forward({q.view(), kv.view(), d.page_table.view(), d.seqlens.view()}, {o.view(), lse.view()}, opt), "cuda");
  TensorView fake_q = d.q.view();
  fake_q.device = Device::cuda();
  opt.implementation = "cuda";
  EXPECT_THROW(forward({fake_q, kv.view(), d.page_table.view(), d.seqlens.view()}, {o.view(), lse.view()}, opt), Error);
}

}  // namespace
}  // namespace tessera::mla_decode
