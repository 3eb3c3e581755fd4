// Parity of the optimized CPU backend ("cpu") against the reference oracle, plus determinism,
// thread-count agreement, block-size validation, memory bounds and the peer-library bugs of
// /work/shared/ANCHORS.md (p_y − 1 cancellation, dw drift in bf16, reduction=none upstream
// gradients, bias applied once).
//
// Local helpers (make_case, expect_close) stand in for the lead's testing harness
// (src/kernels/linear_cross_entropy/testing.h); switch to it once it is on main.
//
// Tolerances. Both implementations read the same stored inputs (bf16/f16 inputs are converted
// exactly to f32/f64), so the only differences are arithmetic: the reference accumulates in
// f64, the cpu backend in f32 (BLAS dot products of length H, f32 SIMD partial sums over a vocab
// block, f32 dw/dx/dbias sums over at most a few hundred tokens here). With n <= ~300 terms the
// f32 error is <= n·2^-24 ≈ 2e-5 relative to the sum of magnitudes, which in these random cases
// is within a small factor of max|ref|. Hence, per element, for f32 outputs:
//     |got − ref| <= 1e-4 · max|ref| + 1e-4 · |ref|
// A bf16/f16 output is additionally rounded once: both sides round (nearly) the same f32 value,
// so they can land one storage ulp apart: + 2^-7·|ref| (bf16; spacing is <= 2^-7 relative) or
// + 2^-10·|ref| + 2^-24 (f16, incl. its subnormal spacing). Formula bugs show up as O(1e-2)
// or larger deviations, far above these bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/memory.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy {
namespace {

enum class WForm { kHV, kVH, kHVViewOfVH, kVHViewOfHV };  // memory layout + how the view looks

struct CaseSpec {
  int64_t B = 13, H = 11, V = 37;
  DType dtype = DType::kF32;
  WForm wform = WForm::kHV;
  bool bias = false;
  DType bias_dtype = DType::kF32;
  bool weights = false;
  double ignored_fraction = 0.0;
  DType label_dtype = DType::kI64;
  int64_t ignore_index = -100;
  uint64_t seed = 1;
  double logit_scale = 2.0;  // std of the logits
};

struct Case {
  CaseSpec spec;
  Tensor x, w, bias, labels, weights;
  Inputs inputs() const {
    Inputs in;
    in.x = x.view();
    in.w = w.view();
    if (bias.defined()) in.bias = bias.view();
    in.labels = labels.view();
    if (weights.defined()) in.weights = weights.view();
    return in;
  }
};

void fill_normal(const Tensor& t, std::mt19937_64& rng, double stddev) {
  std::normal_distribution<double> nd(0.0, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_f32(t.data(), t.dtype(), i, static_cast<float>(nd(rng)));
}

Case make_case(const CaseSpec& s) {
  Case c;
  c.spec = s;
  std::mt19937_64 rng(s.seed);
  c.x = Tensor::empty(s.dtype, {s.B, s.H});
  fill_normal(c.x, rng, 1.0);
  const double wstd = s.logit_scale / std::sqrt(static_cast<double>(s.H));
  switch (s.wform) {
    case WForm::kHV: c.w = Tensor::empty(s.dtype, {s.H, s.V}); fill_normal(c.w, rng, wstd); break;
    case WForm::kVH: c.w = Tensor::empty(s.dtype, {s.V, s.H}); fill_normal(c.w, rng, wstd); break;
    case WForm::kHVViewOfVH: {  // memory [V, H], view [H, V]
      Tensor m = Tensor::empty(s.dtype, {s.V, s.H});
      fill_normal(m, rng, wstd);
      c.w = m.as_strided({s.H, s.V}, {1, s.H});
      break;
    }
    case WForm::kVHViewOfHV: {  // memory [H, V], view [V, H]
      Tensor m = Tensor::empty(s.dtype, {s.H, s.V});
      fill_normal(m, rng, wstd);
      c.w = m.as_strided({s.V, s.H}, {1, s.V});
      break;
    }
  }
  if (s.bias) {
    c.bias = Tensor::empty(s.bias_dtype, {s.V});
    fill_normal(c.bias, rng, 0.5);
  }
  c.labels = Tensor::empty(s.label_dtype, {s.B});
  std::uniform_int_distribution<int64_t> lab(0, s.V - 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t t = 0; t < s.B; ++t) {
    const int64_t y = u(rng) < s.ignored_fraction ? s.ignore_index : lab(rng);
    if (s.label_dtype == DType::kI32)
      c.labels.data_as<int32_t>()[t] = static_cast<int32_t>(y);
    else
      c.labels.data_as<int64_t>()[t] = y;
  }
  if (s.weights) {
    c.weights = Tensor::empty(DType::kF32, {s.B});
    for (int64_t t = 0; t < s.B; ++t) c.weights.data_as<float>()[t] = static_cast<float>(0.25 + 1.5 * u(rng));
  }
  return c;
}

Shape loss_shape(const Case& c, const Options& o) {
  return o.reduction == Reduction::kNone ? Shape{c.spec.B} : Shape{};
}

Tensor make_grad_loss(const Case& c, const Options& o, uint64_t seed) {
  Tensor g = Tensor::empty(DType::kF32, loss_shape(c, o));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.5f, 2.0f);
  for (int64_t i = 0; i < g.numel(); ++i) g.data_as<float>()[i] = u(rng);
  if (g.numel() > 2) g.data_as<float>()[1] = 0.0f;  // a zero upstream gradient too
  return g;
}

// dw in w's memory layout (as the API requires).
Tensor alloc_like(const Tensor& w, DType dt) {
  if (w.view().is_contiguous()) return Tensor::empty(dt, w.shape());
  Tensor m = Tensor::empty(dt, {w.shape()[1], w.shape()[0]});
  return m.as_strided(w.shape(), {1, w.shape()[0]});
}

struct Out {
  Tensor loss, lse, argmax, dx, dw, dbias;
  std::string impl;
};

enum class Pass { kForward, kBackward, kBackwardWithLse, kFused };

Out run(const Case& c, Options o, const std::string& impl, Pass pass, DType grad_dtype,
        const Tensor& grad_loss) {
  o.implementation = impl;
  Out r;
  r.loss = Tensor::zeros(DType::kF32, loss_shape(c, o));
  r.lse = Tensor::zeros(DType::kF32, {c.spec.B});
  if (o.return_argmax) r.argmax = Tensor::zeros(DType::kI64, {c.spec.B});
  ForwardOutputs fo{r.loss.view(), r.lse.view(), std::nullopt};
  if (o.return_argmax) fo.argmax = r.argmax.view();
  const Inputs in = c.inputs();
  if (pass == Pass::kForward) {
    forward(in, fo, o);
    r.impl = last_implementation();
    return r;
  }
  const DType gdt = grad_dtype;
  r.dx = Tensor::empty(gdt == DType::kF32 ? DType::kF32 : c.spec.dtype, c.x.shape());
  r.dw = alloc_like(c.w, gdt == DType::kF32 ? DType::kF32 : c.spec.dtype);
  Gradients g{r.dx.view(), r.dw.view(), std::nullopt};
  if (c.bias.defined()) {
    r.dbias = Tensor::empty(gdt == DType::kF32 ? DType::kF32 : c.spec.bias_dtype, {c.spec.V});
    g.dbias = r.dbias.view();
  }
  if (pass == Pass::kFused) {
    forward_backward(in, grad_loss.view(), fo, g, o);
  } else if (pass == Pass::kBackwardWithLse) {
    Options fwd = o;
    fwd.implementation = "reference";
    forward(in, fo, fwd);
    backward(in, grad_loss.view(), g, o, r.lse.view());
  } else {
    backward(in, grad_loss.view(), g, o);
  }
  r.impl = last_implementation();
  return r;
}

double ulp_rtol(DType t) {
  switch (t) {
    case DType::kBF16: return 1.0 / 128;
    case DType::kF16: return 1.0 / 1024;
    default: return 0.0;
  }
}

// |got − ref| <= 1e-4·max|ref| + (1e-4 + ulp_rtol)·|ref| (+ 2^-24 for f16); see the file comment.
void expect_close(const Tensor& got, const Tensor& ref, const std::string& what) {
  ASSERT_EQ(got.numel(), ref.numel()) << what;
  ASSERT_EQ(got.dtype(), ref.dtype()) << what;
  double maxref = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i)
    maxref = std::max(maxref, std::fabs(static_cast<double>(load_as_f32(ref.data(), ref.dtype(), i))));
  const double rtol = 1e-4 + ulp_rtol(got.dtype());
  const double atol = 1e-4 * maxref + (got.dtype() == DType::kF16 ? std::ldexp(1.0, -24) : 0.0);
  double worst = 0.0;
  int64_t worst_i = -1, bad = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = load_as_f32(got.data(), got.dtype(), i);
    const double b = load_as_f32(ref.data(), ref.dtype(), i);
    const double dev = std::fabs(a - b);
    if (!(dev <= atol + rtol * std::fabs(b))) ++bad;
    if (!(dev <= worst)) {
      worst = dev;
      worst_i = i;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.numel() << " elements out of tolerance; max |dev| "
                    << worst << " at " << worst_i << " (max|ref| " << maxref << ", atol " << atol << ", rtol "
                    << rtol << ")";
}

void expect_same_i64(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel());
  for (int64_t i = 0; i < a.numel(); ++i)
    EXPECT_EQ(a.data_as<int64_t>()[i], b.data_as<int64_t>()[i]) << what << " at " << i;
}

