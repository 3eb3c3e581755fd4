// linear_cross_entropy: the public API. Validates every input and output before anything
// runs (an error touches no output), normalizes shapes into a Problem, picks block sizes and
// dispatches with the fallback rules of src/dispatch.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "core/env.h"
#include "core/log.h"
#include "dispatch/dispatch.h"
#include "kernels/linear_cross_entropy/compact.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"
#include "tune/declared.h"

namespace tessera::linear_cross_entropy {
namespace {

const std::string kName = kKernelName;

[[noreturn]] void bad(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, kName + ": " + msg);
}

thread_local std::string t_last_impl;

void require_contiguous(const TensorView& t, const char* what) {
  if (!t.is_contiguous())
    bad(std::string(what) + " must be contiguous (row-major), got strides " + shape_str(t.strides) +
        " for shape " + shape_str(t.shape));
}

void require_data(const TensorView& t, const char* what) {
  if (t.data == nullptr && t.numel() > 0) bad(std::string(what) + " has no data (null pointer)");
}

void require_device(const TensorView& t, const Device& d, const char* what) {
  if (t.device != d)
    bad(std::string(what) + " is on " + t.device.str() + " but x is on " + d.str());
}

bool all_finite(const TensorView& t) {
  if (t.device.type != DeviceType::kCPU) return true;  // device data is not inspected here
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(load_as_f32(t.data, t.dtype, i))) return false;
  return true;
}

// How the 2-D view w maps onto memory. Returns the memory layout.
WLayout resolve_w_layout(const TensorView& w, int64_t H, WLayout requested, int64_t* V) {
  if (w.ndim() != 2) bad("w must be 2-D ([H, V] or [V, H]), got " + w.str());
  const int64_t r = w.shape[0], c = w.shape[1];
  bool logical_hv;  // the view's logical shape is [H, V]
  switch (requested) {
    case WLayout::kHV:
      if (r != H) bad("w_layout=hv expects w of shape [H=" + std::to_string(H) + ", V], got " + shape_str(w.shape));
      logical_hv = true;
      break;
    case WLayout::kVH:
      if (c != H) bad("w_layout=vh expects w of shape [V, H=" + std::to_string(H) + "], got " + shape_str(w.shape));
      logical_hv = false;
      break;
    default:
      if (r == H && c == H)
        bad("w is square (" + shape_str(w.shape) + ", H == V): its layout is ambiguous; set w_layout to "
            "hv ([H, V], x @ w) or vh ([V, H], x @ w.T, PyTorch's lm_head.weight)");
      if (r == H)
        logical_hv = true;
      else if (c == H)
        logical_hv = false;
      else
        bad("w of shape " + shape_str(w.shape) + " has no dimension equal to H=" + std::to_string(H) +
            " (x is [..., H])");
  }
  *V = logical_hv ? c : r;
  // Memory: row-major of the view, or its transpose (a transposed view of a contiguous array).
  const bool row_major = (w.strides[1] == 1 || c == 1) && (w.strides[0] == c || r == 1);
  const bool col_major = (w.strides[0] == 1 || r == 1) && (w.strides[1] == r || c == 1);
  if (row_major) return logical_hv ? WLayout::kHV : WLayout::kVH;
  if (col_major) return logical_hv ? WLayout::kVH : WLayout::kHV;
  bad("w must be contiguous or a transposed view of a contiguous array, got strides " +
      shape_str(w.strides) + " for shape " + shape_str(w.shape));
}

// Class weights (PyTorch's `weight`) scale loss_t by class_weights[label_t]. They are folded
// into the token weights (the mean then divides by Σ token · class weight, as PyTorch divides by
// Σ weight[label]); without label smoothing that is all. With smoothing, PyTorch's term is
// ε/V · Σ_c weight[c]·(−log p_c), scaled by the token weight alone: the problem then also
// carries the class weights and the token weights (Problem::class_weights).
// What can be checked of class weights from metadata alone (validate_metadata uses it too).
void check_class_weights_meta(const TensorView& cw, int64_t V) {
  if (cw.dtype != DType::kF32) bad(std::string("class_weights must be f32, got ") + dtype_name(cw.dtype));
  if (cw.ndim() != 1 || cw.shape[0] != V)
    bad("class_weights must be [V=" + std::to_string(V) + "], got " + shape_str(cw.shape));
  require_contiguous(cw, "class_weights");
}

