#include "kernels/linear_cross_entropy/testing.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/random.h"
#include "tessera/error.h"

namespace tessera::linear_cross_entropy::testing {
namespace {


using harness::to_doubles;

// Memory of a (possibly transposed) 2-D view, in memory order.
std::vector<double> memory_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = load_as_f32(t.data(), t.dtype(), i);
  return v;
}

}  // namespace

std::string CaseSpec::name() const {
  std::ostringstream os;
  os << dtype_name(dtype) << " lead=" << shape_str(lead) << " H=" << H << " V=" << V << " w="
     << w_layout_name(memory_layout) << (transposed_view ? "(T-view)" : "") << " red="
     << reduction_name(opt.reduction);
  if (bias) os << " bias:" << dtype_name(bias_dtype);
  if (weights) os << " weights";
  if (class_weights) os << " class_weights";
  if (label_dtype != DType::kI64) os << " labels:" << dtype_name(label_dtype);
  if (opt.ignore_index != -100) os << " ignore=" << opt.ignore_index;
  if (ignore_fraction > 0) os << " ign=" << ignore_fraction;
  if (opt.label_smoothing > 0) os << " eps=" << opt.label_smoothing;
  if (opt.z_loss_weight > 0) os << " z=" << opt.z_loss_weight;
  if (opt.softcap > 0) os << " cap=" << opt.softcap;
  if (opt.return_argmax) os << " argmax";
  if (f32_grads) os << " f32grads";
  if (logit_scale != 3.0) os << " scale=" << logit_scale;
  return os.str();
}

// Every tensor of a case draws from its own stream of the one generator (core/random.h).
CaseData make_case(const CaseSpec& s) {
  const uint64_t seed = s.seed * 16;
  CaseData d;
  Shape xs = s.lead;
  xs.push_back(s.H);
  d.x = Tensor::empty(s.dtype, xs);
  fill_uniform(d.x, -1.0, 1.0, seed + 1);
  // z = x·w has std ≈ sqrt(H/3)·(a/sqrt(3)) for w ~ U(-a, a); pick a so that |z| ~ logit_scale.
  const double a = s.logit_scale * 3.0 / std::sqrt(static_cast<double>(s.H));
  const Shape mem = s.memory_layout == WLayout::kVH ? Shape{s.V, s.H} : Shape{s.H, s.V};
  d.w = Tensor::empty(s.dtype, mem);
  fill_uniform(d.w, -a, a, seed + 2);
  d.w_view_owner = s.transposed_view ? d.w.as_strided({mem[1], mem[0]}, {1, mem[1]}) : d.w;
  if (s.bias) {
    d.bias = Tensor::empty(s.bias_dtype, {s.V});
    fill_uniform(d.bias, -1.0, 1.0, seed + 3);
  }
  const int64_t B = shape_numel(s.lead);
  d.labels = random_indices(s.label_dtype, s.lead, s.V, seed + 4);
  for (int64_t t = 0; t < B; ++t)
    if (random_unit(seed + 5, static_cast<uint64_t>(t)) < s.ignore_fraction) {
      if (s.label_dtype == DType::kI32) d.labels.data_as<int32_t>()[t] = static_cast<int32_t>(s.opt.ignore_index);
      else d.labels.data_as<int64_t>()[t] = s.opt.ignore_index;
    }
  if (s.weights) {
    d.weights = Tensor::empty(DType::kF32, s.lead);
    fill_uniform(d.weights, 0.25, 2.0, seed + 6);
  }
  if (s.class_weights) {
    d.class_weights = Tensor::empty(DType::kF32, {s.V});
    fill_uniform(d.class_weights, 0.0, 3.0, seed + 8);
    d.class_weights.data_as<float>()[s.V / 2] = 0.0f;  // a class that counts for nothing
  }
  if (s.opt.reduction == Reduction::kNone) {
    d.grad_loss = Tensor::empty(DType::kF32, s.lead);
    fill_uniform(d.grad_loss, -1.0, 2.0, seed + 7);  // distinct per token: catches "first only" bugs
  } else {
    d.grad_loss = Tensor::empty(DType::kF32, {});
    d.grad_loss.data_as<float>()[0] = 0.7f;
  }
  return d;
}

