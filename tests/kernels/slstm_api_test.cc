// slstm API: every bad input is a one-line error before anything runs, and no output is touched;
// S = 0, partial initial states, DH over the cpu limit (named); the generic tools see the kernel.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>

#include "kernels/api_test_util.h"
#include "kernels/registry.h"
#include "kernels/slstm/testing.h"
#include "tessera/error.h"
#include "tessera/slstm.h"
#include "cpu_backend.h"

namespace tessera::slstm {
namespace {

using api_test::sentinel;
using api_test::untouched;

struct Fixture {
  testing::CaseSpec s;
  testing::CaseData d;
  Tensor h, hl, cl, nl, ml, dwx, dr, db, dh0, dc0, dn0;
  explicit Fixture(bool initial = true) {
    s.initial = initial;
    d = testing::make_case(s);
    const Shape st{s.B, s.NH, s.DH};
    h = sentinel(DType::kF32, {s.B, s.S, s.NH, s.DH});
    for (Tensor* t : {&hl, &cl, &nl, &ml, &dh0, &dc0, &dn0}) *t = sentinel(DType::kF32, st);
    dwx = sentinel(s.dtype, d.wx.shape()), dr = sentinel(s.dtype, d.r.shape()), db = sentinel(s.dtype, d.b.shape());
  }
  Outputs out() const { return {h.view(), hl.view(), cl.view(), nl.view(), ml.view()}; }
  Grads grads() const { return {dwx.view(), dr.view(), db.view(), dh0.view(), dc0.view(), dn0.view()}; }
  bool all_untouched() const {
    for (const Tensor* t : {&h, &hl, &cl, &nl, &ml, &dwx, &dr, &db, &dh0, &dc0, &dn0})
      if (!untouched(*t)) return false;
    return true;
  }
};

// Runs `mutate` on a fresh fixture's inputs and expects `needle` in a kInvalidArgument error
// from forward_backward, every output untouched.
void expect_rejected(const std::function<void(Inputs&, Upstream&, Fixture&)>& mutate, const std::string& needle) {
  Fixture f;
  Inputs in = f.d.inputs();
  Upstream up = f.d.upstream();
  mutate(in, up, f);
  try {
    forward_backward(in, up, f.out(), f.grads());
    FAIL() << "accepted; wanted an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
  }
  EXPECT_TRUE(f.all_untouched()) << needle;
}

TEST(SlstmApi, BadInputsAreErrorsThatTouchNothing) {
  Tensor wx4 = Tensor::zeros(DType::kF32, {2, 5, 4, 16});
  Tensor wx_gates3 = Tensor::zeros(DType::kF32, {2, 5, 3, 2, 8});
  Tensor wx_s0 = Tensor::zeros(DType::kF32, {2, 0, 4, 2, 8});
  Tensor wx_i32 = Tensor::zeros(DType::kI32, {2, 5, 4, 2, 8});
  Tensor r_bad = Tensor::zeros(DType::kF32, {4, 2, 8, 7});
  Tensor r_bf16 = Tensor::zeros(DType::kBF16, {4, 2, 8, 8});
  Tensor b_bad = Tensor::zeros(DType::kF32, {4, 2, 9});
  Tensor rs_bad = Tensor::zeros(DType::kI32, {2, 4});
  Tensor rs_f32 = Tensor::zeros(DType::kF32, {2, 5});
  Tensor st_bad = Tensor::zeros(DType::kF32, {2, 2, 9});
  Tensor dh_bad = Tensor::zeros(DType::kF32, {2, 5, 2, 9});
  Tensor f_resets = Tensor::zeros(DType::kI32, {2, 5});
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.wx = wx4.view(); }, "wx must be [B, S, 4, NH, DH]");
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.wx = wx_gates3.view(); }, "wx must be [B, S, 4, NH, DH]");
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.wx = wx_s0.view(); }, "S = 0");
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.wx = wx_i32.view(); }, "wx must be f32, bf16 or f16");
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.r = r_bad.view(); }, "r must be [4, NH=2, DH=8, DH=8], got [4, 2, 8, 7]");
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.r = r_bf16.view(); }, "r must be f32");
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.b = b_bad.view(); }, "b must be [4, NH=2, DH=8], got [4, 2, 9]");
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.resets = rs_bad.view(); }, "resets must be [B=2, S=5], got [2, 4]");
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.resets = rs_f32.view(); }, "resets must be int32 or int64");
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.m0 = {}; }, "h0, c0, n0 and m0 go together");
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.c0 = st_bad.view(); }, "c0 must be [B=2, NH=2, DH=8], got [2, 2, 9]");
  expect_rejected([&](Inputs&, Upstream& up, Fixture&) { up.dh = dh_bad.view(); }, "dh must be [B=2, S=5, NH=2, DH=8], got [2, 5, 2, 9]");
  expect_rejected([&](Inputs&, Upstream& up, Fixture&) { up.dh_last = st_bad.view(); }, "dh_last must be [B=2, NH=2, DH=8], got [2, 2, 9]");
  // n0 <= 0 (or NaN) could make h = c/0 (n_t = n0 where I underflows): named, with the element.
  Tensor n0_zero = Tensor::zeros(DType::kF32, {2, 2, 8}), n0_neg = Tensor::zeros(DType::kF32, {2, 2, 8});
  for (int64_t i = 0; i < 32; ++i) n0_zero.data_as<float>()[i] = n0_neg.data_as<float>()[i] = 1.0f;
  n0_zero.data_as<float>()[5] = 0.0f, n0_neg.data_as<float>()[31] = -1.0f;
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.n0 = n0_zero.view(); }, "n0 must be > 0 everywhere");
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.n0 = n0_neg.view(); }, "got n0[31] = -1");
  // Resets are read on the host whatever the device: a view labelled as device memory is refused.
  TensorView rs_dev = f_resets.view();
  rs_dev.device = Device::cuda();
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) { in.resets = rs_dev; }, "resets must be in host memory");
  Tensor wx_t = Tensor::zeros(DType::kF32, {2, 5, 4, 2, 8});
  expect_rejected([&](Inputs& in, Upstream&, Fixture&) {
    in.wx = TensorView(wx_t.data(), DType::kF32, {2, 5, 4, 2, 8}, {320, 64, 1, 32, 4});
  }, "wx must be contiguous");
}

