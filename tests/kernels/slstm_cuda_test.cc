// slstm: the cuda backend against the reference (host copies) over the kernel's check grid and a
// device grid (S ∈ {1, 2, 33}, B ∈ {1, 17}, DH ∈ {8, 64, 128}, NH ∈ {1, 4}, resets none / random /
// every step, initial states, ±50 gates, every dtype; forward, backward, fused), dispatch of device
// inputs, the DH limit named, dh in the inputs' dtype, host memory labelled as device memory refused.
// Compiled only when the CUDA backend is built; skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda_test_util.h"
#include "kernels/slstm/cuda_plan.h"
#include "kernels/slstm/testing.h"
#include "tessera/error.h"
#include "tessera/slstm.h"

namespace tessera::slstm {
namespace {

#define SKIP_WITHOUT_GPU() TESSERA_SKIP_UNLESS_AVAILABLE(implementations(), "cuda")

void expect_parity(const std::vector<testing::CaseSpec>& grid) {
  for (const testing::CaseSpec& s : grid)
    for (Pass pass : {Pass::kForward, Pass::kBackward, Pass::kFused}) {
      const harness::ParityReport r = testing::check_parity(s, "cuda", pass, Device::cuda());
      TESSERA_SKIP_DECLARED_UNSUPPORTED(r.skipped, false, s.name() + ": " + r.error);
      ASSERT_TRUE(r.ran) << s.name() << " " << pass_name(pass) << ": " << r.error;
      for (const auto& f : r.fields)
        EXPECT_TRUE(f.dev.ok()) << s.name() << " " << pass_name(pass) << " " << f.field << ": " << f.dev.str();
    }
}

TEST(SlstmCuda, CheckGridMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  expect_parity(testing::check_grid(false));
}

// DH = 128 in f32 holds 32 rows of r in registers (the rest in shared memory); bf16 / f16 keep it
// all in shared memory: both layouts, every dtype, B = 17 (a tail block of 1 row), NH = 4.
TEST(SlstmCuda, DeviceGridMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  std::vector<testing::CaseSpec> grid;
  uint64_t seed = 700;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t DH : {8, 64, 128}) {
      testing::CaseSpec c;
      c.dtype = dt, c.DH = DH, c.seed = ++seed;
      c.label = "cuda_one", c.B = 1, c.S = 1, c.NH = 1;
      grid.push_back(c);
      c.label = "cuda_random", c.B = 17, c.S = 33, c.NH = DH == 128 ? 1 : 4, c.resets = "random", c.initial = true;
      c.seed = ++seed;
      grid.push_back(c);
      c.label = "cuda_every50", c.B = 17, c.S = 2, c.NH = 4, c.resets = "every", c.initial = false, c.gate_scale = 50;
      c.seed = ++seed;
      grid.push_back(c);
    }
  expect_parity(grid);
}

struct DeviceCase {
  testing::CaseSpec s;
  testing::CaseData d;
  Tensor wx, r, b, h0, c0, n0, m0, dh, h, hl, cl, nl, ml, dwx, dr, db, dh0, dc0, dn0;
  explicit DeviceCase(testing::CaseSpec spec) : s(std::move(spec)), d(testing::make_case(s)) {
    const Device g = Device::cuda();
    wx = d.wx.to(g), r = d.r.to(g), b = d.b.to(g), dh = d.dh.to(g);
    const Shape st{s.B, s.NH, s.DH};
    if (s.initial) h0 = d.h0.to(g), c0 = d.c0.to(g), n0 = d.n0.to(g), m0 = d.m0.to(g);
    h = Tensor::zeros(DType::kF32, {s.B, s.S, s.NH, s.DH}, g);
    for (Tensor* t : {&hl, &cl, &nl, &ml, &dh0, &dc0, &dn0}) *t = Tensor::zeros(DType::kF32, st, g);
    dwx = Tensor::zeros(s.dtype, d.wx.shape(), g), dr = Tensor::zeros(s.dtype, d.r.shape(), g);
    db = Tensor::zeros(s.dtype, d.b.shape(), g);
  }
  static TensorView v(const Tensor& t) { return t.defined() ? t.view() : TensorView{}; }
  Inputs inputs() const { return {wx.view(), r.view(), b.view(), v(d.resets), v(h0), v(c0), v(n0), v(m0)}; }
  Outputs outputs() const { return {h.view(), hl.view(), cl.view(), nl.view(), ml.view()}; }
  Grads grads() const {
    if (!s.initial) return {dwx.view(), dr.view(), db.view(), {}, {}, {}};
    return {dwx.view(), dr.view(), db.view(), dh0.view(), dc0.view(), dn0.view()};
  }
};

// Device inputs dispatch to cuda by default; host memory labelled cuda is refused before running.
TEST(SlstmCuda, DispatchAndHostMemoryLabelledDevice) {
  SKIP_WITHOUT_GPU();
  testing::CaseSpec s;
  s.resets = "random", s.initial = true;
  DeviceCase c(s);
  EXPECT_EQ(forward(c.inputs(), c.outputs()), "cuda");
  Inputs fake = c.inputs();
  fake.wx = c.d.wx.view();
  fake.wx.device = Device::cuda();
  Options opt;
  opt.implementation = "cuda";
  EXPECT_THROW(forward(fake, c.outputs(), opt), Error);
}

// DH over the limit is the cuda backend's named kUnsupported reason.
TEST(SlstmCuda, DhOverTheLimitIsNamed) {
  SKIP_WITHOUT_GPU();
  testing::CaseSpec s;
  s.B = 1, s.S = 1, s.NH = 1, s.DH = 129;
  DeviceCase c(s);
  Options opt;
  opt.implementation = "cuda";
  try {
    forward(c.inputs(), c.outputs(), opt);
    FAIL() << "DH = 129 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("over the cuda limit of 128"), std::string::npos) << e.what();
  }
}

// dh given in the inputs' dtype (bf16) is read as such: the same gradients as its f32 widening.
TEST(SlstmCuda, UpstreamInTheInputsDtype) {
  SKIP_WITHOUT_GPU();
  testing::CaseSpec s;
  s.dtype = DType::kBF16, s.B = 3, s.S = 7, s.NH = 2, s.DH = 16, s.initial = true;
  DeviceCase c(s);
  const Tensor dh16_host = Tensor::empty(DType::kBF16, c.d.dh.shape());
  Tensor dh32_host = Tensor::empty(DType::kF32, c.d.dh.shape());
  for (int64_t i = 0; i < dh16_host.numel(); ++i) {
    store_from_f32(dh16_host.data(), DType::kBF16, i, c.d.dh.data_as<float>()[i]);
    dh32_host.data_as<float>()[i] = load_as_f32(dh16_host.data(), DType::kBF16, i);
  }
  auto grads_with = [&](const Tensor& dh_host) {
    const Tensor dh = dh_host.to(Device::cuda());
    Upstream up;
    up.dh = dh.view();
    EXPECT_EQ(backward(c.inputs(), up, c.grads()), "cuda");
    return std::vector<Tensor>{c.dwx.to(Device{}), c.dr.to(Device{}), c.dh0.to(Device{})};
  };
  const std::vector<Tensor> a = grads_with(dh16_host), b = grads_with(dh32_host);
  for (size_t f = 0; f < a.size(); ++f)
    for (int64_t i = 0; i < a[f].numel(); ++i)
      ASSERT_EQ(load_as_f32(a[f].data(), a[f].dtype(), i), load_as_f32(b[f].data(), b[f].dtype(), i)) << f << " " << i;
}

// h in the inputs' dtype (bf16, f16) on the device: each element the f32 h of the same call rounded
// once (the forward and the fused pass), and the fused pass's gradients the same bits either way.
TEST(SlstmCuda, HInTheInputsDtype) {
  SKIP_WITHOUT_GPU();
  // NaN bytes on the device: an h the pass did not write shows.
  const auto nan_on_device = [](DType dt, const Shape& shape) {
    Tensor t = Tensor::empty(dt, shape);
    std::memset(t.data(), 0xff, t.view().nbytes());
    return t.to(Device::cuda());
  };
  for (DType dt : {DType::kBF16, DType::kF16}) {
    testing::CaseSpec s;
    s.dtype = dt, s.B = 5, s.S = 9, s.NH = 2, s.DH = 16, s.initial = true, s.resets = "random";
    DeviceCase c(s);
    for (bool fused : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (fused ? " fused" : " forward"));
      Upstream up;
      up.dh = c.dh.view();
      const auto run = [&](const Outputs& o) {
        EXPECT_EQ(fused ? forward_backward(c.inputs(), up, o, c.grads()) : forward(c.inputs(), o), "cuda");
      };
      c.h = nan_on_device(DType::kF32, c.h.shape());
      run(c.outputs());
      const Tensor h32 = c.h.to(Device{}), dwx32 = c.dwx.to(Device{});
      const Tensor h16 = nan_on_device(dt, c.h.shape());
      Outputs o16 = c.outputs();
      o16.h = h16.view();
      run(o16);
      const Tensor got = h16.to(Device{}), dwx = c.dwx.to(Device{});
      for (int64_t i = 0; i < got.numel(); ++i) {
        Tensor want = Tensor::empty(dt, {1});
        store_from_f32(want.data(), dt, 0, h32.data_as<float>()[i]);
        ASSERT_FALSE(std::isnan(h32.data_as<float>()[i])) << "f32 h[" << i << "] not written";
        ASSERT_EQ(load_as_f32(got.data(), dt, i), load_as_f32(want.data(), dt, 0)) << i;
      }
      if (fused)
        for (int64_t i = 0; i < dwx.numel(); ++i)
          ASSERT_EQ(load_as_f32(dwx.data(), dt, i), load_as_f32(dwx32.data(), dt, i)) << "dwx " << i;
    }
  }
}

