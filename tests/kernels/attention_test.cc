// attention reference: hand-computed values for every option, the gradients against central
// finite differences for every option, GQA against MHA with repeated kv heads, varlen against
// the dense form per sequence, the rows that see no key, dropout (its mask, its scale, its
// mean) and the additive bias.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/attention/testing.h"
#include "primitives/philox.h"
#include "tessera/attention.h"

namespace tessera::attention {
namespace {

namespace at = testing;

Tensor f32(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  EXPECT_EQ(static_cast<size_t>(t.numel()), values.size());
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}
Tensor i32(const Shape& shape, const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty(DType::kI32, shape);
  std::memcpy(t.data(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

Options ref_opt() {
  Options o;
  o.implementation = "reference";
  return o;
}

const double kInf = std::numeric_limits<double>::infinity();

// D = 1, scale 1: q = 1, keys 0 and ln 3 -> p = (1/4, 3/4); v = (4, 8) -> o = 7, lse = ln 4.
TEST(AttentionReference, HandValuesPlain) {
  Tensor q = f32({1, 1, 1, 1}, {1.0f}), k = f32({1, 2, 1, 1}, {0.0f, std::log(3.0f)}), v = f32({1, 2, 1, 1}, {4, 8});
  Options o = ref_opt();
  o.scale = 1.0;
  Result r = compute({q, k, v}, o);
  EXPECT_NEAR(r.o.data_as<float>()[0], 7.0, 1e-6);
  EXPECT_NEAR(r.lse.data_as<float>()[0], std::log(4.0), 1e-6);
  EXPECT_EQ(r.implementation, "reference");
  // Default scale 1/sqrt(D) with D = 4: q·k = 2 -> s = 1.
  Tensor q4 = f32({1, 1, 1, 4}, {1, 1, 1, 1}), k4 = f32({1, 1, 1, 4}, {0.5f, 0.5f, 0.5f, 0.5f});
  Result r4 = compute({q4, k4, f32({1, 1, 1, 1}, {3})}, ref_opt());
  EXPECT_NEAR(r4.lse.data_as<float>()[0], 1.0, 1e-6);
  EXPECT_NEAR(r4.o.data_as<float>()[0], 3.0, 1e-6);
}

// Causal, square: row 0 sees key 0 only; Sq > Sk: the first row sees nothing (o 0, lse −inf).
TEST(AttentionReference, HandValuesCausal) {
  Tensor k = f32({1, 2, 1, 1}, {0.0f, std::log(3.0f)}), v = f32({1, 2, 1, 1}, {4, 8});
  Options o = ref_opt();
  o.scale = 1.0;
  o.causal = true;
  Result r = compute({f32({1, 2, 1, 1}, {1, 1}), k, v}, o);
  EXPECT_NEAR(r.o.data_as<float>()[0], 4.0, 1e-6);
  EXPECT_NEAR(r.lse.data_as<float>()[0], 0.0, 1e-6);
  EXPECT_NEAR(r.o.data_as<float>()[1], 7.0, 1e-6);
  EXPECT_NEAR(r.lse.data_as<float>()[1], std::log(4.0), 1e-6);
  // Sq = 3 > Sk = 2: off = −1; row 0 sees nothing, row 1 key 0, row 2 keys 0 and 1.
  Result r2 = compute({f32({1, 3, 1, 1}, {1, 1, 1}), k, v}, o);
  EXPECT_EQ(r2.o.data_as<float>()[0], 0.0f);
  EXPECT_EQ(r2.lse.data_as<float>()[0], -kInf);
  EXPECT_NEAR(r2.o.data_as<float>()[1], 4.0, 1e-6);
  EXPECT_NEAR(r2.o.data_as<float>()[2], 7.0, 1e-6);
  // Sq = 1 < Sk = 2: bottom-right alignment, the single row sees both keys.
  Result r3 = compute({f32({1, 1, 1, 1}, {1}), k, v}, o);
  EXPECT_NEAR(r3.o.data_as<float>()[0], 7.0, 1e-6);
}

TEST(AttentionReference, HandValuesSoftcap) {
  // q = 2, keys 1 and 0, scale 1, cap 1: s = (tanh 2, 0).
  Options o = ref_opt();
  o.scale = 1.0;
  o.softcap = 1.0;
  Result r = compute({f32({1, 1, 1, 1}, {2}), f32({1, 2, 1, 1}, {1, 0}), f32({1, 2, 1, 1}, {1, 0})}, o);
  const double e = std::exp(std::tanh(2.0));
  EXPECT_NEAR(r.o.data_as<float>()[0], e / (e + 1.0), 1e-6);
  EXPECT_NEAR(r.lse.data_as<float>()[0], std::log(e + 1.0), 1e-6);
  // Scale applies before the cap: scale 0.5, cap 2 -> s = 2·tanh(0.5·2/2).
  o.scale = 0.5;
  o.softcap = 2.0;
  Result r2 = compute({f32({1, 1, 1, 1}, {2}), f32({1, 1, 1, 1}, {1}), f32({1, 1, 1, 1}, {5})}, o);
  EXPECT_NEAR(r2.lse.data_as<float>()[0], 2.0 * std::tanh(0.5), 1e-6);
}

TEST(AttentionReference, HandValuesAlibi) {
  // q = 0 so scores are the bias −slope·|i − j| only; v = (1, 3).
  Tensor q = f32({1, 2, 1, 1}, {0, 0}), k = f32({1, 2, 1, 1}, {0, 0}), v = f32({1, 2, 1, 1}, {1, 3});
  Inputs in{q, k, v};
  Tensor slopes = f32({1}, {0.5f});
  in.alibi_slopes = slopes.view();
  Result r = compute(in, ref_opt());
  const double w = std::exp(-0.5);
  EXPECT_NEAR(r.o.data_as<float>()[0], (1.0 + 3.0 * w) / (1.0 + w), 1e-6);  // row 0: biases (0, −0.5)
  EXPECT_NEAR(r.o.data_as<float>()[1], (w + 3.0) / (1.0 + w), 1e-6);        // row 1: biases (−0.5, 0)
  EXPECT_NEAR(r.lse.data_as<float>()[0], std::log(1.0 + w), 1e-6);
  // Sq = 1 < Sk = 2: the row sits at i + off = 1.
  Tensor q1 = f32({1, 1, 1, 1}, {0});
  in.q = q1.view();
  Result r1 = compute(in, ref_opt());
  EXPECT_NEAR(r1.o.data_as<float>()[0], (w + 3.0) / (1.0 + w), 1e-6);
}

TEST(AttentionReference, HandValuesWindowAndSegments) {
  // q = 0: uniform over the allowed keys; v = (1, 2, 4).
  Tensor q = f32({1, 3, 1, 1}, {0, 0, 0}), k = f32({1, 3, 1, 1}, {0, 0, 0}), v = f32({1, 3, 1, 1}, {1, 2, 4});
  Options o = ref_opt();
  o.window_left = 1;
  o.window_right = 0;
  Result r = compute({q, k, v}, o);
  EXPECT_NEAR(r.o.data_as<float>()[0], 1.0, 1e-6);          // key 0
  EXPECT_NEAR(r.o.data_as<float>()[2], 3.0, 1e-6);          // keys 1, 2
  EXPECT_NEAR(r.lse.data_as<float>()[2], std::log(2.0), 1e-6);
  o.window_left = 0;
  o.window_right = 1;
  Result r2 = compute({q, k, v}, o);
  EXPECT_NEAR(r2.o.data_as<float>()[0], 1.5, 1e-6);  // keys 0, 1
  EXPECT_NEAR(r2.o.data_as<float>()[2], 4.0, 1e-6);  // key 2
  // Segments q (0, 0, 1), k (0, 1, 1): rows 0, 1 see key 0; row 2 keys 1, 2.
  Tensor sq = i32({1, 3}, {0, 0, 1}), sk = i32({1, 3}, {0, 1, 1});
  Inputs in{q, k, v};
  in.segment_ids_q = sq.view();
  in.segment_ids_k = sk.view();
  Result r3 = compute(in, ref_opt());
  EXPECT_NEAR(r3.o.data_as<float>()[1], 1.0, 1e-6);
  EXPECT_NEAR(r3.o.data_as<float>()[2], 3.0, 1e-6);
  // A query whose segment has no key sees nothing.
  Tensor sq2 = i32({1, 3}, {0, 7, 1});
  in.segment_ids_q = sq2.view();
  Result r4 = compute(in, ref_opt());
  EXPECT_EQ(r4.o.data_as<float>()[1], 0.0f);
  EXPECT_EQ(r4.lse.data_as<float>()[1], -kInf);
}

// Central finite differences of L = Σ grad_o·o against backward, for every option.
void expect_fd_gradients(at::CaseSpec s) {
  s.dtype = DType::kF32;
  s.o_f32 = s.f32_grads = true;
  s.opt.implementation = "reference";
  const at::CaseData d = at::make_case(s);
  Tensor o = Tensor::empty(DType::kF32, at::o_shape(s)), lse = Tensor::empty(DType::kF32, at::lse_shape(s));
  Tensor dq = Tensor::empty(DType::kF32, d.q.shape()), dk = Tensor::empty(DType::kF32, d.k.shape()),
         dv = Tensor::empty(DType::kF32, d.v.shape());
  Tensor dbias = d.bias.defined() ? Tensor::empty(DType::kF32, d.bias.shape()) : Tensor();
  Gradients grads{dq, dk, dv, {}};
  if (dbias.defined()) grads.dbias = dbias.view();
  forward_backward(d.inputs(), d.grad_o, {o, lse}, grads, s.opt);
  auto loss = [&]() {
    forward(d.inputs(), {o, lse}, s.opt);
    double l = 0.0;
    for (int64_t i = 0; i < o.numel(); ++i)
      l += static_cast<double>(o.data_as<float>()[i]) * d.grad_o.data_as<float>()[i];
    return l;
  };
  const std::pair<const Tensor*, const Tensor*> pairs[] = {{&d.q, &dq}, {&d.k, &dk}, {&d.v, &dv}, {&d.bias, &dbias}};
  const char* names[] = {"dq", "dk", "dv", "dbias"};
  for (int t = 0; t < (dbias.defined() ? 4 : 3); ++t) {
    float* x = pairs[t].first->data_as<float>();
    const float* g = pairs[t].second->data_as<float>();
    double gmax = 0.0;
    for (int64_t i = 0; i < pairs[t].second->numel(); ++i) gmax = std::max(gmax, std::fabs(double(g[i])));
    for (int64_t i = 0; i < pairs[t].first->numel(); ++i) {
      const float x0 = x[i];
      if (x0 == -INFINITY) {  // a masking bias entry: no gradient
        ASSERT_EQ(g[i], 0.0f) << s.name() << " " << names[t] << "[" << i << "]";
        continue;
      }
      const float xp = x0 + 1e-2f, xm = x0 - 1e-2f;
      x[i] = xp;
      const double lp = loss();
      x[i] = xm;
      const double lm = loss();
      x[i] = x0;
      const double fd = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
      // h = 1e-2: truncation ~h²·|L'''| ≲ 1e-4, f32 rounding of o ~1e-7·|L|/h ≲ 1e-4.
      ASSERT_NEAR(g[i], fd, 2e-3 * std::max(1.0, gmax) + 1e-2 * std::fabs(fd))
          << s.name() << " " << names[t] << "[" << i << "]";
    }
  }
}

TEST(AttentionReference, GradientsMatchFiniteDifferences) {
  std::vector<at::CaseSpec> cases;
  at::CaseSpec base;
  base.B = 2;
  base.Sq = 4;
  base.Sk = 5;
  base.Hq = 2;
  base.Hkv = 1;
  base.D = 3;
  base.Dv = 2;
  cases.push_back(base);  // plain, GQA, Dv != D
  {
    at::CaseSpec c = base;
    c.opt.causal = true;
    c.Sq = 6;  // Sq > Sk: a row sees nothing
    cases.push_back(c);
  }
  {
    at::CaseSpec c = base;
    c.opt.window_left = 1;
    c.opt.window_right = 1;
    cases.push_back(c);
  }
  {
    at::CaseSpec c = base;
    c.opt.softcap = 1.5;
    c.opt.scale = 0.8;
    c.logit_scale = 3.0;
    cases.push_back(c);
  }
  {
    at::CaseSpec c = base;
    c.alibi = 2;
    c.opt.causal = true;
    cases.push_back(c);
  }
  {
    at::CaseSpec c = base;
    c.Sq = c.Sk = 6;
    c.segments = 2;
    c.opt.causal = true;
    cases.push_back(c);
  }
  {
    at::CaseSpec c = base;
    c.seqlens_q = {3, 0, 2};
    c.seqlens_k = {2, 2, 4};
    c.opt.causal = true;
    cases.push_back(c);
  }
  {  // dropout: the mask is a function of the seed, so L stays differentiable
    at::CaseSpec c = base;
    c.opt.causal = true;
    c.opt.dropout_p = 0.4;
    cases.push_back(c);
    c.seqlens_q = {3, 2};
    c.seqlens_k = {4, 5};
    c.opt.causal = false;
    c.opt.softcap = 2.0;
    cases.push_back(c);
  }
  {  // bias: after the soft cap (its gradient takes no cap factor), broadcast over B; a key
     // padding bias with −inf entries under causal and dropout; a per-row bias (dbias = 0)
    at::CaseSpec c = base;
    c.bias = "1HQK";
    c.opt.softcap = 1.5;
    c.logit_scale = 3.0;
    cases.push_back(c);
    c = base;
    c.bias = "B11K";
    c.bias_masks = true;
    c.opt.causal = true;
    c.opt.dropout_p = 0.3;
    cases.push_back(c);
    c = base;
    c.bias = "BHQ1";
    cases.push_back(c);
  }
  uint64_t seed = 40;
  for (at::CaseSpec c : cases) {
    c.seed = seed++;
    expect_fd_gradients(c);
  }
}

// q = 0: the scores are the bias alone. A [1, 1, 1, Sk] bias (0, ln 3) gives every row
// p = (1/4, 3/4), o = 1·4/4 + 3·8/4 = 7; a −inf entry masks its key; a row whose keys are all −inf
// sees nothing (o = 0, lse = −inf); the bias comes after the soft cap (it is not capped).
TEST(AttentionReference, HandValuesBias) {
  Tensor q = f32({1, 2, 1, 1}, {0, 0}), k = f32({1, 2, 1, 1}, {0, 0}), v = f32({1, 2, 1, 1}, {4, 8});
  Tensor b = f32({1, 1, 1, 2}, {0.0f, std::log(3.0f)});
  Inputs in{q, k, v};
  in.bias = b.view();
  Result r = compute(in, ref_opt());
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(r.o.data_as<float>()[i], 7.0, 1e-6);
    EXPECT_NEAR(r.lse.data_as<float>()[i], std::log(4.0), 1e-6);
  }
  Options capped = ref_opt();
  capped.softcap = 0.5;  // would cap ln 3 to 0.5·tanh(2 ln 3) if the bias were under the cap
  Result rc = compute(in, capped);
  EXPECT_NEAR(rc.o.data_as<float>()[0], 7.0, 1e-6);
  // [1, 1, Sq, Sk]: row 0 masks key 0, row 1 masks both.
  Tensor m = f32({1, 1, 2, 2}, {-INFINITY, 0.0f, -INFINITY, -INFINITY});
  in.bias = m.view();
  Result rm = compute(in, ref_opt());
  EXPECT_EQ(rm.o.data_as<float>()[0], 8.0f);
  EXPECT_EQ(rm.lse.data_as<float>()[0], 0.0f);
  EXPECT_EQ(rm.o.data_as<float>()[1], 0.0f);
  EXPECT_EQ(rm.lse.data_as<float>()[1], -kInf);
  // dbias of the masked row and entries is 0, and of row 0's one kept key (p = 1: dS = dP − Δ = 0).
  Result g = compute_with_grad(in, f32({1, 2, 1, 1}, {1, 1}), ref_opt());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g.dbias.data_as<float>()[i], 0.0f) << i;
  EXPECT_EQ(g.dbias.dtype(), DType::kF32);
  // With grad_o = 1 and p = (1/4, 3/4), o = 7: dS_j = p_j·(v_j − o) = (−3/4, 3/4) per row; the
  // [1, 1, 1, 2] bias sums the two rows: (−1.5, 1.5).
  in.bias = b.view();
  Result d = compute_with_grad(in, f32({1, 2, 1, 1}, {1, 1}), ref_opt());
  EXPECT_NEAR(d.dbias.data_as<float>()[0], -1.5, 1e-6);
  EXPECT_NEAR(d.dbias.data_as<float>()[1], 1.5, 1e-6);
}

// GQA equals MHA with each kv head repeated for its query heads; dk, dv of GQA are the sums of
// the MHA gradients over those query heads.
TEST(AttentionReference, GqaIsMhaWithRepeatedKvHeads) {
  at::CaseSpec s;
  s.B = 2;
  s.Sq = 5;
  s.Sk = 6;
  s.Hq = 4;
  s.Hkv = 2;
  s.D = 3;
  s.Dv = 2;
  s.opt.causal = true;
  s.opt.implementation = "reference";
  const at::CaseData d = at::make_case(s);
  const int64_t G = s.Hq / s.Hkv;
  Tensor k2 = Tensor::empty(DType::kF32, {s.B, s.Sk, s.Hq, s.D}), v2 = Tensor::empty(DType::kF32, {s.B, s.Sk, s.Hq, s.Dv});
  for (int64_t r = 0; r < s.B * s.Sk; ++r)
    for (int64_t h = 0; h < s.Hq; ++h) {
      for (int64_t c = 0; c < s.D; ++c)
        k2.data_as<float>()[(r * s.Hq + h) * s.D + c] = d.k.data_as<float>()[(r * s.Hkv + h / G) * s.D + c];
      for (int64_t c = 0; c < s.Dv; ++c)
        v2.data_as<float>()[(r * s.Hq + h) * s.Dv + c] = d.v.data_as<float>()[(r * s.Hkv + h / G) * s.Dv + c];
    }
  Result gqa = compute_with_grad({d.q, d.k, d.v}, d.grad_o, s.opt);
  Result mha = compute_with_grad({d.q, k2, v2}, d.grad_o, s.opt);
  for (int64_t i = 0; i < gqa.o.numel(); ++i) EXPECT_NEAR(gqa.o.data_as<float>()[i], mha.o.data_as<float>()[i], 1e-6);
  for (int64_t i = 0; i < gqa.dq.numel(); ++i) EXPECT_NEAR(gqa.dq.data_as<float>()[i], mha.dq.data_as<float>()[i], 1e-6);
  for (int64_t r = 0; r < s.B * s.Sk; ++r)
    for (int64_t hk = 0; hk < s.Hkv; ++hk)
      for (int64_t c = 0; c < s.D; ++c) {
        double sum = 0.0;
        for (int64_t g = 0; g < G; ++g) sum += mha.dk.data_as<float>()[(r * s.Hq + hk * G + g) * s.D + c];
        EXPECT_NEAR(gqa.dk.data_as<float>()[(r * s.Hkv + hk) * s.D + c], sum, 1e-5);
      }
}

// The varlen form equals the dense form run on each sequence alone.
TEST(AttentionReference, VarlenMatchesDensePerSequence) {
  at::CaseSpec s;
  s.seqlens_q = {3, 5, 1};
  s.seqlens_k = {4, 5, 6};
  s.Hq = 2;
  s.Hkv = 1;
  s.D = 4;
  s.Dv = 3;
  s.opt.causal = true;
  s.alibi = 2;
  s.opt.implementation = "reference";
  const at::CaseData d = at::make_case(s);
  Result all = compute_with_grad(d.inputs(), d.grad_o, s.opt);
  int64_t q0 = 0, k0 = 0;
  const int64_t Tq = d.q.shape()[0];
  for (size_t n = 0; n < s.seqlens_q.size(); ++n) {
    const int64_t sq = s.seqlens_q[n], sk = s.seqlens_k[n];
    auto slice = [](const Tensor& t, int64_t r0, int64_t rows) {
      const int64_t row = t.numel() / t.shape()[0];
      Shape sh = t.shape();
      sh[0] = rows;
      sh.insert(sh.begin(), 1);
      Tensor out = Tensor::empty(t.dtype(), sh);
      std::memcpy(out.data(), t.data_as<float>() + r0 * row, static_cast<size_t>(rows * row) * sizeof(float));
      return out;
    };
    Tensor q = slice(d.q, q0, sq), k = slice(d.k, k0, sk), v = slice(d.v, k0, sk), g = slice(d.grad_o, q0, sq);
    Tensor slopes = f32({s.Hq}, {d.alibi.data_as<float>()[n * s.Hq], d.alibi.data_as<float>()[n * s.Hq + 1]});
    Inputs in{q, k, v};
    in.alibi_slopes = slopes.view();
    Result one = compute_with_grad(in, g, s.opt);
    for (int64_t i = 0; i < one.o.numel(); ++i)
      EXPECT_NEAR(one.o.data_as<float>()[i], all.o.data_as<float>()[q0 * s.Hq * s.Dv + i], 1e-6);
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < sq; ++i)
        EXPECT_NEAR(one.lse.data_as<float>()[h * sq + i], all.lse.data_as<float>()[h * Tq + q0 + i], 1e-6);
    for (int64_t i = 0; i < one.dk.numel(); ++i)
      EXPECT_NEAR(one.dk.data_as<float>()[i], all.dk.data_as<float>()[k0 * s.Hkv * s.D + i], 1e-6);
    q0 += sq;
    k0 += sk;
  }
}

// Rows that see no key: o = 0, lse = −inf, no NaN anywhere (also in the gradients).
TEST(AttentionReference, RowsThatSeeNothingAreZeroNotNaN) {
  at::CaseSpec s;
  s.Sq = 9;
  s.Sk = 3;
  s.opt.causal = true;
  s.opt.implementation = "reference";
  const at::CaseData d = at::make_case(s);
  Result r = compute_with_grad(d.inputs(), d.grad_o, s.opt);
  for (const Tensor* t : {&r.o, &r.dq, &r.dk, &r.dv})
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_FALSE(std::isnan(t->data_as<float>()[i]));
  // off = −6: rows 0..5 see nothing.
  for (int64_t h = 0; h < s.Hq; ++h) {
    EXPECT_EQ(r.lse.data_as<float>()[h * s.Sq + 5], -kInf);
    EXPECT_TRUE(std::isfinite(r.lse.data_as<float>()[h * s.Sq + 6]));
    for (int64_t c = 0; c < s.Dv; ++c) EXPECT_EQ(r.o.data_as<float>()[(5 * s.Hq + h) * s.Dv + c], 0.0f);
  }
  // No keys at all.
  Tensor k0 = Tensor::empty(DType::kF32, {2, 0, 2, 16}), v0 = Tensor::empty(DType::kF32, {2, 0, 2, 16});
  Result e = compute_with_grad({d.q, k0, v0}, d.grad_o, s.opt);
  for (int64_t i = 0; i < e.o.numel(); ++i) ASSERT_EQ(e.o.data_as<float>()[i], 0.0f);
  for (int64_t i = 0; i < e.lse.numel(); ++i) ASSERT_EQ(e.lse.data_as<float>()[i], -kInf);
  for (int64_t i = 0; i < e.dq.numel(); ++i) ASSERT_EQ(e.dq.data_as<float>()[i], 0.0f);
}

// ---- dropout ----

at::CaseSpec dropout_case(double p) {
  at::CaseSpec s;
  s.B = 2, s.Sq = 5, s.Sk = 11, s.Hq = 4, s.Hkv = 2, s.D = 6, s.Dv = 3;
  s.opt.causal = true;
  s.opt.dropout_p = p;
  s.opt.implementation = "reference";
  return s;
}

// o and lse from plain softmax in double, with the mask of primitives/philox.h applied by hand:
// o_i = Σ_j P_ij · z_ij · v_j, z = 0 or 1/(1 − p); lse undropped.
TEST(AttentionReference, HandValuesDropout) {
  const at::CaseSpec s = dropout_case(0.3);
  const at::CaseData d = at::make_case(s);
  const Result r = compute(d.inputs(), s.opt);
  const int32_t* seed = d.dropout_seed.data_as<int32_t>();
  const uint32_t thr = primitives::philox::dropout_threshold(0.3);
  const int64_t G = s.Hq / s.Hkv, off = s.Sk - s.Sq;
  const float *q = d.q.data_as<float>(), *k = d.k.data_as<float>(), *v = d.v.data_as<float>();
  int kept = 0, dropped = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Sq; ++i) {
        std::vector<double> e(static_cast<size_t>(s.Sk), 0.0);
        double sum = 0.0;
        for (int64_t j = 0; j <= i + off; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < s.D; ++c)
            dot += double(q[((b * s.Sq + i) * s.Hq + h) * s.D + c]) * k[((b * s.Sk + j) * s.Hkv + h / G) * s.D + c];
          e[j] = std::exp(dot / std::sqrt(double(s.D)));
          sum += e[j];
        }
        EXPECT_NEAR(r.lse.data_as<float>()[(b * s.Hq + h) * s.Sq + i], std::log(sum), 1e-5);
        for (int64_t c = 0; c < s.Dv; ++c) {
          double o = 0.0;
          for (int64_t j = 0; j <= i + off; ++j) {
            const bool keep = primitives::philox::dropout_keep(uint32_t(seed[0]), uint32_t(seed[1]), thr, uint32_t(b),
                                                               uint32_t(h), uint32_t(i), uint32_t(j));
            if (c == 0) (keep ? kept : dropped)++;
            if (keep) o += e[j] / sum / 0.7 * v[((b * s.Sk + j) * s.Hkv + h / G) * s.Dv + c];
          }
          EXPECT_NEAR(r.o.data_as<float>()[((b * s.Sq + i) * s.Hq + h) * s.Dv + c], o, 1e-5);
        }
      }
  EXPECT_GT(dropped, 20);  // the case drops some and keeps most (p = 0.3 of 400 pairs)
  EXPECT_GT(kept, 200);
}