// Forward, backward (with and without the forward's lse) and fused against the reference.
void check_parity(const CaseSpec& spec, const Options& opt, const std::string& label,
                  DType grad_dtype = DType::kF32) {
  SCOPED_TRACE(label);
  const Case c = make_case(spec);
  const Tensor gl = make_grad_loss(c, opt, spec.seed + 7);
  const Out fr = run(c, opt, "reference", Pass::kForward, grad_dtype, gl);
  const Out fc = run(c, opt, "cpu", Pass::kForward, grad_dtype, gl);
  ASSERT_EQ(fc.impl, "cpu");
  expect_close(fc.loss, fr.loss, "forward loss");
  expect_close(fc.lse, fr.lse, "forward lse");
  if (opt.return_argmax) expect_same_i64(fc.argmax, fr.argmax, "argmax");

  const Out br = run(c, opt, "reference", Pass::kBackward, grad_dtype, gl);
  for (Pass pass : {Pass::kBackward, Pass::kBackwardWithLse, Pass::kFused}) {
    const std::string name = pass == Pass::kBackward ? "backward" : pass == Pass::kFused ? "fused" : "backward(lse)";
    const Out bc = run(c, opt, "cpu", pass, grad_dtype, gl);
    expect_close(bc.dx, br.dx, name + " dx");
    expect_close(bc.dw, br.dw, name + " dw");
    if (spec.bias) expect_close(bc.dbias, br.dbias, name + " dbias");
    if (pass == Pass::kFused) {
      expect_close(bc.loss, fr.loss, "fused loss");
      expect_close(bc.lse, fr.lse, "fused lse");
      if (opt.return_argmax) expect_same_i64(bc.argmax, fr.argmax, "fused argmax");
    }
  }
}