// The class weights' length: every class (the partial form's slice holds only some).
int64_t class_count(const Problem& p) { return p.partial() ? p.V_total : p.V; }

// A (relative) label's entry in the class weights: in the partial form they are rotated so that
// entry c is class c of the slice, and a label held elsewhere wraps around.
int64_t class_entry(const Problem& p, int64_t y) {
  if (!p.partial()) return y;
  return ((y % p.V_total) + p.V_total) % p.V_total;
}

void fold_class_weights(const TensorView& cw, const Options& opt, Problem& p) {
  check_class_weights_meta(cw, class_count(p));
  if (p.device.type != DeviceType::kCPU)  // before the device match: the limit is the real reason
    throw Error(ErrorCode::kUnsupported, kName + ": class_weights are supported for host inputs only (for now)");
  require_device(cw, p.device, "class_weights");
  require_data(cw, "class_weights");
  const auto* c = static_cast<const float*>(cw.data);
  double sum = 0.0;
  for (int64_t v = 0; v < class_count(p); ++v) {
    if (!(c[v] >= 0.0f) || !std::isfinite(c[v]))
      bad("class_weights must be finite and >= 0, got " + std::to_string(c[v]) + " at class " + std::to_string(v));
    sum += c[v];
  }
  auto combined = std::shared_ptr<float[]>(new float[static_cast<size_t>(std::max<int64_t>(p.B, 1))]);
  for (int64_t t = 0; t < p.B; ++t) {
    const int64_t y = p.label(t);
    combined[t] = y == p.ignore_index ? 0.0f : p.weight(t) * c[class_entry(p, y)];
  }
  if (opt.label_smoothing > 0.0) {
    p.class_weights = c;
    p.token_weights = p.weights;  // the caller's (or null)
    p.class_weight_sum = sum;
  }
  p.weights = combined.get();
  p.keep = combined;
}

// The vocab-parallel partial form (Options::vocab_total): the slice and the ignore label.
void set_partial(const Options& opt, Problem& p) {
  if (opt.vocab_total < p.V)
    bad("vocab_total (" + std::to_string(opt.vocab_total) + ") must be 0 (off) or at least the slice's V=" +
        std::to_string(p.V));
  if (opt.ignore_index > -opt.vocab_total && opt.ignore_index < opt.vocab_total)
    bad("ignore_index (" + std::to_string(opt.ignore_index) + ") must lie outside (-vocab_total, vocab_total) = (" +
        std::to_string(-opt.vocab_total) + ", " + std::to_string(opt.vocab_total) +
        ") in the partial form, where labels are relative to the slice");
  p.V_total = opt.vocab_total;
}

void check_relative_labels(const Problem& p) {
  for (int64_t t = 0; t < p.B; ++t) {
    const int64_t y = p.label(t);
    if (y != p.ignore_index && (y <= -p.V_total || y >= p.V_total))
      bad("label " + std::to_string(y) + " at token " + std::to_string(t) + " is outside (-vocab_total, vocab_total) = (" +
          std::to_string(-p.V_total) + ", " + std::to_string(p.V_total) + ") and is not ignore_index (" +
          std::to_string(p.ignore_index) + ")");
  }
}

