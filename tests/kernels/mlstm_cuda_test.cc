// mlstm: the cuda backend against the reference (host copies), forward and backward — the whole
// check grid, then a grid of its own over S, chunk sizes, reset patterns, batch sizes and every
// dtype of q/k/v and of the gates; large gates without NaN/Inf; two calls = one call on the
// device; dispatch of device inputs and the named refusals. Compiled only when the CUDA backend is
// built; skips without a device. Tolerances: testing::tolerance (the chunkwise form's f32 sums in
// another order; the cpu backend's, justified in testing.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda_test_util.h"
#include "kernels/mlstm/testing.h"
#include "tessera/error.h"
#include "tessera/mlstm.h"

namespace tessera::mlstm {
namespace {

#define SKIP_WITHOUT_GPU() TESSERA_SKIP_UNLESS_AVAILABLE(implementations(), "cuda")

// Forward and backward parity of `s` on the device; every field within its tolerance.
void expect_parity(const testing::CaseSpec& s) {
  for (Pass pass : {Pass::kForward, Pass::kBackward}) {
    const harness::ParityReport r = testing::check_parity(s, "cuda", pass, Device::cuda());
    ASSERT_TRUE(r.ran) << s.name() << " " << pass_name(pass) << ": " << r.error;
    for (const auto& f : r.fields) EXPECT_TRUE(f.dev.ok()) << s.name() << " " << pass_name(pass) << " " << f.field << ": " << f.dev.str();
  }
}

testing::CaseSpec spec(int64_t B, int64_t S, int64_t DK, int64_t DV, int64_t chunk, const char* resets) {
  testing::CaseSpec c;
  c.label = "cuda", c.B = B, c.S = S, c.DK = DK, c.DV = DV, c.resets = resets;
  c.opt.chunk_size = chunk;
  return c;
}

TEST(MlstmCuda, CheckGridMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  for (const testing::CaseSpec& s : testing::check_grid(false)) expect_parity(s);
}

// S ∈ {1, 7, 64, 129}; a chunk that divides S and one that does not (and the default, and the
// largest, 128); DHQK ≠ DHV; B ∈ {1, 3}; resets none / at chunk boundaries / inside chunks / every
// step / two in a row across a boundary; initial state on every other case.
TEST(MlstmCuda, ShapesChunksAndResets) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> shapes = {
      {1, {1, 4}}, {7, {7, 3}}, {64, {16, 24, 0}}, {129, {43, 32, 128}}};
  int n = 0;
  for (const auto& [S, chunks] : shapes)
    for (int64_t chunk : chunks)
      for (const char* resets : {"none", "chunk", "inside", "every", "pair"}) {
        testing::CaseSpec c = spec(n % 2 ? 3 : 1, S, 12, 20, chunk, resets);
        c.initial_state = n % 2 == 0;
        c.seed = uint64_t(1000 + n++);
        expect_parity(c);
      }
  // Head dims past one warp's lanes and one block's threads, a tail block of rows, eps = 0.
  testing::CaseSpec wide = spec(2, 50, 40, 72, 16, "inside");
  wide.initial_state = true;
  expect_parity(wide);
  testing::CaseSpec odd = spec(1, 37, 33, 65, 0, "random");
  odd.initial_state = true, odd.opt.eps = 0.0;
  expect_parity(odd);
}

// Every dtype of q/k/v with every dtype of the gates; h and the gradients stored in q's dtype.
TEST(MlstmCuda, EveryDtype) {
  SKIP_WITHOUT_GPU();
  for (DType qkv : {DType::kF32, DType::kBF16, DType::kF16})
    for (DType gates : {DType::kF32, DType::kBF16, DType::kF16}) {
      testing::CaseSpec c = spec(3, 29, 16, 8, 8, "random");
      c.dtype = qkv, c.gate_dtype = gates, c.initial_state = true;
      expect_parity(c);
    }
}

// Gates ±40 and ±100 (m far from 0 both ways, within the parity tolerance) and ±1000 (no NaN/Inf
// anywhere: forward, last states, backward; df there is a sum of O(1) terms cancelling to ~1e-5,
// beyond f32 — the cpu backend misses the parity tolerance the same way).
TEST(MlstmCuda, LargeGates) {
  SKIP_WITHOUT_GPU();
  for (float scale : {40.0f, 100.0f})
    for (const char* resets : {"none", "inside"}) {
      testing::CaseSpec c = spec(3, 70, 8, 12, 16, resets);
      c.gate_scale = scale, c.initial_state = true;
      expect_parity(c);
    }
  for (float scale : {1000.0f}) {
    testing::CaseSpec c = spec(1, 40, 8, 8, 16, "inside");
    c.gate_scale = scale, c.initial_state = true;
    for (Pass pass : {Pass::kForward, Pass::kBackward}) {
      const harness::ParityReport r = testing::check_parity(c, "cuda", pass, Device::cuda());
      ASSERT_TRUE(r.ran) << r.error;
      for (const auto& f : r.fields) EXPECT_EQ(f.dev.nonfinite, 0) << scale << " " << f.field << ": " << f.dev.str();
    }
  }
}

// The last states of a first call as the initial state of a second: h of both calls equals h of
// one call over the whole sequence, and the last states agree (C·e^m, n·e^m, both f32 runs).
TEST(MlstmCuda, TwoCallsEqualOneCall) {
  SKIP_WITHOUT_GPU();
  testing::CaseSpec s = spec(2, 40, 8, 12, 8, "inside");
  const testing::CaseData d = testing::make_case(s);
  const Device dev = Device::cuda();
  const int64_t B = s.B, NH = s.NH, DK = s.DK, DV = s.DV;
  Options opt;
  opt.implementation = "cuda", opt.chunk_size = 8;
  auto slice = [](const Tensor& t, int64_t lo, int64_t hi, int64_t inner, int64_t rows) {  // [.., S, inner] → [.., hi−lo, inner]
    const int64_t S = t.shape()[t.shape().size() - (inner > 1 ? 2 : 1)];
    Shape shape = t.shape();
    shape[shape.size() - (inner > 1 ? 2 : 1)] = hi - lo;
    Tensor r = Tensor::empty(t.dtype(), shape);
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t j = 0; j < (hi - lo) * inner; ++j)
        r.data_as<float>()[o * (hi - lo) * inner + j] = t.data_as<float>()[o * S * inner + lo * inner + j];
    return r;
  };
  auto run = [&](int64_t lo, int64_t hi, const Tensor& c0, const Tensor& n0, const Tensor& m0, Tensor& h, Tensor& c,
                 Tensor& n, Tensor& m) {
    const Tensor q = slice(d.q, lo, hi, DK, B * NH).to(dev), k = slice(d.k, lo, hi, DK, B * NH).to(dev),
                 v = slice(d.v, lo, hi, DV, B * NH).to(dev), i = slice(d.i, lo, hi, 1, B * NH).to(dev),
                 f = slice(d.f, lo, hi, 1, B * NH).to(dev);
    Tensor r = Tensor::zeros(DType::kI32, {B, hi - lo});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = lo; t < hi; ++t) r.data_as<int32_t>()[b * (hi - lo) + t - lo] = d.resets.data_as<int32_t>()[b * s.S + t];
    const Tensor rd = r.to(dev);
    h = Tensor::zeros(DType::kF32, {B, NH, hi - lo, DV}, dev);
    c = Tensor::zeros(DType::kF32, {B, NH, DK, DV}, dev), n = Tensor::zeros(DType::kF32, {B, NH, DK}, dev);
    m = Tensor::zeros(DType::kF32, {B, NH}, dev);
    Inputs in{q.view(), k.view(), v.view(), i.view(), f.view(), rd.view()};
    if (c0.defined()) in.c0 = c0.view(), in.n0 = n0.view(), in.m0 = m0.view();
    EXPECT_EQ(forward(in, h.view(), {c.view(), n.view(), m.view()}, opt), "cuda");
  };
  Tensor h, c, n, m, h1, c1, n1, m1, h2, c2, n2, m2;
  run(0, s.S, {}, {}, {}, h, c, n, m);
  run(0, 17, {}, {}, {}, h1, c1, n1, m1);
  run(17, s.S, c1, n1, m1, h2, c2, n2, m2);
  const Tensor H = h.to(Device{}), H1 = h1.to(Device{}), H2 = h2.to(Device{});
  for (int64_t o = 0; o < B * NH; ++o)
    for (int64_t t = 0; t < s.S; ++t)
      for (int64_t y = 0; y < DV; ++y) {
        const float want = H.data_as<float>()[(o * s.S + t) * DV + y];
        const float got = t < 17 ? H1.data_as<float>()[(o * 17 + t) * DV + y] : H2.data_as<float>()[(o * (s.S - 17) + t - 17) * DV + y];
        ASSERT_NEAR(got, want, 1e-5 + 1e-4 * std::fabs(want)) << o << " " << t << " " << y;
      }
  const Tensor C = c.to(Device{}), C2 = c2.to(Device{}), N = n.to(Device{}), N2 = n2.to(Device{}), M = m.to(Device{}),
               M2 = m2.to(Device{});
  for (int64_t o = 0; o < B * NH; ++o) {
    const double e = std::exp(double(M.data_as<float>()[o])), e2 = std::exp(double(M2.data_as<float>()[o]));
    for (int64_t j = 0; j < DK * DV; ++j) {
      const double want = C.data_as<float>()[o * DK * DV + j] * e;
      ASSERT_NEAR(C2.data_as<float>()[o * DK * DV + j] * e2, want, 1e-5 + 1e-4 * std::fabs(want)) << o << " " << j;
    }
    for (int64_t j = 0; j < DK; ++j) {
      const double want = N.data_as<float>()[o * DK + j] * e;
      ASSERT_NEAR(N2.data_as<float>()[o * DK + j] * e2, want, 1e-5 + 1e-4 * std::fabs(want)) << o << " " << j;
    }
  }
}