struct OptionSet {
  const char* name;
  Options opt;
  bool bias, weights;
  double ignored;
};

std::vector<OptionSet> option_sets() {
  std::vector<OptionSet> v;
  Options o;
  v.push_back({"mean", o, false, false, 0.0});
  o = {};
  o.reduction = Reduction::kSum;
  o.soft_cap = 3.0;
  o.z_loss_weight = 1e-2;
  o.label_smoothing = 0.1;
  v.push_back({"sum+softcap+zloss+smoothing+bias+weights+ignored", o, true, true, 0.25});
  o = {};
  o.reduction = Reduction::kNone;  // per-token upstream gradients (peer bug: only the first applied)
  o.return_argmax = true;
  o.label_smoothing = 0.3;
  v.push_back({"none+argmax+smoothing+ignored", o, false, true, 0.2});
  o = {};
  o.reduction = Reduction::kMean;
  o.soft_cap = 1.5;  // strong cap: derivative 1 − (z/c)² far from 1
  o.z_loss_weight = 1e-3;
  v.push_back({"mean+weights+bias+strongcap+zloss", o, true, true, 0.3});
  return v;
}

const char* wform_name(WForm f) {
  switch (f) {
    case WForm::kHV: return "w[H,V]";
    case WForm::kVH: return "w[V,H]";
    case WForm::kHVViewOfVH: return "w[H,V] view of [V,H] memory";
    case WForm::kVHViewOfHV: return "w[V,H] view of [H,V] memory";
  }
  return "?";
}