// Averaged over many seeds, dropout's o is the undropped o (the 1/(1 − p) scale): within 5
// standard errors per element, the variance taken from the case itself (Var z = p/(1 − p)).
TEST(AttentionReference, DropoutAveragesToTheUndroppedOutput) {
  const double p = 0.5;
  const int kSeeds = 300;
  at::CaseSpec s = dropout_case(p);
  at::CaseData d = at::make_case(s);
  Options none = s.opt;
  none.dropout_p = 0.0;
  const Result base = compute(d.inputs(), none);
  std::vector<double> mean(static_cast<size_t>(base.o.numel()), 0.0), sq(mean.size(), 0.0);
  for (int t = 0; t < kSeeds; ++t) {
    d.dropout_seed.data_as<int32_t>()[0] = 1000 + t;
    const Result r = compute(d.inputs(), s.opt);
    for (size_t i = 0; i < mean.size(); ++i) {
      const double x = r.o.data_as<float>()[i];
      mean[i] += x / kSeeds;
      sq[i] += x * x / kSeeds;
    }
  }
  for (size_t i = 0; i < mean.size(); ++i) {
    const double se = std::sqrt(std::max(sq[i] - mean[i] * mean[i], 0.0) / kSeeds);
    EXPECT_NEAR(mean[i], base.o.data_as<float>()[i], 5 * se + 1e-6) << "o[" << i << "]";
  }
}