// Forget gates that erase the state (f = −inf, −FLT_MAX as masked_fill(finfo.min) writes): the
// step acts as a reset with m = i, df = 0 there — every output against the reference, as the cpu
// backend's Mlstm.ErasingForgetGatesMatchTheReference (the chunk sums once took −inf in: NaN).
TEST(MlstmCuda, ErasingForgetGatesMatchTheReference) {
  SKIP_WITHOUT_GPU();
  for (float erase : {-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::max()}) {
    const testing::CaseData d = testing::erasing_forget_case(erase);
    const auto want = testing::forward_backward_outputs(d, "reference", 8);
    const auto got = testing::forward_backward_outputs(d, "cuda", 8, Device::cuda());
    for (size_t o = 0; o < got.size(); ++o) {
      double scale = 0.0;
      for (float v : want[o]) scale = std::max(scale, double(std::abs(v)));
      for (size_t j = 0; j < got[o].size(); ++j)
        ASSERT_NEAR(got[o][j], want[o][j], 1e-4 * (1.0 + scale)) << "output " << o << " element " << j << " f = " << erase;
    }
  }
}

// Device inputs dispatch to cuda by default; host memory labelled cuda, a chunk over the limit and
// DHQK over the limit are refused before anything is written.
TEST(MlstmCuda, DispatchAndRefusals) {
  SKIP_WITHOUT_GPU();
  testing::CaseSpec s = spec(1, 9, 8, 8, 4, "none");
  const testing::CaseData host = testing::make_case(s);
  const testing::CaseData d = host.to(Device::cuda());
  Tensor h = Tensor::zeros(DType::kF32, {s.B, s.NH, s.S, s.DV}, Device::cuda());
  Options opt;
  EXPECT_EQ(forward(d.inputs(), h.view(), {}, opt), "cuda");
  auto untouched = [&] {
    const Tensor hh = h.to(Device{});
    for (int64_t j = 0; j < hh.numel(); ++j)
      if (hh.data_as<float>()[j] != 7.0f) return false;
    return true;
  };
  Tensor sevens = Tensor::empty(DType::kF32, {s.B, s.NH, s.S, s.DV});
  for (int64_t j = 0; j < sevens.numel(); ++j) sevens.data_as<float>()[j] = 7.0f;
  h = sevens.to(Device::cuda());
  Inputs fake = d.inputs();
  fake.q = host.q.view();
  fake.q.device = Device::cuda();
  opt.implementation = "cuda";
  EXPECT_THROW(forward(fake, h.view(), {}, opt), Error);
  EXPECT_TRUE(untouched());
  opt.chunk_size = 129;
  try {
    forward(d.inputs(), h.view(), {}, opt);
    ADD_FAILURE() << "chunk_size 129 ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("chunk_size must be <= 128"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(untouched());
}

}  // namespace
}  // namespace tessera::mlstm