// Small blocks (b=8, h=8, v=16) so that every dimension has several blocks and a tail.
TEST(LinearCrossEntropyCpu, ParityGridSmallBlocks) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (WForm wf : {WForm::kHV, WForm::kVH, WForm::kHVViewOfVH, WForm::kVHViewOfHV})
      for (const OptionSet& os : option_sets()) {
        CaseSpec s;
        s.B = 37;
        s.H = 29;
        s.V = 83;
        s.dtype = dt;
        s.wform = wf;
        s.bias = os.bias;
        s.bias_dtype = dt;
        s.weights = os.weights;
        s.ignored_fraction = os.ignored;
        s.seed = 11;
        Options o = os.opt;
        o.block_sizes = BlockSizes{8, 8, 16};
        o.num_threads = 2;
        check_parity(s, o, std::string(dtype_name(dt)) + " " + wform_name(wf) + " " + os.name);
      }
}

// Gradient outputs in the input dtype (bf16 / f16): f32 accumulation, one rounding at the end.
TEST(LinearCrossEntropyCpu, ParityHalfGradientOutputs) {
  for (DType dt : {DType::kBF16, DType::kF16})
    for (WForm wf : {WForm::kHV, WForm::kVH}) {
      CaseSpec s;
      s.B = 45;
      s.H = 33;
      s.V = 70;
      s.dtype = dt;
      s.wform = wf;
      s.bias = true;
      s.bias_dtype = dt;
      s.weights = true;
      s.ignored_fraction = 0.1;
      Options o;
      o.label_smoothing = 0.05;
      o.block_sizes = BlockSizes{16, 16, 32};
      check_parity(s, o, std::string(dtype_name(dt)) + " grads " + wform_name(wf), dt);
    }
}

// Default block sizes (V smaller than the v block, B smaller than the b block), odd shapes,
// B = 1, V = 1, V smaller than the per-thread alignment (thread 1 owns no vocabulary), i32
// labels, bias of another dtype than x, ignore_index that is a valid class.
TEST(LinearCrossEntropyCpu, ParityOddShapes) {
  struct S {
    int64_t B, H, V;
    int threads;
  };
  for (const S sh : {S{1, 5, 7, 2}, S{3, 1, 1, 2}, S{5, 17, 9, 2}, S{19, 40, 300, 1}, S{70, 3, 129, 3}}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      CaseSpec s;
      s.B = sh.B;
      s.H = sh.H;
      s.V = sh.V;
      s.dtype = dt;
      s.wform = sh.B % 2 ? WForm::kVH : WForm::kHV;
      s.bias = true;
      s.bias_dtype = DType::kF32;
      s.label_dtype = DType::kI32;
      s.ignored_fraction = 0.2;
      s.ignore_index = 0;  // a valid class id used as ignore_index
      Options o;
      o.ignore_index = 0;
      o.return_argmax = true;
      o.num_threads = sh.threads;
      o.z_loss_weight = 1e-2;
      check_parity(s, o,
                   "B=" + std::to_string(sh.B) + " H=" + std::to_string(sh.H) + " V=" + std::to_string(sh.V) +
                       " " + dtype_name(dt));
    }
  }
}

// Every row ignored: mean has denominator 0 -> loss 0 and all gradients 0 (sum: also 0).
TEST(LinearCrossEntropyCpu, AllIgnored) {
  for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    CaseSpec s;
    s.B = 9;
    s.H = 8;
    s.V = 20;
    s.bias = true;
    s.ignored_fraction = 1.0;
    Options o;
    o.reduction = red;
    o.block_sizes = BlockSizes{4, 8, 8};
    check_parity(s, o, std::string("all ignored ") + reduction_name(red));
    const Case c = make_case(s);
    const Out r = run(c, o, "cpu", Pass::kFused, DType::kF32, make_grad_loss(c, o, 3));
    for (int64_t i = 0; i < r.loss.numel(); ++i) EXPECT_EQ(r.loss.data_as<float>()[i], 0.0f);
    for (int64_t i = 0; i < r.dw.numel(); ++i) ASSERT_EQ(r.dw.data_as<float>()[i], 0.0f);
    for (int64_t i = 0; i < r.dx.numel(); ++i) ASSERT_EQ(r.dx.data_as<float>()[i], 0.0f);
    for (int64_t i = 0; i < r.dbias.numel(); ++i) ASSERT_EQ(r.dbias.data_as<float>()[i], 0.0f);
  }
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.view().nbytes()) == 0;
}

