// linear_cross_entropy: the public API. Validates every input and output before anything
// runs (an error touches no output), normalizes shapes into a Problem, picks block sizes and
// dispatches with the fallback rules of src/dispatch.
#include <algorithm>
#include <cmath>
#include <functional>

#include "core/env.h"
#include "core/log.h"
#include "dispatch/arg_check.h"
#include "kernels/linear_cross_entropy/compact.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"
#include "tune/bucket.h"
#include "tune/declared.h"

namespace tessera::linear_cross_entropy {
namespace {

const std::string kName = kKernelName;
const dispatch::ArgCheck args{kName, "x"};  // every tensor lives where x does

WLayout resolve_w_layout(const TensorView& w, int64_t H, WLayout requested, int64_t* V) {
  if (w.ndim() != 2) args.fail("w must be 2-D ([H, V] or [V, H]), got " + w.str());
  const int64_t r = w.shape[0], c = w.shape[1];
  bool logical_hv;  // the view's logical shape is [H, V]
  switch (requested) {
    case WLayout::kHV:
      if (r != H) args.fail("w_layout=hv expects w of shape [H=" + std::to_string(H) + ", V], got " + shape_str(w.shape));
      logical_hv = true;
      break;
    case WLayout::kVH:
      if (c != H) args.fail("w_layout=vh expects w of shape [V, H=" + std::to_string(H) + "], got " + shape_str(w.shape));
      logical_hv = false;
      break;
    default:
      if (r == H && c == H)
        args.fail("w is square (" + shape_str(w.shape) + ", H == V): its layout is ambiguous; set w_layout to "
            "hv ([H, V], x @ w) or vh ([V, H], x @ w.T, PyTorch's lm_head.weight)");
      if (r == H)
        logical_hv = true;
      else if (c == H)
        logical_hv = false;
      else
        args.fail("w of shape " + shape_str(w.shape) + " has no dimension equal to H=" + std::to_string(H) +
            " (x is [..., H])");
  }
  *V = logical_hv ? c : r;
  args.need(*V >= 1, "vocabulary size V must be >= 1, got w " + shape_str(w.shape));  // before its strides
  // Memory: row-major of the view, or its transpose (a transposed view of a contiguous array).
  const bool row_major = (w.strides[1] == 1 || c == 1) && (w.strides[0] == c || r == 1);
  const bool col_major = (w.strides[0] == 1 || r == 1) && (w.strides[1] == r || c == 1);
  if (row_major) return logical_hv ? WLayout::kHV : WLayout::kVH;
  if (col_major) return logical_hv ? WLayout::kVH : WLayout::kHV;
  args.fail("w must be contiguous or a transposed view of a contiguous array, got strides " +
      shape_str(w.strides) + " for shape " + shape_str(w.shape));
}

// Class weights (PyTorch's `weight`) scale loss_t by class_weights[label_t]. They are folded
// into the token weights (the mean then divides by Σ token · class weight, as PyTorch divides by
// Σ weight[label]); without label smoothing that is all. With smoothing, PyTorch's term is
// ε/V · Σ_c weight[c]·(−log p_c), scaled by the token weight alone: the problem then also
// carries the class weights and the token weights (Problem::class_weights).
// What can be checked of class weights from metadata alone (validate_metadata uses it too).
void check_class_weights_meta(const TensorView& cw, int64_t V) {
  args.dtype(cw, DType::kF32, "class_weights");
  args.need(cw.ndim() == 1 && cw.shape[0] == V, "class_weights must be [V=" + dispatch::num(V) + "], got " + shape_str(cw.shape));
  args.contiguous(cw, "class_weights");
}

// The class weights' length: every class (the partial form's slice holds only some).
int64_t class_count(const Problem& p) { return p.partial() ? p.V_total : p.V; }

// A (relative) label's entry in the class weights: in the partial form they are rotated so that
// entry c is class c of the slice, and a label held elsewhere wraps around.
int64_t class_entry(const Problem& p, int64_t y) {
  if (!p.partial()) return y;
  return ((y % p.V_total) + p.V_total) % p.V_total;
}

// Σ of the class weights, each finite and >= 0 (host data).
double class_weight_sum(const float* c, int64_t n) {
  double sum = 0.0;
  for (int64_t v = 0; v < n; ++v) {
    args.need(c[v] >= 0.0f && std::isfinite(c[v]),
              "class_weights must be finite and >= 0, got " + std::to_string(c[v]) + " at class " + dispatch::num(v));
    sum += c[v];
  }
  return sum;
}

void fold_class_weights(const TensorView& cw, const Options& opt, Problem& p) {
  check_class_weights_meta(cw, class_count(p));
  if (p.device.type != DeviceType::kCPU)  // before the device match: the limit is the real reason
    throw Error(ErrorCode::kUnsupported, kName + ": class_weights are supported for host inputs only (for now)");
  args.device(cw, p.device, "class_weights");
  args.data(cw, "class_weights");
  const auto* c = static_cast<const float*>(cw.data);
  const double sum = class_weight_sum(c, class_count(p));
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
  args.need(opt.vocab_total >= p.V, "vocab_total (" + dispatch::num(opt.vocab_total) +
                                        ") must be 0 (off) or at least the slice's V=" + dispatch::num(p.V));
  args.need(opt.ignore_index <= -opt.vocab_total || opt.ignore_index >= opt.vocab_total,
            "ignore_index (" + dispatch::num(opt.ignore_index) + ") must lie outside (-vocab_total, vocab_total) = (" +
                dispatch::num(-opt.vocab_total) + ", " + dispatch::num(opt.vocab_total) +
                ") in the partial form, where labels are relative to the slice");
  p.V_total = opt.vocab_total;
}

// Every host label is a class (of the slice's (-vocab_total, vocab_total) in the partial form)
// or ignore_index; a device backend checks device labels itself.
void check_labels(const Problem& p) {
  if (p.device.type != DeviceType::kCPU) return;
  const int64_t lo = p.partial() ? -p.V_total + 1 : 0, hi = p.partial() ? p.V_total : p.V;
  const std::string range = p.partial() ? "(-vocab_total, vocab_total) = (" + dispatch::num(-p.V_total) + ", " +
                                              dispatch::num(p.V_total) + ")"
                                        : "[0, V=" + dispatch::num(p.V) + ")";
  for (int64_t t = 0; t < p.B; ++t) {
    const int64_t y = p.label(t);
    args.need(y == p.ignore_index || (y >= lo && y < hi), "label " + dispatch::num(y) + " at token " + dispatch::num(t) +
                                                               " is outside " + range + " and is not ignore_index (" +
                                                               dispatch::num(p.ignore_index) + ")");
  }
}

Shape lead_of(const Inputs& in) { return Shape(in.x.shape.begin(), in.x.shape.end() - 1); }

// x [..., H] and w (its layout resolved): B, H, V, dtype, device.
Problem normalize_x_w(const Inputs& in, const Options& opt) {
  const TensorView &x = in.x, &w = in.w;
  args.floating(x, "x");
  args.need(x.ndim() >= 1, "x must have at least one dimension [..., H], got a 0-d tensor");
  for (const TensorView* t : {&x, &w})  // a negative size ran on the reference and blamed block sizes on cpu
    args.need(std::all_of(t->shape.begin(), t->shape.end(), [](int64_t n) { return n >= 0; }),
              std::string(t == &x ? "x" : "w") + " has a negative size: " + shape_str(t->shape));
  args.contiguous(x, "x");
  args.data(x, "x");
  Problem p;
  p.device = x.device;
  p.dtype = x.dtype;
  p.H = x.shape.back();
  args.need(p.H >= 1, "x has hidden size H=0");
  p.B = x.numel() / p.H;
  p.x = x.data;
  args.need(w.dtype == x.dtype,
            std::string("w dtype ") + dtype_name(w.dtype) + " differs from x dtype " + dtype_name(x.dtype));
  args.device(w, p.device, "w");
  p.layout = resolve_w_layout(w, p.H, opt.w_layout, &p.V);
  args.data(w, "w");
  p.w = w.data;
  return p;
}

// bias [V], labels and token_weights of x's leading axes.
void normalize_vectors(const Inputs& in, Problem& p) {
  if (in.bias) {
    const TensorView& b = *in.bias;
    args.floating(b, "bias");
    args.need(b.ndim() == 1 && b.shape[0] == p.V, "bias must be [V=" + dispatch::num(p.V) + "], got " + shape_str(b.shape));
    args.plain(b, p.device, "bias");
    p.bias = b.data;
    p.bias_dtype = b.dtype;
  }
  const Shape lead = lead_of(in);
  const TensorView& l = in.labels;
  args.need(is_integer(l.dtype), std::string("labels must be i32 or i64, got ") + dtype_name(l.dtype));
  args.need(l.shape == lead, "labels shape " + shape_str(l.shape) + " does not match x's leading axes " + shape_str(lead));
  args.plain(l, p.device, "labels");
  p.labels = l.data;
  p.label_dtype = l.dtype;
  if (in.token_weights) {
    const TensorView& t = *in.token_weights;
    args.dtype(t, DType::kF32, "token_weights");
    args.need(t.shape == lead,
              "token_weights shape " + shape_str(t.shape) + " does not match x's leading axes " + shape_str(lead));
    args.plain(t, p.device, "token_weights");
    p.weights = static_cast<const float*>(t.data);
  }
}

void normalize_options(const Options& opt, Problem& p) {
  args.need(opt.label_smoothing >= 0.0 && opt.label_smoothing <= 1.0,
            "label_smoothing must be in [0, 1], got " + std::to_string(opt.label_smoothing));
  args.nonnegative_f32(opt.z_loss_weight, "z_loss_weight");  // the cuda rows take it in f32
  args.softcap(opt.softcap, "softcap");
  p.reduction = opt.reduction;
  p.ignore_index = opt.ignore_index;
  p.label_smoothing = opt.label_smoothing;
  p.z_loss_weight = opt.z_loss_weight;
  p.softcap = opt.softcap;
  p.want_argmax = opt.return_argmax;
  p.stream = opt.stream;
  p.memory_budget = opt.memory_budget;
  // The logits' GEMM sizes the thread count (tessera/exec.h): 2·B·H·V (the backward's two more GEMMs
  // triple it).
  p.num_threads = resolve_num_threads(opt.num_threads, 2.0 * static_cast<double>(p.B) * static_cast<double>(p.H) *
                                                           static_cast<double>(p.V));
  if (opt.vocab_total != 0) set_partial(opt, p);
}

Problem normalize(const Inputs& in, const Options& opt) {
  Problem p = normalize_x_w(in, opt);
  normalize_vectors(in, p);
  normalize_options(opt, p);
  check_labels(p);
  if (in.class_weights) fold_class_weights(*in.class_weights, opt, p);  // after the label check
  if (opt.check_finite) {
    args.finite(in.x, "x");
    args.finite(in.w, "w");
    if (in.bias) args.finite(*in.bias, "bias");
    if (in.token_weights) args.need(dispatch::all_finite(*in.token_weights), "token_weights contain NaN or Inf");
  }
  return p;
}

Shape loss_shape(const Inputs& in, Reduction r) { return r == Reduction::kNone ? lead_of(in) : Shape{}; }

ForwardOut check_forward_outputs(const Inputs& in, const Problem& p, const ForwardOutputs& out) {
  args.tensor(out.loss, p.device, loss_shape(in, p.reduction), DType::kF32, "loss");
  args.tensor(out.lse, p.device, lead_of(in), DType::kF32, "lse");
  ForwardOut f{static_cast<float*>(out.loss.data), static_cast<float*>(out.lse.data)};
  if (p.want_argmax) {
    args.need(out.argmax.has_value(), "return_argmax is set but no argmax output was given");
    args.tensor(*out.argmax, p.device, lead_of(in), DType::kI64, "argmax");
    f.argmax = static_cast<int64_t*>(out.argmax->data);
  }
  const auto host_only = [&](const std::optional<TensorView>& t, const char* what, const Shape& shape) {
    if (!t) return;
    if (t->device.type != DeviceType::kCPU)
      throw Error(ErrorCode::kUnsupported, kName + ": the " + what + " output is supported in host memory only (for now)");
    args.tensor(*t, t->device, shape, DType::kF32, what);
    if (p.device.type != DeviceType::kCPU)
      throw Error(ErrorCode::kUnsupported, kName + ": the " + what + " output needs host inputs (for now)");
  };
  host_only(out.z_loss, "z_loss", loss_shape(in, p.reduction));
  host_only(out.accuracy, "accuracy", Shape{});
  return f;
}

// Token accuracy needs the argmax: when the caller did not ask for it, the forward writes it
// into scratch (the backends compute it in the same pass as the statistics: no extra pass).
void want_argmax_for_accuracy(const ForwardOutputs& out, Problem& p, ForwardOut& fo, Tensor& scratch) {
  if (!out.accuracy || p.want_argmax) return;
  scratch = Tensor::empty(DType::kI64, {p.B}, p.device);
  p.want_argmax = true;
  fo.argmax = scratch.data_as<int64_t>();
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

// Each gradient may be left out (Gradients): its pointer stays null and its work is skipped.
GradOut check_gradients(const Inputs& in, const Problem& p, const Gradients& g) {
  GradOut o;
  if (dispatch::given(g.dx)) {
    args.output(g.dx, in.x.dtype, in.x.shape, p.device, "dx");
    o.dx = g.dx.data, o.dx_dtype = g.dx.dtype;
  }
  if (dispatch::given(g.dw)) {
    // dw in w's layout (a transposed view stays one): f32 or w's dtype, w's shape and strides.
    args.need(g.dw.dtype == DType::kF32 || g.dw.dtype == in.w.dtype,
              std::string("dw must be f32 or ") + dtype_name(in.w.dtype) + ", got " + dtype_name(g.dw.dtype));
    args.need(g.dw.shape == in.w.shape && g.dw.strides == in.w.strides,
              "dw must have w's shape and layout " + shape_str(in.w.shape) + " strides " + shape_str(in.w.strides) +
                  ", got " + shape_str(g.dw.shape) + " strides " + shape_str(g.dw.strides));
    args.device(g.dw, p.device, "dw");
    args.data(g.dw, "dw");
    o.dw = g.dw.data, o.dw_dtype = g.dw.dtype;
  }
  args.need(!g.dbias || in.bias, "dbias is given but there is no bias");
  if (g.dbias) {
    args.output(*g.dbias, in.bias->dtype, in.bias->shape, p.device, "dbias");
    o.dbias = g.dbias->data;
    o.dbias_dtype = g.dbias->dtype;
  }
  return o;
}

const float* check_grad_loss(const Inputs& in, const Problem& p, const TensorView& g) {
  const Shape want = loss_shape(in, p.reduction);
  args.dtype(g, DType::kF32, "grad_loss");
  const bool scalar_ok = p.reduction != Reduction::kNone && g.numel() == 1 && g.ndim() <= 1;
  args.need(g.shape == want || scalar_ok, "grad_loss must have shape " + shape_str(want) + " for reduction=" +
                                              reduction_name(p.reduction) + ", got " + shape_str(g.shape));
  args.plain(g, p.device, "grad_loss");
  args.finite(g, "grad_loss");
  return static_cast<const float*>(g.data);
}

// dw may be a transposed view of a contiguous array; zero its memory either way.
void zero_fill_dw(const TensorView& dw) {
  zero_fill(TensorView(dw.data, dw.dtype, {dw.numel()}, dw.device));
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
BlockSizes block_sizes(const Implementation& impl, const Problem& p, const Options& opt, Pass op, const GradOut* g,
                       const std::vector<tune::Buffer>& outputs, const std::function<void(const BlockSizes&)>& run) {
  if (opt.block_sizes) impl.validate_block_sizes(*opt.block_sizes);
  const tune::DeclaredCall c{
      .implementation = impl.name(),
      .device = impl.device_type(),
      .dtype = p.dtype,
      .dims = {tune::pow2_class(p.B), p.H, p.V},
      .pass = op,
      .threads = p.num_threads,
      .given = opt.block_sizes ? to_params(*opt.block_sizes) : tune::Params{},
      .variant = autotune_variant(p, g),
      .autotune_on_miss = opt.autotune_on_miss,
      .default_sizes = to_params(impl.default_block_sizes(p))};  // what runs (and is reported) by default
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
std::string dispatch_call(const Problem& p, const Options& opt, Pass op, const GradOut* g,
                          const std::vector<tune::Buffer>& outputs, Body&& body) {
  return registry().dispatch_problem(opt.implementation, p, [&](const Implementation& impl) {
    const auto run = [&](const BlockSizes& bs) { body(impl, bs); };
    run(block_sizes(impl, p, opt, op, g, outputs, run));
  });
}

// A pass on checked views, as the implementation gets it: ignored tokens skipped before any GEMM
// (compact.h) unless the caller asks for every row (skip_ignored off, or an argmax output: a
// prediction for every token); an empty batch (or every token ignored) runs nothing and zeroes
// loss, dw and dbias; compacted outputs are scattered back.
struct Call {
  Problem p;
  ForwardOut fo = {};
  GradIn gi = {};
  GradOut go = {};
  std::optional<TensorView> loss = {}, dw = {}, dbias = {};  // zeroed for an empty batch
};

// The gradients for an implementation that computes all of them (skips_gradients() false: the
// reference): the ones the caller left out are written into scratch of their size on the
// problem's device (the explicit fallback: the same results for the others, no time saved). dw
// and dbias in f32, so that a backend needs no f32 accumulator beside them.
struct AllGradients {
  GradOut go;
  Tensor dx, dw, dbias;
  AllGradients(const Problem& q, const GradOut& given, bool fill) : go(given) {
    if (!fill) return;
    if (!go.dx) dx = Tensor::empty(q.dtype, {q.B, q.H}, q.device), go.dx = dx.data(), go.dx_dtype = q.dtype;
    if (!go.dw) dw = Tensor::empty(DType::kF32, {q.H * q.V}, q.device), go.dw = dw.data(), go.dw_dtype = DType::kF32;
    if (q.bias && !go.dbias)
      dbias = Tensor::empty(DType::kF32, {q.V}, q.device), go.dbias = dbias.data(), go.dbias_dtype = DType::kF32;
  }
};

// A gradient pass that asks for no gradient (every input frozen) is the forward alone (fused) or
// nothing at all (backward): phase B's softmax gradient would feed no product.
std::string run(const Call& k, const Options& opt, Pass pass, bool every_row) {
  const bool none_wanted = !k.go.dx && !k.go.dw && !k.go.dbias;
  if (pass == Pass::kBackward && none_wanted) return "(no gradient asked for)";
  if (pass == Pass::kFused && none_wanted) pass = Pass::kForward;
  const bool fwd = pass != Pass::kBackward, bwd = pass != Pass::kForward;
  std::optional<Compaction> c =
      opt.skip_ignored && !every_row && !k.p.partial() ? Compaction::make(k.p) : std::nullopt;
  const Problem& q = c ? c->problem() : k.p;
  const ForwardOut fo = c && fwd ? c->forward_out(k.fo) : k.fo;
  const GradIn gi = c && bwd ? c->grad_in(k.gi) : k.gi;
  const GradOut go = c && bwd ? c->grad_out(k.go) : k.go;
  std::string ran = "(empty batch)";
  registry().check_names(opt.implementation, q.device.type);  // also when nothing runs
  if (q.B == 0) {
    // Block sizes the call gives are checked by the implementation that would run, as in a
    // non-empty call: a bad setting must not pass on an empty batch and fail on the next.
    if (opt.block_sizes)
      registry().dispatch_problem(opt.implementation, q, [&](const Implementation& impl) {
        impl.validate_block_sizes(*opt.block_sizes);
      });
    synchronize(q.device, q.stream);  // the caller's queued work first (zero_fill is not on its stream)
    if (k.loss) zero_fill(*k.loss);
    if (k.dw) zero_fill_dw(*k.dw);
    if (k.dbias) zero_fill(*k.dbias);
  } else {
    ran = dispatch_call(q, opt, pass, bwd ? &go : nullptr, checked(q, fwd ? &fo : nullptr, bwd ? &go : nullptr),
                        [&](const Implementation& impl, const BlockSizes& bs) {
                          const AllGradients all(q, go, bwd && !impl.skips_gradients());
                          if (!bwd) impl.forward(q, bs, fo);
                          if (!fwd) impl.backward(q, bs, gi, all.go);
                          if (fwd && bwd) impl.forward_backward(q, bs, gi, fo, all.go);
                        });
  }
  if (c && fwd) c->scatter_forward(k.fo);
  if (c && bwd) c->scatter_backward(k.go);
  return ran;
}

}  // namespace

namespace {
// The names of an enum's values, in order; parse throws "unknown <what> 's' (expected <list>)".
template <class E, size_t N>
E parse_name(const char* const (&names)[N], const std::string& s, const char* what, const char* list) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<E>(i);
  throw Error(ErrorCode::kInvalidArgument, std::string("unknown ") + what + " '" + s + "' (expected " + list + ")");
}
constexpr const char* kReductions[] = {"none", "sum", "mean"};  // Reduction's order
constexpr const char* kLayouts[] = {"auto", "hv", "vh"};        // WLayout's order
}  // namespace

const char* reduction_name(Reduction r) noexcept { return size_t(r) < 3 ? kReductions[size_t(r)] : "?"; }
Reduction parse_reduction(const std::string& s) {
  return parse_name<Reduction>(kReductions, s, "reduction", "none, sum or mean");
}
const char* w_layout_name(WLayout l) noexcept { return size_t(l) < 3 ? kLayouts[size_t(l)] : "?"; }
WLayout parse_w_layout(const std::string& s) { return parse_name<WLayout>(kLayouts, s, "w layout", "auto, hv or vh"); }

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

void refuse_partial(const Options& opt, const char* what) {
  if (opt.vocab_total != 0)
    args.fail(std::string(what) + " is not defined in the partial form (vocab_total > 0): use forward_partial, then "
                            "backward with the combined lse");
}

namespace {
// No output shares memory with an input, an upstream gradient or another output: the backends read
// x and w after writing outputs (dx over x), an autotune sweep writes outputs before the call it
// keeps. Absent views (TensorView{}) span nothing.
using Named = dispatch::ArgCheck::Named;
const TensorView kNone;
void check_apart(const Inputs& in, const Named& outputs, Named reads = {}) {
  reads.insert(reads.end(), {{"x", in.x}, {"w", in.w}, {"labels", in.labels}, {"bias", in.bias.value_or(kNone)},
                             {"token_weights", in.token_weights.value_or(kNone)},
                             {"class_weights", in.class_weights.value_or(kNone)}});
  args.apart(outputs, reads);
}
Named outputs_of(const ForwardOutputs& o) {
  return {{"loss", o.loss}, {"lse", o.lse}, {"argmax", o.argmax.value_or(kNone)}, {"z_loss", o.z_loss.value_or(kNone)},
          {"accuracy", o.accuracy.value_or(kNone)}};
}
Named outputs_of(const Gradients& g) { return {{"dx", g.dx}, {"dw", g.dw}, {"dbias", g.dbias.value_or(kNone)}}; }
}  // namespace

std::string forward(const Inputs& in, const ForwardOutputs& out, const Options& opt) {
  refuse_partial(opt, "forward");
  Call k{normalize(in, opt)};
  k.fo = check_forward_outputs(in, k.p, out);
  check_apart(in, outputs_of(out));
  Tensor scratch;
  want_argmax_for_accuracy(out, k.p, k.fo, scratch);
  k.loss = out.loss;
  const std::string ran = run(k, opt, Pass::kForward, out.argmax.has_value());
  write_metrics(k.p, k.fo, out);
  return ran;
}

namespace {

ForwardOut check_partial_outputs(const Inputs& in, const Problem& p, const PartialOutputs& out) {
  ForwardOut f;
  const auto f32 = [&](const TensorView& t, const char* what) {
    args.tensor(t, p.device, lead_of(in), DType::kF32, what);
    return static_cast<float*>(t.data);
  };
  f.lse = f32(out.lse, "lse");
  f.label_logit = f32(out.label_logit, "label_logit");
  f.logit_sum = f32(out.logit_sum, "logit_sum");
  args.need(out.argmax.has_value() == p.want_argmax && out.max_logit.has_value() == p.want_argmax,
            "the argmax and max_logit outputs are given exactly when return_argmax is set");
  if (p.want_argmax) {
    args.tensor(*out.argmax, p.device, lead_of(in), DType::kI64, "argmax");
    f.argmax = static_cast<int64_t*>(out.argmax->data);
    f.max_logit = f32(*out.max_logit, "max_logit");
  }
  return f;
}

}  // namespace

std::string forward_partial(const Inputs& in, const PartialOutputs& out, const Options& opt) {
  args.need(opt.vocab_total != 0, "forward_partial needs vocab_total > 0 (the partial form)");
  if (opt.return_z_loss || opt.return_token_accuracy)
    args.fail("the partial form has no z_loss or accuracy outputs: form them from the combined statistics");
  Call k{normalize(in, opt)};
  k.fo = check_partial_outputs(in, k.p, out);
  check_apart(in, {{"lse", out.lse}, {"label_logit", out.label_logit}, {"logit_sum", out.logit_sum},
                   {"argmax", out.argmax.value_or(kNone)}, {"max_logit", out.max_logit.value_or(kNone)}});
  return run(k, opt, Pass::kForward, true);
}

namespace {

// The gradients' part of a call: grad_loss and the gradient outputs checked, dw and dbias zeroed
// for an empty batch.
void check_backward(const Inputs& in, const TensorView& grad_loss, const Gradients& grads, Call& k) {
  k.gi.grad_loss = check_grad_loss(in, k.p, grad_loss);
  k.go = check_gradients(in, k.p, grads);
  if (dispatch::given(grads.dw)) k.dw = grads.dw;
  k.dbias = grads.dbias;
}

std::string backward_impl(const Inputs& in, const TensorView& grad_loss, const std::optional<TensorView>& lse,
                          const Gradients& grads, const Options& opt) {
  Call k{normalize(in, opt)};
  args.need(!k.p.partial() || lse, "the partial form's backward needs the combined (global) lse");
  check_backward(in, grad_loss, grads, k);
  if (lse) {
    args.tensor(*lse, k.p.device, lead_of(in), DType::kF32, "lse");
    k.gi.lse = static_cast<const float*>(lse->data);
  }
  check_apart(in, outputs_of(grads), {{"grad_loss", grad_loss}, {"lse", lse.value_or(kNone)}});
  return run(k, opt, Pass::kBackward, false);
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
  Call k{normalize(in, opt)};
  k.fo = check_forward_outputs(in, k.p, out);
  Tensor scratch;
  want_argmax_for_accuracy(out, k.p, k.fo, scratch);
  check_backward(in, grad_loss, grads, k);
  Named outs = outputs_of(out), gs = outputs_of(grads);
  outs.insert(outs.end(), gs.begin(), gs.end());
  check_apart(in, outs, {{"grad_loss", grad_loss}});
  k.loss = out.loss;
  const std::string ran = run(k, opt, Pass::kFused, out.argmax.has_value());
  write_metrics(k.p, k.fo, out);
  return ran;
}

namespace {

Result make_outputs(const Inputs& in, const Options& opt, bool with_grad) {
  Result r;
  const Device dev = in.x.device;
  args.need(in.x.ndim() >= 1, "x must have at least one dimension");
  r.loss = Tensor::empty(DType::kF32, loss_shape(in, opt.reduction), dev);
  r.lse = Tensor::empty(DType::kF32, lead_of(in), dev);
  if (opt.return_argmax) r.argmax = Tensor::empty(DType::kI64, lead_of(in), dev);
  if (opt.return_z_loss) r.z_loss = Tensor::empty(DType::kF32, loss_shape(in, opt.reduction), dev);
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
  Tensor g = Tensor::empty(DType::kF32, loss_shape(in, opt.reduction));
  float* gp = g.data_as<float>();
  for (int64_t i = 0; i < g.numel(); ++i) gp[i] = 1.0f;
  if (in.x.device.type != DeviceType::kCPU) g = g.to(in.x.device);
  Gradients grads{r.dx.view(), r.dw.view(), std::nullopt};
  if (r.dbias.defined()) grads.dbias = r.dbias.view();
  r.implementation = forward_backward(in, g.view(), views_of(r), grads, opt);
  return r;
}

}  // namespace tessera::linear_cross_entropy