// ---- the host arithmetic of a launch (cuda_plan.h; these run without a GPU) ----

// The shared-memory plan at the limits it is documented with (docs/kernels/slstm.md): H100 /
// H200 give 232,448 bytes per block (227 KiB), A100 166,912 (163 KiB).
TEST(SlstmCudaPlan, SharedMemoryAndRegisterRows) {
  namespace cp = cuda_plan;
  constexpr size_t kH100 = 232448, kA100 = 166912;
  // f32, DH = 128: all of r is 256 KiB; 32 rows in registers leave 192 KiB of it in shared memory.
  EXPECT_EQ(cp::forward_smem(128, 4, 0), size_t{16384 + 262144});
  EXPECT_EQ(cp::forward_smem(128, 4, 32), size_t{16384 + 196608});   // 208 KiB
  EXPECT_EQ(cp::backward_smem(128, 4, 32), size_t{22528 + 196608});  // 214 KiB
  EXPECT_EQ(cp::register_rows(128, 4, kH100), 32);
  EXPECT_EQ(cp::register_rows(128, 4, kA100), -1);  // named as the reason on an A100
  EXPECT_EQ(cp::register_rows(96, 4, kA100), 0);
  EXPECT_EQ(cp::register_rows(112, 4, kH100), 0);
  // bf16 / f16 keep r whole in shared memory up to the DH limit, on both.
  EXPECT_EQ(cp::register_rows(128, 2, kH100), 0);
  EXPECT_EQ(cp::register_rows(128, 2, kA100), 0);
  for (int64_t DH : {1, 8, 13, 64, 96, 128}) {
    EXPECT_EQ(cp::threads_for(DH) % 32, 0) << DH;
    EXPECT_GE(cp::threads_for(DH), 4 * DH) << DH;
    EXPECT_LE(cp::threads_for(DH), cp::kMaxThreads) << DH;
    EXPECT_GE(cp::register_rows(DH, 4, kH100), 0) << DH;
  }
}

}  // namespace
}  // namespace tessera::slstm