// Same thread count -> bitwise identical results; 1 vs 2 threads agree within tolerance.
TEST(LinearCrossEntropyCpu, DeterministicForFixedThreadCount) {
  CaseSpec s;
  s.B = 150;
  s.H = 48;
  s.V = 517;
  s.bias = true;
  s.weights = true;
  s.ignored_fraction = 0.1;
  const Case c = make_case(s);
  Options o;
  o.label_smoothing = 0.1;
  o.block_sizes = BlockSizes{32, 512, 64};
  const Tensor gl = make_grad_loss(c, o, 5);
  o.num_threads = 2;
  const Out a = run(c, o, "cpu", Pass::kFused, DType::kF32, gl);
  for (int rep = 0; rep < 3; ++rep) {
    const Out b = run(c, o, "cpu", Pass::kFused, DType::kF32, gl);
    EXPECT_TRUE(bitwise_equal(a.loss, b.loss));
    EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
    EXPECT_TRUE(bitwise_equal(a.dx, b.dx));
    EXPECT_TRUE(bitwise_equal(a.dw, b.dw));
    EXPECT_TRUE(bitwise_equal(a.dbias, b.dbias));
  }
  o.num_threads = 1;
  const Out one = run(c, o, "cpu", Pass::kFused, DType::kF32, gl);
  expect_close(one.loss, a.loss, "1 vs 2 threads loss");
  expect_close(one.lse, a.lse, "1 vs 2 threads lse");
  expect_close(one.dx, a.dx, "1 vs 2 threads dx");
  expect_close(one.dw, a.dw, "1 vs 2 threads dw");
  expect_close(one.dbias, a.dbias, "1 vs 2 threads dbias");
}

// Peer bug: p_y − 1 cancels if p_y is rounded to bf16 first. Here the label's logit dominates
// (p_y ≈ 1 − 1e-4), so the label column's gradient is tiny and must still be accurate.
TEST(LinearCrossEntropyCpu, LabelColumnGradientNoCancellation) {
  const int64_t B = 4, H = 4, V = 16;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor x = Tensor::zeros(dt, {B, H}), w = Tensor::zeros(dt, {H, V}), labels = Tensor::empty(DType::kI64, {B});
    for (int64_t t = 0; t < B; ++t) {
      store_from_f32(x.data(), dt, t * H + t % H, 1.0f);
      labels.data_as<int64_t>()[t] = 3;
    }
    for (int64_t h = 0; h < H; ++h) store_from_f32(w.data(), dt, h * V + 3, 12.0f);  // z_y = 12, others 0
    Inputs in{x.view(), w.view(), std::nullopt, labels.view(), std::nullopt};
    Options o;
    o.reduction = Reduction::kSum;
    Options oc = o, orf = o;
    oc.implementation = "cpu";
    orf.implementation = "reference";
    Tensor g = Tensor::empty(DType::kF32, {});
    g.data_as<float>()[0] = 1.0f;
    auto grads = [&](const Options& opt, Tensor& dw) {
      Tensor loss = Tensor::empty(DType::kF32, {}), lse = Tensor::empty(DType::kF32, {B});
      Tensor dx = Tensor::empty(DType::kF32, {B, H});
      dw = Tensor::empty(DType::kF32, {H, V});
      forward_backward(in, g.view(), {loss.view(), lse.view(), std::nullopt}, {dx.view(), dw.view(), std::nullopt}, opt);
    };
    Tensor dwc, dwr;
    grads(oc, dwc);
    grads(orf, dwr);
    for (int64_t h = 0; h < H; ++h) {
      const double ref = dwr.data_as<float>()[h * V + 3];  // = p_y − 1 ≈ −15·e^-12 ≈ −9.2e-5
      const double got = dwc.data_as<float>()[h * V + 3];
      ASSERT_LT(ref, -1e-5);
      // f32 partial sums make lse accurate to ~1e-7 absolute, i.e. ~1e-3 of p_y − 1 here;
      // rounding p_y to bf16 first would give 0 (100 % error).
      EXPECT_NEAR(got, ref, 5e-3 * std::fabs(ref)) << dtype_name(dt) << " h=" << h;
    }
  }
}