Problem normalize(const Inputs& in, const Options& opt) {
  const TensorView& x = in.x;
  if (!is_float(x.dtype)) bad(std::string("x must be f32, bf16 or f16, got ") + dtype_name(x.dtype));
  if (x.ndim() < 1) bad("x must have at least one dimension [..., H], got a 0-d tensor");
  require_contiguous(x, "x");
  require_data(x, "x");
  Problem p;
  p.device = x.device;
  p.dtype = x.dtype;
  p.H = x.shape.back();
  if (p.H < 1) bad("x has hidden size H=0");
  p.B = x.numel() / p.H;
  p.x = x.data;

  const TensorView& w = in.w;
  if (w.dtype != x.dtype)
    bad(std::string("w dtype ") + dtype_name(w.dtype) + " differs from x dtype " + dtype_name(x.dtype));
  require_device(w, p.device, "w");
  p.layout = resolve_w_layout(w, p.H, opt.w_layout, &p.V);
  if (p.V < 1) bad("vocabulary size V must be >= 1, got w " + shape_str(w.shape));
  require_data(w, "w");
  p.w = w.data;

  if (in.bias) {
    const TensorView& b = *in.bias;
    if (!is_float(b.dtype)) bad(std::string("bias must be f32, bf16 or f16, got ") + dtype_name(b.dtype));
    if (b.ndim() != 1 || b.shape[0] != p.V)
      bad("bias must be [V=" + std::to_string(p.V) + "], got " + shape_str(b.shape));
    require_device(b, p.device, "bias");
    require_contiguous(b, "bias");
    require_data(b, "bias");
    p.bias = b.data;
    p.bias_dtype = b.dtype;
  }

  const Shape lead(x.shape.begin(), x.shape.end() - 1);
  const TensorView& l = in.labels;
  if (!is_integer(l.dtype)) bad(std::string("labels must be i32 or i64, got ") + dtype_name(l.dtype));
  if (l.shape != lead)
    bad("labels shape " + shape_str(l.shape) + " does not match x's leading axes " + shape_str(lead));
  require_device(l, p.device, "labels");
  require_contiguous(l, "labels");
  require_data(l, "labels");
  p.labels = l.data;
  p.label_dtype = l.dtype;

  if (in.token_weights) {
    const TensorView& t = *in.token_weights;
    if (t.dtype != DType::kF32) bad(std::string("token_weights must be f32, got ") + dtype_name(t.dtype));
    if (t.shape != lead)
      bad("token_weights shape " + shape_str(t.shape) + " does not match x's leading axes " + shape_str(lead));
    require_device(t, p.device, "token_weights");
    require_contiguous(t, "token_weights");
    require_data(t, "token_weights");
    p.weights = static_cast<const float*>(t.data);
  }

  if (!(opt.label_smoothing >= 0.0 && opt.label_smoothing <= 1.0))
    bad("label_smoothing must be in [0, 1], got " + std::to_string(opt.label_smoothing));
  if (!(opt.z_loss_weight >= 0.0) || !std::isfinite(opt.z_loss_weight))
    bad("z_loss_weight must be finite and >= 0, got " + std::to_string(opt.z_loss_weight));
  if (!(opt.soft_cap >= 0.0) || !std::isfinite(opt.soft_cap))
    bad("soft_cap must be finite and >= 0 (0 disables it), got " + std::to_string(opt.soft_cap));
  p.reduction = opt.reduction;
  p.ignore_index = opt.ignore_index;
  p.label_smoothing = opt.label_smoothing;
  p.z_loss_weight = opt.z_loss_weight;
  p.soft_cap = opt.soft_cap;
  p.want_argmax = opt.return_argmax;
  p.stream = opt.stream;
  p.memory_budget = opt.memory_budget;
  p.num_threads = resolve_num_threads(opt.num_threads);

  if (opt.vocab_total != 0) set_partial(opt, p);
  // Label range (host labels; a device backend checks device labels itself).
  if (p.device.type == DeviceType::kCPU && p.partial()) {
    check_relative_labels(p);
  } else if (p.device.type == DeviceType::kCPU) {
    for (int64_t t = 0; t < p.B; ++t) {
      const int64_t y = p.label(t);
      if (y != p.ignore_index && (y < 0 || y >= p.V))
        bad("label " + std::to_string(y) + " at token " + std::to_string(t) + " is outside [0, V=" +
            std::to_string(p.V) + ") and is not ignore_index (" + std::to_string(p.ignore_index) + ")");
    }
  }
  if (in.class_weights) fold_class_weights(*in.class_weights, opt, p);  // after the label check
  if (opt.check_finite) {
    if (!all_finite(x)) bad("x contains NaN or Inf");
    if (!all_finite(w)) bad("w contains NaN or Inf");
    if (in.bias && !all_finite(*in.bias)) bad("bias contains NaN or Inf");
    if (in.token_weights && !all_finite(*in.token_weights)) bad("token_weights contain NaN or Inf");
  }
  return p;
}

Shape loss_shape(const Inputs& in, Reduction r) {
  if (r != Reduction::kNone) return {};
  return Shape(in.x.shape.begin(), in.x.shape.end() - 1);
}

void check_output(const TensorView& t, DType dtype, const Shape& shape, const Device& dev,
                  const char* what) {
  if (t.dtype != dtype)
    bad(std::string(what) + " must be " + dtype_name(dtype) + ", got " + dtype_name(t.dtype));
  if (t.shape != shape) bad(std::string(what) + " must have shape " + shape_str(shape) + ", got " + shape_str(t.shape));
  require_device(t, dev, what);
  require_contiguous(t, what);
  require_data(t, what);
}