TEST(SlstmApi, BadOutputsAreErrorsThatTouchNothing) {
  Fixture f;
  Tensor h_bad = sentinel(DType::kF32, {2, 5, 2, 7});
  Tensor dr_f16 = sentinel(DType::kF16, f.d.r.shape());
  auto rejected = [&](const Outputs& out, const Grads& g, const std::string& needle) {
    try {
      forward_backward(f.d.inputs(), f.d.upstream(), out, g);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_TRUE(f.all_untouched()) << needle;
  };
  Outputs out = f.out();
  out.h = h_bad.view();
  rejected(out, f.grads(), "h must be [B=2, S=5, NH=2, DH=8], got [2, 5, 2, 7]");
  out = f.out(), out.m_last = {};
  rejected(out, f.grads(), "h_last, c_last, n_last and m_last go together");
  Grads g = f.grads();
  g.dr = dr_f16.view();
  rejected(f.out(), g, "dr must be f32");
  g = f.grads(), g.dn0 = {};
  rejected(f.out(), g, "dh0, dc0 and dn0 are required");
  Fixture nf(false);  // no initial state: dh0.. must be absent
  try {
    backward(nf.d.inputs(), nf.d.upstream(), nf.grads());
    ADD_FAILURE() << "accepted dh0 without an initial state";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only with an initial state"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(nf.all_untouched());
}

TEST(SlstmApi, NonFiniteInputsAreRejectedWhenAsked) {
  Fixture f;
  f.d.wx.data_as<float>()[3] = NAN;
  Options opt;
  opt.check_finite = true;
  EXPECT_THROW(forward(f.d.inputs(), f.out(), opt), Error);
  EXPECT_TRUE(f.all_untouched());
  // The upstream gradients of the last state too (they were not checked: NaN reached dwx).
  for (const char* name : {"dh_last", "dc_last", "dn_last"}) {
    Fixture g;
    Tensor& t = std::string(name) == "dh_last" ? g.d.dh_last : std::string(name) == "dc_last" ? g.d.dc_last : g.d.dn_last;
    ASSERT_TRUE(t.defined()) << name;
    t.data_as<float>()[1] = INFINITY;
    try {
      forward_backward(g.d.inputs(), g.d.upstream(), g.out(), g.grads(), opt);
      ADD_FAILURE() << name << " with Inf accepted under check_finite";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(name) + " contains NaN or Inf"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(g.all_untouched()) << name;
    forward_backward(g.d.inputs(), g.d.upstream(), g.out(), g.grads());  // unchecked: it runs
  }
}

TEST(SlstmApi, DhOverTheCpuLimitIsNamed) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  const Shape wx{1, 1, 4, 1, 1025}, r{4, 1, 1025, 1025}, b{4, 1, 1025};
  Tensor twx = Tensor::zeros(DType::kF32, wx), tr = Tensor::zeros(DType::kF32, r), tb = Tensor::zeros(DType::kF32, b);
  Tensor h = sentinel(DType::kF32, {1, 1, 1, 1025});
  Options opt;
  opt.implementation = "cpu";
  try {
    forward({twx.view(), tr.view(), tb.view()}, {h.view()}, opt);
    FAIL() << "accepted DH = 1025 on cpu";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DH=1025 is over the cpu limit of 1024"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(untouched(h));
}

TEST(SlstmApi, DispatchRefusesUnknownNames) {
  Fixture f;
  Options opt;
  opt.implementation = "cpuu";
  EXPECT_THROW(forward(f.d.inputs(), f.out(), opt), Error);
  EXPECT_TRUE(f.all_untouched());
}

TEST(SlstmApi, ResetsTakeInt64AndAResetAtTZeroChangesNothing) {
  testing::CaseSpec s;
  s.initial = true, s.resets = "at1";
  testing::CaseData d = testing::make_case(s);
  Tensor h32 = Tensor::zeros(DType::kF32, {s.B, s.S, s.NH, s.DH}), h64 = Tensor::zeros(DType::kF32, {s.B, s.S, s.NH, s.DH});
  Options opt;
  opt.implementation = "reference";
  forward(d.inputs(), {h32.view()}, opt);
  Tensor r64 = Tensor::zeros(DType::kI64, {s.B, s.S});
  for (int64_t i = 0; i < r64.numel(); ++i) r64.data_as<int64_t>()[i] = d.resets.data_as<int32_t>()[i] * 7;
  for (int64_t bi = 0; bi < s.B; ++bi) r64.data_as<int64_t>()[bi * s.S] = 1;  // t = 0: ignored
  Inputs in = d.inputs();
  in.resets = r64.view();
  forward(in, {h64.view()}, opt);
  for (int64_t i = 0; i < h32.numel(); ++i) ASSERT_EQ(h32.data_as<float>()[i], h64.data_as<float>()[i]) << i;
}

TEST(SlstmApi, TheGenericToolsSeeTheKernel) {
  const kernels::KernelSpec& k = kernels::get("slstm");
  EXPECT_EQ(k.dims, (std::vector<std::string>{"B", "S", "NH", "DH"}));
  ASSERT_EQ(k.call.grad_inputs.size(), 4u);  // grad_h, then the optional last-state gradients
  EXPECT_EQ(k.call.grad_inputs[0].name, "grad_h");
  EXPECT_EQ(k.call.grad_inputs[2].name, "grad_c_last");
  EXPECT_FALSE(k.call.grad_inputs[2].required);
  EXPECT_EQ(k.call.grad_inputs[0].aliases, std::vector<std::string>{"dh"});
  EXPECT_FALSE(k.check_grid(true).empty());
}

}  // namespace
}  // namespace tessera::slstm
