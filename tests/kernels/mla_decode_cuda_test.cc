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
  for (const testing::CaseSpec& s : testing::check_grid(false)) {
    const harness::ParityReport r = testing::check_parity(s, "cuda", Device::cuda());
    TESSERA_SKIP_DECLARED_UNSUPPORTED(r.skipped, false, s.name() + ": " + r.error);
    ASSERT_TRUE(r.ran) << s.name() << ": " << r.error;
    for (const auto& f : r.fields) EXPECT_TRUE(f.dev.ok()) << s.name() << " " << f.field << ": " << f.dev.str();
  }
}

// Every split size gives the unsplit result within f32 rounding of the combine (1e-5).
TEST(MlaDecodeCuda, SplitEqualsUnsplit) {
  SKIP_WITHOUT_GPU();
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
    opt.dv = s.Dv, opt.implementation = "cuda", opt.block_sizes = BlockSizes{split};
    EXPECT_EQ(forward({q.view(), kv.view(), d.page_table.view(), d.seqlens.view()}, {o.view(), lse.view()}, opt), "cuda");
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