ForwardOut check_forward_outputs(const Inputs& in, const Problem& p, const ForwardOutputs& out) {
  const Shape lead(in.x.shape.begin(), in.x.shape.end() - 1);
  check_output(out.loss, DType::kF32, loss_shape(in, p.reduction), p.device, "loss");
  check_output(out.lse, DType::kF32, lead, p.device, "lse");
  ForwardOut f;
  f.loss = static_cast<float*>(out.loss.data);
  f.lse = static_cast<float*>(out.lse.data);
  if (p.want_argmax) {
    if (!out.argmax) bad("return_argmax is set but no argmax output was given");
    check_output(*out.argmax, DType::kI64, lead, p.device, "argmax");
    f.argmax = static_cast<int64_t*>(out.argmax->data);
  }
  auto host_only = [&](const TensorView& t, const char* what) {
    if (t.device.type != DeviceType::kCPU)
      throw Error(ErrorCode::kUnsupported, kName + ": the " + what + " output is supported in host memory only (for now)");
  };
  if (out.z_loss) {
    host_only(*out.z_loss, "z_loss");
    check_output(*out.z_loss, DType::kF32, loss_shape(in, p.reduction), out.z_loss->device, "z_loss");
  }
  if (out.accuracy) {
    host_only(*out.accuracy, "accuracy");
    check_output(*out.accuracy, DType::kF32, Shape{}, out.accuracy->device, "accuracy");
    if (p.device.type != DeviceType::kCPU)
      throw Error(ErrorCode::kUnsupported, kName + ": the accuracy output needs host inputs (for now)");
  }
  if (out.z_loss && p.device.type != DeviceType::kCPU)
    throw Error(ErrorCode::kUnsupported, kName + ": the z_loss output needs host inputs (for now)");
  return f;
}

// Token accuracy needs the argmax: when the caller did not ask for it, the forward writes it
// into scratch (the backends compute it in the same pass as the statistics: no extra pass).
struct ArgmaxScratch {
  Tensor t;
};
void want_argmax_for_accuracy(const ForwardOutputs& out, Problem& p, ForwardOut& fo, ArgmaxScratch& s) {
  if (!out.accuracy || p.want_argmax) return;
  s.t = Tensor::empty(DType::kI64, {p.B}, p.device);
  p.want_argmax = true;
  fo.argmax = s.t.data_as<int64_t>();
}

// z_loss and accuracy from the forward's lse and argmax (host; checked by check_forward_outputs).
// Neither asked for: nothing is read, so device data (labels, lse) is never touched on the host
// (the first GPU run segfaulted here on every cuda call).
void write_metrics(const Problem& p, const ForwardOut& fo, const ForwardOutputs& out) {
  if (!out.z_loss && !out.accuracy) return;
  double zsum = 0.0, denom = 0.0;
  int64_t counted = 0, correct = 0;
  for (int64_t t = 0; t < p.B; ++t) {
    const int64_t y = p.label(t);
    const bool ign = y == p.ignore_index;
    const double z = ign ? 0.0 : static_cast<double>(p.weight(t)) * p.z_loss_weight * fo.lse[t] * fo.lse[t];
    if (out.z_loss && p.reduction == Reduction::kNone) static_cast<float*>(out.z_loss->data)[t] = static_cast<float>(z);
    zsum += z;
    if (ign) continue;
    denom += p.weight(t);
    ++counted;
    if (fo.argmax) correct += fo.argmax[t] == y;
  }
  if (out.z_loss && p.reduction != Reduction::kNone) {
    const double v = p.reduction == Reduction::kSum ? zsum : (denom == 0.0 ? 0.0 : zsum / denom);
    *static_cast<float*>(out.z_loss->data) = static_cast<float>(v);
  }
  if (out.accuracy)
    *static_cast<float*>(out.accuracy->data) =
        counted == 0 ? 0.0f : static_cast<float>(static_cast<double>(correct) / static_cast<double>(counted));
}

void check_grad_dtype(const TensorView& g, DType input, const char* what) {
  if (g.dtype != DType::kF32 && g.dtype != input)
    bad(std::string(what) + " must be f32 or " + dtype_name(input) + ", got " + dtype_name(g.dtype));
}