// Peer bug: dw accumulated in bf16 across token blocks drifts. 512 token blocks of one row
// each add into a bf16 dw; the result must be the f32 sum rounded once.
TEST(LinearCrossEntropyCpu, Bf16DwAccumulatesInF32AcrossTokenBlocks) {
  CaseSpec s;
  s.B = 512;
  s.H = 8;
  s.V = 24;
  s.dtype = DType::kBF16;
  Options o;
  o.reduction = Reduction::kSum;
  o.block_sizes = BlockSizes{1, 8, 8};
  check_parity(s, o, "bf16 dw over 512 token blocks", DType::kBF16);
}

// Explicit bad block sizes fail before anything runs, naming the broken constraint.
TEST(LinearCrossEntropyCpu, BadBlockSizesErrorClearly) {
  auto expect_error = [](const BlockSizes& bs, const std::string& needle) {
    try {
      validate_block_sizes("cpu", bs);
      ADD_FAILURE() << "no error for " << bs.str();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({0, 512, 1024}, "b (token block)");
  expect_error({-3, 512, 1024}, "b (token block)");
  expect_error({64, 512, 0}, "v (vocab block)");
  expect_error({64, 0, 1024}, "h (hidden block");
  expect_error({int64_t{1} << 40, 512, 1024}, "b (token block)");
  EXPECT_NO_THROW(validate_block_sizes("cpu", {1, 1, 1}));

  const Case c = make_case(CaseSpec{});
  Options o;
  o.implementation = "cpu";
  o.block_sizes = BlockSizes{64, 512, 0};
  Tensor loss = Tensor::empty(DType::kF32, {}), lse = Tensor::empty(DType::kF32, {c.spec.B});
  EXPECT_THROW(forward(c.inputs(), {loss.view(), lse.view(), std::nullopt}, o), Error);
}

TEST(LinearCrossEntropyCpu, IsTheDefaultOnHostAndTunable) {
  const Case c = make_case(CaseSpec{});
  Tensor loss = Tensor::empty(DType::kF32, {}), lse = Tensor::empty(DType::kF32, {c.spec.B});
  forward(c.inputs(), {loss.view(), lse.view(), std::nullopt}, Options{});
  EXPECT_EQ(last_implementation(), "cpu");
}

// Extra memory is bounded by block sizes and threads, not by B: the tracked scratch peak of a
// forward pass is the same for B = 64 and B = 1024, and the fused pass stays near b·V·4 bytes
// (plus small per-row / per-V buffers) with f32 gradients.
TEST(LinearCrossEntropyCpu, ScratchMemoryIsBounded) {
  auto peak_for = [](int64_t B, Pass pass) {
    CaseSpec s;
    s.B = B;
    s.H = 32;
    s.V = 2048;
    const Case c = make_case(s);
    Options o;
    o.num_threads = 2;
    o.block_sizes = BlockSizes{64, 512, 256};
    const Tensor gl = make_grad_loss(c, o, 1);
    memory::reset_peak(memory::Space::kHost);
    const size_t before = memory::current_bytes(memory::Space::kHost);
    run(c, o, "cpu", pass, DType::kF32, gl);
    return memory::peak_bytes(memory::Space::kHost) - before;
  };
  const size_t f64 = peak_for(64, Pass::kForward), f1024 = peak_for(1024, Pass::kForward);
  EXPECT_EQ(f64, f1024);
  EXPECT_LE(f1024, size_t{2} * 64 * 256 * 4 + 64 * 1024);  // 2 threads × b×v tile + rows
  const size_t fused = peak_for(1024, Pass::kFused);
  EXPECT_EQ(fused, peak_for(128, Pass::kFused));
  EXPECT_LE(fused, size_t{64} * 2048 * 4 + 64 * 1024);  // b×V slab + rows
}

}  // namespace
}  // namespace tessera::linear_cross_entropy