Inputs CaseData::inputs() const {
  Inputs in;
  in.x = x.view();
  in.w = w_view_owner.view();
  if (bias.defined()) in.bias = bias.view();
  in.labels = labels.view();
  if (weights.defined()) in.token_weights = weights.view();
  if (class_weights.defined()) in.class_weights = class_weights.view();
  return in;
}

CaseData CaseData::to(Device device) const {
  CaseData d;
  auto mv = [&](const Tensor& t) { return t.defined() ? t.to(device) : Tensor(); };
  d.x = mv(x);
  d.w = mv(w);
  d.bias = mv(bias);
  d.labels = mv(labels);
  d.weights = mv(weights);
  d.class_weights = mv(class_weights);
  d.grad_loss = mv(grad_loss);
  d.w_view_owner = w_view_owner.view().is_contiguous() ? d.w : d.w.as_strided(w_view_owner.shape(), w_view_owner.view().strides);
  return d;
}

// Tolerances. Every implementation sees the same (already rounded) inputs, so the only
// differences from the double-precision oracle come from (a) f32 accumulation, (b) a backend
// rounding the logit gradient to the input dtype before the backward GEMMs (tensor cores take
// bf16/f16 operands), and (c) rounding the stored gradient to its dtype.
//  - loss, lse are f32 outputs computed from f32-accumulated logits: GEMM error ~ sqrt(H)·2^-24·|z|
//    is < 1e-6 relative at our sizes; rtol 1e-4 with an absolute floor of 1e-5·scale leaves
//    100x margin and still catches any wrong term (those are O(1e-2) or larger).
//  - gradients: an error of one unit roundoff u per term of Σ_j dz_j·w_j gives an absolute error
//    ≲ u·max|grad| (random signs make it smaller), so atol_scale = rtol = 2.5·u_compute with
//    u = 2^-8 (bf16), 2^-11 (f16) and a floor of 2e-4 for f32; storing in bf16/f16 adds its own
//    u to rtol.
Tolerances tolerances(const CaseSpec& s) {
  auto unit = [](DType t) {
    switch (t) {
      case DType::kBF16: return std::ldexp(1.0, -8);
      case DType::kF16: return std::ldexp(1.0, -11);
      default: return 0.0;
    }
  };
  Tolerances t;
  t.loss = {1e-4, 1e-5};
  t.lse = {1e-4, 1e-5};
  const double compute = std::max(2e-4, 2.5 * unit(s.dtype));
  auto grad = [&](DType stored) { return harness::Tolerance{compute + unit(stored), compute}; };
  t.dx = grad(s.f32_grads ? DType::kF32 : s.dtype);
  t.dw = grad(s.f32_grads ? DType::kF32 : s.dtype);
  t.dbias = grad(s.f32_grads ? DType::kF32 : s.bias_dtype);
  return t;
}

Options options_for(const CaseSpec& s, const std::string& impl) {
  Options opt = s.opt;
  opt.implementation = impl;
  if (s.H == s.V && opt.w_layout == WLayout::kAuto) {  // a square w's layout must be said
    const bool hv = s.memory_layout == WLayout::kHV;
    opt.w_layout = hv != s.transposed_view ? WLayout::kHV : WLayout::kVH;
  }
  return opt;
}