GradOut check_gradients(const Inputs& in, const Problem& p, const Gradients& g) {
  GradOut o;
  check_grad_dtype(g.dx, in.x.dtype, "dx");
  if (g.dx.shape != in.x.shape) bad("dx must have x's shape " + shape_str(in.x.shape) + ", got " + shape_str(g.dx.shape));
  require_device(g.dx, p.device, "dx");
  require_contiguous(g.dx, "dx");
  require_data(g.dx, "dx");
  o.dx = g.dx.data;
  o.dx_dtype = g.dx.dtype;

  check_grad_dtype(g.dw, in.w.dtype, "dw");
  if (g.dw.shape != in.w.shape || g.dw.strides != in.w.strides)
    bad("dw must have w's shape and layout " + shape_str(in.w.shape) + " strides " + shape_str(in.w.strides) +
        ", got " + shape_str(g.dw.shape) + " strides " + shape_str(g.dw.strides));
  require_device(g.dw, p.device, "dw");
  require_data(g.dw, "dw");
  o.dw = g.dw.data;
  o.dw_dtype = g.dw.dtype;

  if (in.bias) {
    if (!g.dbias) bad("bias is given, so dbias must be given too");
    check_grad_dtype(*g.dbias, in.bias->dtype, "dbias");
    if (g.dbias->shape != in.bias->shape) bad("dbias must have bias's shape " + shape_str(in.bias->shape));
    require_device(*g.dbias, p.device, "dbias");
    require_contiguous(*g.dbias, "dbias");
    require_data(*g.dbias, "dbias");
    o.dbias = g.dbias->data;
    o.dbias_dtype = g.dbias->dtype;
  } else if (g.dbias) {
    bad("dbias is given but there is no bias");
  }
  return o;
}

const float* check_grad_loss(const Inputs& in, const Problem& p, const TensorView& g) {
  const Shape want = loss_shape(in, p.reduction);
  if (g.dtype != DType::kF32) bad(std::string("grad_loss must be f32, got ") + dtype_name(g.dtype));
  const bool scalar_ok = p.reduction != Reduction::kNone && g.numel() == 1 && g.ndim() <= 1;
  if (g.shape != want && !scalar_ok)
    bad("grad_loss must have shape " + shape_str(want) + " for reduction=" + reduction_name(p.reduction) +
        ", got " + shape_str(g.shape));
  require_device(g, p.device, "grad_loss");
  require_contiguous(g, "grad_loss");
  require_data(g, "grad_loss");
  if (!all_finite(g)) bad("grad_loss contains NaN or Inf");
  return static_cast<const float*>(g.data);
}

// dw may be a transposed view of a contiguous array; zero its memory either way.
void zero_fill_dw(const TensorView& dw) {
  zero_fill(TensorView(dw.data, dw.dtype, {dw.numel()}, dw.device));
}

int64_t pow2_class(int64_t x) {
  int64_t c = 1;
  while (c < x) c *= 2;
  return c;
}

// What the autotune-on-miss check compares between candidates (the raw outputs of `q`; null
// ones are left out): the forward's statistics, the gradients; never the argmax (a near-tie may
// flip with the summation order).
std::vector<tune::Buffer> checked(const Problem& q, const ForwardOut* f, const GradOut* g) {
  std::vector<tune::Buffer> o;
  const Shape rows{q.B};
  if (f)
    o.insert(o.end(), {{"loss", f->loss, DType::kF32, {q.reduction == Reduction::kNone ? q.B : 1}},
                       {"lse", f->lse, DType::kF32, rows},
                       {"label_logit", f->label_logit, DType::kF32, rows},
                       {"logit_sum", f->logit_sum, DType::kF32, rows}});
  if (g)
    o.insert(o.end(), {{"dx", g->dx, g->dx_dtype, {q.B, q.H}},
                       {"dw", g->dw, g->dw_dtype, {q.H * q.V}},
                       {"dbias", g->dbias, g->dbias_dtype, {q.V}}});
  return o;
}

