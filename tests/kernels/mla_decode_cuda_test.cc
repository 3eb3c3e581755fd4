// mla_decode: the cuda backend against the reference (host copies) over the whole check grid,
// split-KV equal to unsplit on the device, dispatch of device inputs, and host memory labelled as
// device memory refused, a cache read past element 2^31. Compiled only when the CUDA backend is built; skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda_test_util.h"
#include "kernels/mla_decode/testing.h"
#include "reliability/relocated_pages.h"
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

// Inf in a cache entry j < L_b (never scanned), as the reference and cpu
// (MlaDecodeCpu.InfInAKeyARowDoesNotSeeStaysOutOfThatRow): the rows of the query that sees it are
// NaN (o and lse; never o = 0, lse = −inf), the other queries' rows keep their values. Small
// splits, so that the NaN partial meets finite ones in the combine. Written 2026-11-28
// (twenty-first session) without a GPU: first run at the next lease.
TEST_P(MlaDecodeCudaSplits, NonFiniteEntryAsTheReference) {
  const std::string impl = GetParam();
  TESSERA_SKIP_UNLESS_AVAILABLE(implementations(), impl);
  for (const int64_t bad_dim : {0, 30}) {  // inside Dv (reaches o), past it (scores only)
    testing::CaseSpec s;
    s.seqlens = {150, 7};
    s.Sq = 3, s.Hq = 4, s.D = 40, s.Dv = 24, s.page_size = 10;
    s.opt.causal = true, s.opt.dv = s.Dv;
    testing::CaseData d = testing::make_case(s);
    const int32_t page = static_cast<const int32_t*>(d.page_table.data())[149 / s.page_size];
    static_cast<float*>(d.kv.data())[(page * s.page_size + 149 % s.page_size) * s.D + bad_dim] = INFINITY;  // query 2 sees it
    const Shape o_shape{s.B(), s.Sq, s.Hq, s.Dv}, lse_shape{s.B(), s.Sq, s.Hq};
    Tensor want_o = Tensor::zeros(DType::kF32, o_shape), want_lse = Tensor::zeros(DType::kF32, lse_shape);
    Options opt = s.opt;
    opt.implementation = "reference";
    forward(d.inputs(), {want_o.view(), want_lse.view()}, opt);
    const Tensor q = d.q.to(Device::cuda()), kv = d.kv.to(Device::cuda());
    Tensor o = Tensor::zeros(DType::kF32, o_shape, Device::cuda()), lse = Tensor::zeros(DType::kF32, lse_shape, Device::cuda());
    Inputs in = d.inputs();
    in.q = q.view(), in.kv_cache = kv.view();
    opt.implementation = impl;
    opt.block_sizes = BlockSizes{impl == "cuda" ? 16 : 128};
    forward(in, {o.view(), lse.view()}, opt);
    const Tensor got_o = o.to(Device::cpu()), got_lse = lse.to(Device::cpu());
    int64_t nan_rows = 0;
    for (int64_t i = 0; i < got_lse.numel(); ++i) {
      const float w = want_lse.data_as<float>()[i], g = got_lse.data_as<float>()[i];
      ASSERT_EQ(std::isnan(g), std::isnan(w)) << "dim " << bad_dim << " lse " << i << ": " << g << ", reference " << w;
      nan_rows += std::isnan(w);
      if (!std::isnan(w)) EXPECT_NEAR(g, w, 1e-4) << i;
    }
    for (int64_t i = 0; i < got_o.numel(); ++i) {
      const float w = want_o.data_as<float>()[i], g = got_o.data_as<float>()[i];
      ASSERT_EQ(std::isfinite(g), std::isfinite(w)) << "dim " << bad_dim << " o " << i << ": " << g << ", reference " << w;
      if (std::isfinite(w)) EXPECT_NEAR(g, w, 1e-4) << i;
    }
    EXPECT_GT(nan_rows, 0) << "query 2 sees the Inf";
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, MlaDecodeCudaSplits, ::testing::Values("cuda", "cuda_v2"),
                         [](const auto& info) { return std::string(info.param); });

// The case's q and cache on the device with f32 outputs there; forward() by the default order.
struct OnDevice {
  testing::CaseSpec s;
  testing::CaseData d = testing::make_case(s);
  Tensor q = d.q.to(Device::cuda()), kv = d.kv.to(Device::cuda());
  Tensor o = Tensor::zeros(DType::kF32, {s.B(), s.Sq, s.Hq, s.Dv}, Device::cuda());
  Tensor lse = Tensor::zeros(DType::kF32, {s.B(), s.Sq, s.Hq}, Device::cuda());
  std::string forward_by(Options opt, const TensorView& q_view) const {
    opt.dv = s.Dv;
    return forward({q_view, kv.view(), d.page_table.view(), d.seqlens.view()}, {o.view(), lse.view()}, opt);
  }
};

// Device inputs dispatch to cuda_v2 by default; host memory labelled cuda is refused before running.
TEST(MlaDecodeCuda, DispatchAndHostMemoryLabelledDevice) {
  SKIP_WITHOUT_GPU();
  const OnDevice c{testing::CaseSpec{}};
  EXPECT_EQ(c.forward_by({}, c.q.view()), "cuda_v2");
  TensorView fake_q = c.d.q.view();
  fake_q.device = Device::cuda();
  Options opt;
  opt.implementation = "cuda";
  try {
    c.forward_by(opt, fake_q);
    ADD_FAILURE() << "host memory labelled cuda was accepted";
  } catch (const Error& e) {  // the check's own message, not any launch failure
    EXPECT_NE(std::string(e.what()).find("is labelled cuda"), std::string::npos) << e.what();
  }
}

// Head dims past v2's (D <= 576): the default order falls back to v1 (D <= 1024), which matches
// the reference there.
TEST(MlaDecodeCuda, DispatchFallsBackToV1PastV2sHeadDims) {
  SKIP_WITHOUT_GPU();
  testing::CaseSpec s;
  s.D = 640, s.Dv = 64;
  const OnDevice c{s};
  EXPECT_EQ(c.forward_by({}, c.q.view()), "cuda");
  expect_grid_parity("cuda", std::vector<testing::CaseSpec>{s}, testing::check_parity);
}

// The case of MlaDecodeLarge (tests/reliability/large_index_test.cc) on the device, bf16: a
// latent cache of 8.6 GB (D 576, 64 entries a page) with the case's pages moved around element
// 2^31 and past 2^32, every other byte NaN. Every cuda version, with its own split and keys split
// at a page, gives the packed case's o and lse (f32) within 1e-5. Named LargeShape: the sanitize
// stage leaves it out.
TEST(MlaDecodeCuda, LargeShapeCachePast2To31Elements) {
  SKIP_WITHOUT_GPU();
  testing::CaseSpec c;
  c.Sq = 2, c.Hq = 16, c.D = 576, c.Dv = 512, c.page_size = 64, c.seqlens = {150, 70};
  c.dtype = DType::kBF16, c.shared = true, c.seed = 78, c.opt.causal = true;
  const testing::CaseData d = testing::make_case(c);
  const int64_t n = d.kv.shape()[0], page_elems = c.page_size * c.D;
  const std::vector<int64_t> far = relocated::far_pages(page_elems, n);
  const int64_t P = relocated::pages_for(page_elems, n);
  ASSERT_GT(far[1] * page_elems, relocated::k2To32);
  const Tensor big_kv = Tensor::empty(c.dtype, {P, c.page_size, 1, c.D}, Device::cuda());
  ASSERT_NO_FATAL_FAILURE(poison_device(big_kv.data(), big_kv.view().nbytes()));
  ASSERT_NO_FATAL_FAILURE(
      relocated::place_pages(d.kv.data(), big_kv.data(), page_elems * dtype_size(c.dtype), far, copy_to_device));
  const Tensor table = relocated::renumber(d.page_table, far);
  const Tensor q = d.q.to(Device::cuda()), kv = d.kv.to(Device::cuda());
  const Inputs small{q.view(), kv.view(), d.page_table.view(), d.seqlens.view()};
  const Inputs big{q.view(), big_kv.view(), table.view(), d.seqlens.view()};
  const std::vector<ImplementationInfo> infos = implementations();
  for (const char* impl : {"cuda", "cuda_v2"}) {
    const auto* info = find_info(infos, impl);
    if (!info || !info->available) continue;
    for (const int64_t split : {int64_t{0}, int64_t{64}}) {
      Options opt = c.opt;
      opt.dv = c.Dv, opt.implementation = impl, opt.block_sizes = BlockSizes{split};
      Tensor o[2], lse[2];
      for (int i = 0; i < 2; ++i) {
        o[i] = Tensor::empty(DType::kF32, {c.B(), c.Sq, c.Hq, c.Dv}, Device::cuda());
        lse[i] = Tensor::empty(DType::kF32, {c.B(), c.Sq, c.Hq}, Device::cuda());
        EXPECT_EQ(forward(i == 0 ? small : big, {o[i].view(), lse[i].view()}, opt), impl);
      }
      EXPECT_LE(relocated::max_abs_diff(o[0].to(Device::cpu()), o[1].to(Device::cpu())), 1e-5) << impl << " " << split;
      EXPECT_LE(relocated::max_abs_diff(lse[0].to(Device::cpu()), lse[1].to(Device::cpu())), 1e-5) << impl << " " << split;
    }
  }
}

}  // namespace
}  // namespace tessera::mla_decode