namespace {

struct Outputs {
  Tensor loss, lse, argmax, dx, dw, dbias;
};

Outputs run_one(const CaseSpec& s, const CaseData& d, const std::string& impl, Pass pass, Device dev) {
  const Options opt = options_for(s, impl);
  const Inputs in = d.inputs();
  Outputs o;
  const Shape lead = s.lead;
  // Only the outputs the pass writes: a backward pass's never-written loss / lse on the device,
  // copied back, is what compute-sanitizer initcheck reported (docs/gpu_results/2026-11-27-eighth).
  ForwardOutputs fo;
  if (pass != Pass::kBackward) {
    o.loss = Tensor::empty(DType::kF32, opt.reduction == Reduction::kNone ? lead : Shape{}, dev);
    o.lse = Tensor::empty(DType::kF32, lead, dev);
    fo = ForwardOutputs{o.loss.view(), o.lse.view(), std::nullopt};
    if (opt.return_argmax) {
      o.argmax = Tensor::empty(DType::kI64, lead, dev);
      fo.argmax = o.argmax.view();
    }
  }
  if (pass == Pass::kForward) {
    forward(in, fo, opt);
    return o;
  }
  o.dx = Tensor::empty(s.f32_grads ? DType::kF32 : s.dtype, d.x.shape(), dev);
  o.dw = Tensor::empty_like_layout(d.w_view_owner, s.f32_grads ? DType::kF32 : s.dtype);
  Gradients g{o.dx.view(), o.dw.view(), std::nullopt};
  if (d.bias.defined()) {
    o.dbias = Tensor::empty(s.f32_grads ? DType::kF32 : s.bias_dtype, {s.V}, dev);
    g.dbias = o.dbias.view();
  }
  if (pass == Pass::kBackward) {
    backward(in, d.grad_loss.view(), g, opt);
  } else {
    forward_backward(in, d.grad_loss.view(), fo, g, opt);
  }
  return o;
}

Outputs to_host(const Outputs& o) {
  auto h = [](const Tensor& t) { return t.defined() ? t.to(Device::cpu()) : Tensor(); };
  return {h(o.loss), h(o.lse), h(o.argmax), h(o.dx), h(o.dw), h(o.dbias)};
}

}  // namespace

std::vector<double> specified_lse(const CaseSpec& s, const CaseData& host, std::vector<double> lse) {
  if (!s.opt.skip_ignored) return lse;
  for (size_t t = 0; t < lse.size(); ++t) {
    const auto i = static_cast<int64_t>(t);
    const int64_t y = host.labels.dtype() == DType::kI32 ? host.labels.data_as<int32_t>()[i] : host.labels.data_as<int64_t>()[i];
    if (y == s.opt.ignore_index) lse[t] = 0.0;
  }
  return lse;
}

ParityReport check_parity(const CaseSpec& s, const std::string& impl, Pass pass, Device device) {
  ParityReport r;
  r.case_name = s.name();
  r.implementation = impl;
  r.pass = pass_name(pass);
  const CaseData host = make_case(s);
  Outputs want = run_one(s, host, "reference", pass, Device::cpu());
  Outputs got;
  try {
    const CaseData dev = device.type == DeviceType::kCPU ? host : host.to(device);
    got = to_host(run_one(s, dev, impl, pass, device));
    r.ran = true;
  } catch (const Error& e) {
    r.error = e.what();
    r.skipped = e.code() == ErrorCode::kUnsupported;
    return r;
  }
  const Tolerances tol = tolerances(s);
  const bool fwd = pass != Pass::kBackward;
  if (fwd) {
    r.fields.push_back({"loss", harness::compare(to_doubles(got.loss), to_doubles(want.loss), tol.loss)});
    r.fields.push_back({"lse", harness::compare(specified_lse(s, host, to_doubles(got.lse)),
                                                specified_lse(s, host, to_doubles(want.lse)), tol.lse)});
    if (want.argmax.defined())
      r.fields.push_back({"argmax", harness::compare(to_doubles(got.argmax), to_doubles(want.argmax), {0, 0})});
  }
  if (pass != Pass::kForward) {
    r.fields.push_back({"dx", harness::compare(to_doubles(got.dx), to_doubles(want.dx), tol.dx)});
    r.fields.push_back({"dw", harness::compare(memory_doubles(got.dw), memory_doubles(want.dw), tol.dw)});
    if (want.dbias.defined())
      r.fields.push_back({"dbias", harness::compare(to_doubles(got.dbias), to_doubles(want.dbias), tol.dbias)});
  }
  return r;
}