// The block sizes of a call on `impl` (tuning.cc): the call's own (validated by impl before
// anything is written, used as given), else the tuned table's or an autotuned result (timing
// `run` into the call's `outputs`), clamped to the shape, else impl's default for this problem.
// B keys the choice by its power-of-two class: the count of kept tokens varies from batch to batch.
BlockSizes block_sizes(const Implementation& impl, const Problem& p, const Options& opt, Pass op,
                       const std::vector<tune::Buffer>& outputs, const std::function<void(const BlockSizes&)>& run) {
  if (opt.block_sizes) impl.validate_block_sizes(*opt.block_sizes);
  tune::DeclaredCall c;
  c.implementation = impl.name();
  c.device = impl.device_type();
  c.dtype = p.dtype;
  c.dims = {pow2_class(p.B), p.H, p.V};
  c.pass = op;
  c.threads = p.num_threads;
  if (opt.block_sizes) c.given = to_params(*opt.block_sizes);
  c.variant = autotune_variant(p);
  c.autotune_on_miss = opt.autotune_on_miss;
  const auto at = [&p](const tune::Params& s) { return sanitize_for_shape(from_params(s), p); };
  const auto once = [&](const tune::Params& s) { run(at(s)); };
  const tune::Choice ch = tune::choose_declared(tuning(impl.name()), c, once, tune::borrowed_outputs(outputs));
  const BlockSizes bs = ch.source == "options"   ? *opt.block_sizes
                        : ch.source == "default" ? impl.default_block_sizes(p)
                                                 : at(ch.params);
  log::debug(kName + ": " + impl.name() + " with block sizes " + bs.str() + " (" + ch.source + ")");
  return bs;
}

// Runs `body(impl, block_sizes)` on the implementation chosen by the dispatch rules.
template <class Body>
std::string dispatch_call(const Problem& p, const Options& opt, Pass op, const std::vector<tune::Buffer>& outputs,
                          Body&& body) {
  return t_last_impl = registry().dispatch_problem(opt.implementation, p, [&](const Implementation& impl) {
    const auto run = [&](const BlockSizes& bs) { body(impl, bs); };
    run(block_sizes(impl, p, opt, op, outputs, run));
  });
}

}  // namespace

const char* reduction_name(Reduction r) noexcept {
  switch (r) {
    case Reduction::kNone: return "none";
    case Reduction::kSum: return "sum";
    case Reduction::kMean: return "mean";
  }
  return "?";
}

Reduction parse_reduction(const std::string& s) {
  if (s == "none") return Reduction::kNone;
  if (s == "sum") return Reduction::kSum;
  if (s == "mean") return Reduction::kMean;
  throw Error(ErrorCode::kInvalidArgument, "unknown reduction '" + s + "' (expected none, sum or mean)");
}

const char* w_layout_name(WLayout l) noexcept {
  switch (l) {
    case WLayout::kAuto: return "auto";
    case WLayout::kHV: return "hv";
    case WLayout::kVH: return "vh";
  }
  return "?";
}

WLayout parse_w_layout(const std::string& s) {
  if (s == "auto") return WLayout::kAuto;
  if (s == "hv") return WLayout::kHV;
  if (s == "vh") return WLayout::kVH;
  throw Error(ErrorCode::kInvalidArgument, "unknown w layout '" + s + "' (expected auto, hv or vh)");
}

const std::string& last_implementation() { return t_last_impl; }

void validate_metadata(const Inputs& in, const Options& opt) {
  // normalize() on copies that claim device memory at a dummy address: device data is never
  // read on the host (no label range, no finiteness scan) and a non-null pointer passes the
  // "has no data" check; every other check runs unchanged, with the same message.
  static char dummy;
  auto meta = [](TensorView v) {
    v.data = &dummy;
    v.device = Device::cuda(0);
    return v;
  };
  Inputs m{meta(in.x), meta(in.w), std::nullopt, meta(in.labels), std::nullopt};
  if (in.bias) m.bias = meta(*in.bias);
  if (in.token_weights) m.token_weights = meta(*in.token_weights);
  Options o = opt;
  o.check_finite = false;
  const Problem p = normalize(m, o);
  if (in.class_weights) check_class_weights_meta(*in.class_weights, class_count(p));
}

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

// Ignored tokens skipped before any GEMM (compact.h) unless the caller asks for every row:
// skip_ignored off, or an argmax output (a prediction for every token, ignored ones included).
std::optional<Compaction> compaction_for(const Problem& p, const Options& opt, bool argmax_wanted = false) {
  return opt.skip_ignored && !argmax_wanted && !p.partial() ? Compaction::make(p) : std::nullopt;
}

void refuse_partial(const Options& opt, const char* what) {
  if (opt.vocab_total != 0)
    bad(std::string(what) + " is not defined in the partial form (vocab_total > 0): use forward_partial, then "
                            "backward with the combined lse");
}