// The mask read back through o is the rule (testing.h's probe), and the kept values carry 1/(1 − p).
TEST(AttentionReference, DropoutMaskIsThePhiloxRule) {
  const int32_t seed[2] = {-7, 31337};
  for (double p : {0.1, 0.5})
    EXPECT_EQ(at::dropout_mask_through_o("reference", Device::cpu(), DType::kF32, 2, 5, 37, 3, 1, p, seed),
              at::dropout_mask_rule(2, 5, 37, 3, p, seed));
}

// dropout_p = 0 is exactly no dropout, with or without a seed; the same seed gives the same
// result bit for bit, another seed another one.
TEST(AttentionReference, DropoutSeedsAndPZero) {
  at::CaseSpec s = dropout_case(0.2);
  at::CaseData d = at::make_case(s);
  Options none = s.opt;
  none.dropout_p = 0.0;
  Inputs plain = d.inputs();
  plain.dropout_seed.reset();
  const Result a = compute(plain, none), b = compute(d.inputs(), none);
  const Result x = compute(d.inputs(), s.opt), y = compute(d.inputs(), s.opt);
  d.dropout_seed.data_as<int32_t>()[1] ^= 1;
  const Result z = compute(d.inputs(), s.opt);
  const size_t bytes = static_cast<size_t>(a.o.numel()) * sizeof(float);
  EXPECT_EQ(std::memcmp(a.o.data(), b.o.data(), bytes), 0);
  EXPECT_NE(std::memcmp(a.o.data(), x.o.data(), bytes), 0);
  EXPECT_EQ(std::memcmp(x.o.data(), y.o.data(), bytes), 0);
  EXPECT_NE(std::memcmp(x.o.data(), z.o.data(), bytes), 0);
  EXPECT_EQ(std::memcmp(x.lse.data(), a.lse.data(), static_cast<size_t>(a.lse.numel()) * sizeof(float)), 0);
}

// The shared parity function agrees with itself (reference vs reference) on the whole grid:
// the grid's cases are valid and the comparison machinery handles −inf rows.
TEST(AttentionReference, GridRunsAgainstItself) {
  for (const at::CaseSpec& c : at::check_grid(/*quick=*/true)) {
    const at::ParityReport r = at::check_parity(c, "reference", Pass::kFused);
    ASSERT_TRUE(r.ran) << r.case_name << ": " << r.error;
    EXPECT_TRUE(r.ok()) << r.case_name;
  }
}

}  // namespace
}  // namespace tessera::attention