std::vector<CaseSpec> check_grid(bool quick) {
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  harness::SeededGrid<CaseSpec> add(100);
  for (DType dt : dtypes) {
    CaseSpec base;
    base.dtype = dt;
    base.bias_dtype = dt;
    // Plain mean over a small odd shape.
    add(base);
    // Sum with bias; 2-D leading axes; i32 labels; f32 gradients.
    {
      CaseSpec c = base;
      c.lead = {2, 5};
      c.H = 33;
      c.V = 130;
      c.bias = true;
      c.opt.reduction = Reduction::kSum;
      c.label_dtype = DType::kI32;
      c.f32_grads = true;
      add(c);
    }
    // Per-token losses with weights and distinct upstream gradients; [V, H] weight.
    {
      CaseSpec c = base;
      c.lead = {11};
      c.H = 24;
      c.V = 67;
      c.weights = true;
      c.memory_layout = WLayout::kVH;
      c.opt.reduction = Reduction::kNone;
      add(c);
    }
    // Everything at once: soft cap, z-loss, smoothing, bias (f32 bias on low-precision w), weights, argmax.
    {
      CaseSpec c = base;
      c.lead = {9};
      c.H = 40;
      c.V = 101;
      c.bias = true;
      c.bias_dtype = DType::kF32;
      c.weights = true;
      c.opt.softcap = 5.0;
      c.opt.z_loss_weight = 1e-2;
      c.opt.label_smoothing = 0.1;
      c.opt.return_argmax = true;
      c.logit_scale = 6.0;
      add(c);
    }
    // Class weights (PyTorch's weight): with token weights (mean over Σ w[y]); and with label
    // smoothing, soft cap, z-loss and bias, per token (issue #17).
    {
      CaseSpec c = base;
      c.lead = {14};
      c.H = 19;
      c.V = 45;
      c.weights = true;
      c.class_weights = true;
      add(c);
      c.weights = false;
      c.bias = true;
      c.memory_layout = WLayout::kVH;
      c.opt.reduction = Reduction::kNone;
      c.opt.label_smoothing = 0.2;
      c.opt.softcap = 6.0;
      c.opt.z_loss_weight = 1e-2;
      add(c);
    }
    // Transposed views (PyTorch lm_head.weight.T), both memory layouts.
    for (WLayout l : {WLayout::kHV, WLayout::kVH}) {
      CaseSpec c = base;
      c.lead = {6};
      c.H = 17;
      c.V = 29;
      c.memory_layout = l;
      c.transposed_view = true;
      c.opt.label_smoothing = 0.2;
      add(c);
    }
    if (quick) continue;
    // Unbatched single example [H]; sum.
    {
      CaseSpec c = base;
      c.lead = {};
      c.H = 16;
      c.V = 9;
      c.ignore_fraction = 0.0;
      c.opt.reduction = Reduction::kSum;
      add(c);
    }
    // All rows ignored: mean is 0, gradients 0.
    {
      CaseSpec c = base;
      c.lead = {5};
      c.ignore_fraction = 1.0;
      c.bias = true;
      add(c);
    }
    // ignore_index inside [0, V): label 3 means "ignored".
    {
      CaseSpec c = base;
      c.lead = {12};
      c.V = 5;
      c.H = 8;
      c.ignore_fraction = 0.3;
      c.opt.ignore_index = 3;
      add(c);
    }
    // V = 1 and H = 1 edges.
    {
      CaseSpec c = base;
      c.lead = {4};
      c.H = 1;
      c.V = 1;
      c.ignore_fraction = 0.0;
      c.opt.label_smoothing = 0.3;
      add(c);
    }
    // Large logits (stability of logsumexp), with z-loss.
    {
      CaseSpec c = base;
      c.lead = {8};
      c.H = 20;
      c.V = 50;
      c.logit_scale = 40.0;
      c.opt.z_loss_weight = 1e-4;
      c.opt.return_argmax = true;
      add(c);
    }
    // Vocabulary larger than a default vocab block, odd tail; f32 gradients.
    {
      CaseSpec c = base;
      c.lead = {5};
      c.H = 12;
      c.V = 2048 + 37;
      c.bias = true;
      c.f32_grads = true;
      c.opt.softcap = 15.0;
      add(c);
    }
    // Class weights with smoothing over more than a vocab block (odd tail), mean.
    {
      CaseSpec c = base;
      c.lead = {7};
      c.H = 10;
      c.V = 2048 + 53;
      c.weights = true;
      c.class_weights = true;
      c.opt.label_smoothing = 0.1;
      add(c);
    }
    // More tokens than a default token block.
    {
      CaseSpec c = base;
      c.lead = {1024 + 29};
      c.H = 6;
      c.V = 21;
      c.weights = true;
      c.memory_layout = WLayout::kVH;
      c.opt.label_smoothing = 0.05;
      add(c);
    }
    // Empty batch.
    {
      CaseSpec c = base;
      c.lead = {0};
      c.bias = true;
      add(c);
    }
  }
  return add.take();
}

}  // namespace tessera::linear_cross_entropy::testing