std::string forward(const Inputs& in, const ForwardOutputs& out, const Options& opt) {
  refuse_partial(opt, "forward");
  std::string ran;
  Problem p = normalize(in, opt);
  ForwardOut fo = check_forward_outputs(in, p, out);
  ArgmaxScratch scratch;
  want_argmax_for_accuracy(out, p, fo, scratch);
  std::optional<Compaction> c = compaction_for(p, opt, out.argmax.has_value());
  const Problem& q = c ? c->problem() : p;
  const ForwardOut qo = c ? c->forward_out(fo) : fo;
  if (q.B == 0) {  // empty batch (or every token ignored): zero loss, nothing else to compute
    zero_fill(out.loss);
    ran = t_last_impl = "(empty batch)";
  } else {
    ran = dispatch_call(q, opt, Pass::kForward, checked(q, &qo, nullptr),
                       [&](const Implementation& impl, const BlockSizes& bs) { impl.forward(q, bs, qo); });
  }
  if (c) c->scatter_forward(fo);
  write_metrics(p, fo, out);
  return ran;
}

namespace {

ForwardOut check_partial_outputs(const Inputs& in, const Problem& p, const PartialOutputs& out) {
  const Shape lead(in.x.shape.begin(), in.x.shape.end() - 1);
  ForwardOut f;
  auto f32 = [&](const TensorView& t, const char* what) {
    check_output(t, DType::kF32, lead, p.device, what);
    return static_cast<float*>(t.data);
  };
  f.lse = f32(out.lse, "lse");
  f.label_logit = f32(out.label_logit, "label_logit");
  f.logit_sum = f32(out.logit_sum, "logit_sum");
  if (out.argmax.has_value() != p.want_argmax || out.max_logit.has_value() != p.want_argmax)
    bad("the argmax and max_logit outputs are given exactly when return_argmax is set");
  if (p.want_argmax) {
    check_output(*out.argmax, DType::kI64, lead, p.device, "argmax");
    f.argmax = static_cast<int64_t*>(out.argmax->data);
    f.max_logit = f32(*out.max_logit, "max_logit");
  }
  return f;
}

}  // namespace

std::string forward_partial(const Inputs& in, const PartialOutputs& out, const Options& opt) {
  if (opt.vocab_total == 0) bad("forward_partial needs vocab_total > 0 (the partial form)");
  if (opt.return_z_loss || opt.return_token_accuracy)
    bad("the partial form has no z_loss or accuracy outputs: form them from the combined statistics");
  const Problem p = normalize(in, opt);
  const ForwardOut fo = check_partial_outputs(in, p, out);
  if (p.B == 0) return t_last_impl = "(empty batch)";
  return dispatch_call(p, opt, Pass::kForward, checked(p, &fo, nullptr),
                       [&](const Implementation& impl, const BlockSizes& bs) { impl.forward(p, bs, fo); });
}

namespace {

std::string backward_impl(const Inputs& in, const TensorView& grad_loss, const std::optional<TensorView>& lse,
                          const Gradients& grads, const Options& opt) {
  std::string ran;
  const Problem p = normalize(in, opt);
  if (p.partial() && !lse) bad("the partial form's backward needs the combined (global) lse");
  GradIn gi;
  gi.grad_loss = check_grad_loss(in, p, grad_loss);
  const GradOut go = check_gradients(in, p, grads);
  if (lse) {
    check_output(*lse, DType::kF32, Shape(in.x.shape.begin(), in.x.shape.end() - 1), p.device, "lse");
    gi.lse = static_cast<const float*>(lse->data);
  }
  std::optional<Compaction> c = compaction_for(p, opt);
  const Problem& q = c ? c->problem() : p;
  const GradIn qi = c ? c->grad_in(gi) : gi;
  const GradOut qo = c ? c->grad_out(go) : go;
  if (q.B == 0) {
    zero_fill_dw(grads.dw);
    if (grads.dbias) zero_fill(*grads.dbias);
    ran = t_last_impl = "(empty batch)";
  } else {
    ran = dispatch_call(q, opt, Pass::kBackward, checked(q, nullptr, &qo),
                       [&](const Implementation& impl, const BlockSizes& bs) { impl.backward(q, bs, qi, qo); });
  }
  if (c) c->scatter_backward(go);
  return ran;
}

}  // namespace

std::string backward(const Inputs& in, const TensorView& grad_loss, const Gradients& grads, const Options& opt) {
  return backward_impl(in, grad_loss, std::nullopt, grads, opt);
}

std::string backward(const Inputs& in, const TensorView& grad_loss, const TensorView& lse, const Gradients& grads,
                     const Options& opt) {
  return backward_impl(in, grad_loss, lse, grads, opt);
}

std::string forward_backward(const Inputs& in, const TensorView& grad_loss, const ForwardOutputs& out,
                             const Gradients& grads, const Options& opt) {
  refuse_partial(opt, "forward_backward");
  std::string ran;
  Problem p = normalize(in, opt);
  ForwardOut fo = check_forward_outputs(in, p, out);
  ArgmaxScratch scratch;
  want_argmax_for_accuracy(out, p, fo, scratch);
  GradIn gi;
  gi.grad_loss = check_grad_loss(in, p, grad_loss);
  const GradOut go = check_gradients(in, p, grads);
  std::optional<Compaction> c = compaction_for(p, opt, out.argmax.has_value());
  const Problem& q = c ? c->problem() : p;
  const ForwardOut qfo = c ? c->forward_out(fo) : fo;
  const GradIn qi = c ? c->grad_in(gi) : gi;
  const GradOut qgo = c ? c->grad_out(go) : go;
  if (q.B == 0) {
    zero_fill(out.loss);
    zero_fill_dw(grads.dw);
    if (grads.dbias) zero_fill(*grads.dbias);
    ran = t_last_impl = "(empty batch)";
  } else {
    ran = dispatch_call(q, opt, Pass::kFused, checked(q, &qfo, &qgo), [&](const Implementation& impl, const BlockSizes& bs) {
      impl.forward_backward(q, bs, qi, qfo, qgo);
    });
  }
  if (c) {
    c->scatter_forward(fo);
    c->scatter_backward(go);
  }
  write_metrics(p, fo, out);
  return ran;
}

namespace {

Result make_outputs(const Inputs& in, const Options& opt, bool with_grad) {
  Result r;
  const Device dev = in.x.device;
  check(in.x.ndim() >= 1, ErrorCode::kInvalidArgument, kName + ": x must have at least one dimension");
  const Shape lead(in.x.shape.begin(), in.x.shape.end() - 1);
  r.loss = Tensor::empty(DType::kF32, opt.reduction == Reduction::kNone ? lead : Shape{}, dev);
  r.lse = Tensor::empty(DType::kF32, lead, dev);
  if (opt.return_argmax) r.argmax = Tensor::empty(DType::kI64, lead, dev);
  if (opt.return_z_loss) r.z_loss = Tensor::empty(DType::kF32, opt.reduction == Reduction::kNone ? lead : Shape{}, dev);
  if (opt.return_token_accuracy) r.accuracy = Tensor::empty(DType::kF32, {}, dev);
  if (with_grad) {
    r.dx = Tensor::empty(in.x.dtype, in.x.shape, dev);
    r.dw = Tensor::empty_like_layout(in.w, in.w.dtype);
    if (in.bias) r.dbias = Tensor::empty(in.bias->dtype, in.bias->shape, dev);
  }
  return r;
}

ForwardOutputs views_of(const Result& r) {
  ForwardOutputs o{r.loss.view(), r.lse.view(), std::nullopt};
  if (r.argmax.defined()) o.argmax = r.argmax.view();
  if (r.z_loss.defined()) o.z_loss = r.z_loss.view();
  if (r.accuracy.defined()) o.accuracy = r.accuracy.view();
  return o;
}

}  // namespace

Result compute(const Inputs& in, const Options& opt) {
  Result r = make_outputs(in, opt, false);
  r.implementation = forward(in, views_of(r), opt);
  return r;
}

Result compute_with_grad(const Inputs& in, const Options& opt) {
  Result r = make_outputs(in, opt, true);
  const Shape lead(in.x.shape.begin(), in.x.shape.end() - 1);
  Tensor g = Tensor::empty(DType::kF32, opt.reduction == Reduction::kNone ? lead : Shape{});
  float* gp = g.data_as<float>();
  for (int64_t i = 0; i < g.numel(); ++i) gp[i] = 1.0f;
  if (in.x.device.type != DeviceType::kCPU) g = g.to(in.x.device);
  Gradients grads{r.dx.view(), r.dw.view(), std::nullopt};
  if (r.dbias.defined()) grads.dbias = r.dbias.view();
  r.implementation = forward_backward(in, g.view(), views_of(r), grads, opt);
  return r;
}

}  // namespace tessera::linear_cross_entropy
