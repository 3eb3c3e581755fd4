// attention: the public API. Validates every input and output before anything runs (an error
// touches no output), normalizes the dense and varlen forms into one Problem, picks block sizes
// and dispatches with the fallback rules of src/dispatch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "dispatch/arg_check.h"
#include "dispatch/tensor_rules.h"
#include "dispatch/work.h"
#include "kernels/attention/impl.h"
#include "tessera/attention.h"
#include "tessera/error.h"
#include "tune/declared.h"

namespace tessera::attention {
namespace {

using dispatch::all_finite;
using dispatch::num;
const dispatch::ArgCheck args{kKernelName, "q"};

// Each form's tensors by their dims; alibi_slopes ([Hq] or [N, Hq]) is checked apart.
const dispatch::TensorRules kDense{kKernelName,
                                   {{"q", "B,Sq,Hq,D", "float"},
                                    {"k", "B,Sk,Hkv,D", "=q"},
                                    {"v", "B,Sk,Hkv,Dv", "=q"},
                                    {"segment_ids_q", "B,Sq", "i32"},
                                    {"segment_ids_k", "B,Sk", "i32"}}};
const dispatch::TensorRules kVarlen{kKernelName,
                                    {{"q", "Tq,Hq,D", "float"},
                                     {"k", "Tk,Hkv,D", "=q"},
                                     {"v", "Tk,Hkv,Dv", "=q"},
                                     {"cu_seqlens_q", "N+1", "i32", true},
                                     {"cu_seqlens_k", "N+1", "i32", true}}};

void check_alibi(const TensorView& a, Problem& p) {
  args.dtype(a, DType::kF32, "alibi_slopes");
  if (a.shape != Shape{p.Hq} && a.shape != Shape{p.N, p.Hq})
    args.fail("alibi_slopes must be [Hq=" + num(p.Hq) + "] or [" + (p.varlen ? "N=" : "B=") + num(p.N) + ", Hq=" +
        num(p.Hq) + "], got " + shape_str(a.shape));
  args.plain(a, p.device, "alibi_slopes");
  p.alibi = static_cast<const float*>(a.data);
  p.alibi_seq_stride = a.ndim() == 2 ? p.Hq : 0;
}

// dropout_p in [0, 1); its seed i32 [2] on the inputs' device, needed when dropout_p > 0.
void check_dropout(const Options& opt, const std::optional<TensorView>& seed, Problem& p) {
  if (!std::isfinite(opt.dropout_p) || opt.dropout_p < 0.0 || opt.dropout_p >= 1.0)
  {
    char got[32];
    std::snprintf(got, sizeof got, "%.9g", opt.dropout_p);
    args.fail(std::string("dropout_p must be in [0, 1), got ") + got);
  }
  if (seed) {
    args.dtype(*seed, DType::kI32, "dropout_seed");
    if (seed->shape != Shape{2}) args.fail("dropout_seed must be [2] (i32: the Philox key), got " + shape_str(seed->shape));
    args.plain(*seed, p.device, "dropout_seed");
  }
  if (opt.dropout_p == 0.0) return;
  if (std::max(p.Sq, p.Sk) > int64_t{UINT32_MAX})  // the mask's counters are 32-bit positions
    args.fail("dropout needs sequences shorter than 2^32 rows and keys, got Sq=" + num(p.Sq) + ", Sk=" + num(p.Sk));
  if (!seed)
    args.fail("dropout_p > 0 needs dropout_seed (i32 [2], the Philox key of the mask; draw a new one per step, as the "
              "same seed gives the same mask)");
  p.dropout_p = opt.dropout_p;
  p.dropout_seed = static_cast<const int32_t*>(seed->data);
  p.dropout_threshold = primitives::philox::dropout_threshold(opt.dropout_p);
}

// bias [B|1, Hq|1, Sq|1, Sk|1] (dense form), f32 or q's dtype, on the inputs' device; a dim of 1
// is broadcast (stride 0).
void check_bias(const TensorView& b, Problem& p) {
  if (p.varlen) args.fail("bias is for the dense form (the varlen form's sequences have no common [Sq, Sk])");
  if (b.dtype != DType::kF32 && b.dtype != p.dtype)
    args.fail("bias must be f32 or q's dtype " + std::string(dtype_name(p.dtype)) + ", got " + dtype_name(b.dtype));
  const int64_t full[4] = {p.N, p.Hq, p.Sq, p.Sk};
  bool ok = b.ndim() == 4;
  for (int d = 0; ok && d < 4; ++d) ok = b.shape[d] == full[d] || b.shape[d] == 1;
  if (!ok)
    args.fail("bias must be [B|1, Hq|1, Sq|1, Sk|1] = [" + num(p.N) + "|1, " + num(p.Hq) + "|1, " + num(p.Sq) + "|1, " +
              num(p.Sk) + "|1], got " + shape_str(b.shape));
  args.plain(b, p.device, "bias");
  p.bias = b.data;
  p.bias_dtype = b.dtype;
  int64_t stride = 1;
  for (int d = 3; d >= 0; --d) {
    p.bias_shape[d] = b.shape[d];
    p.bias_stride[d] = b.shape[d] == 1 ? 0 : stride;
    stride *= b.shape[d];
  }
}

void check_options(const Options& opt, Problem& p) {
  p.scale = args.softmax_scale(opt.scale, p.D);
  args.softcap(opt.softcap, "softcap");
  const int64_t span = p.Sq + p.Sk;  // a window this long sees every key: unbounded
  p.window_left = args.window(opt.window_left, "window_left", span);
  p.window_right = args.window(opt.window_right, "window_right", span);
  p.softcap = opt.softcap;
  p.causal = opt.causal;
  p.deterministic = opt.deterministic;
  p.num_threads = resolve_num_threads(opt.num_threads, dispatch::pair_products_flops(p.N, p.Hq, p.D + p.Dv, [&](int64_t n) {
    return static_cast<double>(p.q_len(n)) * static_cast<double>(p.k_len(n)); }));  // the forward's; backward 2.5x
  p.stream = opt.stream;
  p.memory_budget = opt.memory_budget;
}

Problem normalize(const Inputs& in, const dispatch::Dims& d, const Options& opt) {
  Problem p;
  p.device = d.device();
  p.dtype = in.q.dtype;
  p.varlen = in.cu_seqlens_q.has_value();
  p.Hq = d["Hq"], p.Hkv = d["Hkv"], p.D = d["D"], p.Dv = d["Dv"];
  if (p.Hq < 1 || p.Hkv < 1) args.fail("head counts must be >= 1, got Hq=" + num(p.Hq) + ", Hkv=" + num(p.Hkv));
  if (p.D < 1 || p.Dv < 1) args.fail("head dims must be >= 1, got D=" + num(p.D) + ", Dv=" + num(p.Dv));
  if (p.Hq % p.Hkv != 0)
    args.fail("Hq=" + num(p.Hq) + " is not a multiple of Hkv=" + num(p.Hkv) + " (query head h reads kv head h / (Hq/Hkv))");
  if (p.varlen) {
    p.total_q = d["Tq"], p.total_k = d["Tk"];
    p.Sq = args.offsets(*in.cu_seqlens_q, p.total_q, "cu_seqlens_q", "rows of q");
    p.Sk = args.offsets(*in.cu_seqlens_k, p.total_k, "cu_seqlens_k", "rows of k");
    p.N = d["N+1"] - 1;
    p.cu_q = static_cast<const int32_t*>(in.cu_seqlens_q->data);
    p.cu_k = static_cast<const int32_t*>(in.cu_seqlens_k->data);
  } else {
    p.N = d["B"], p.Sq = d["Sq"], p.Sk = d["Sk"];
    p.total_q = p.N * p.Sq, p.total_k = p.N * p.Sk;
    if (in.segment_ids_q) p.seg_q = static_cast<const int32_t*>(in.segment_ids_q->data);
    if (in.segment_ids_k) p.seg_k = static_cast<const int32_t*>(in.segment_ids_k->data);
  }
  p.q = in.q.data, p.k = in.k.data, p.v = in.v.data;
  if (in.alibi_slopes) check_alibi(*in.alibi_slopes, p);
  check_options(opt, p);
  check_dropout(opt, in.dropout_seed, p);
  if (in.bias) check_bias(*in.bias, p);
  if (opt.check_finite) {
    args.finite(in.q, "q"), args.finite(in.k, "k"), args.finite(in.v, "v");
    if (in.alibi_slopes && !all_finite(*in.alibi_slopes)) args.fail("alibi_slopes contain NaN or Inf");
    if (in.bias && !all_finite(*in.bias, /*allow_neg_inf=*/true))
      args.fail("bias contains NaN or +Inf (-inf entries mask and are allowed)");
  }
  return p;
}

ForwardOut check_forward_outputs(const dispatch::Dims& d, const Problem& p, const ForwardOutputs& out) {
  args.output(out.o, p.dtype, d.shape(o_dims(p.varlen)), p.device, "o");
  args.tensor(out.lse, p.device, d.shape(lse_dims(p.varlen)), DType::kF32, "lse");
  return {out.o.data, out.o.dtype, static_cast<float*>(out.lse.data)};
}

// dbias is computed when given (and not an empty view), and only with a bias.
bool wants_dbias(const Gradients& g) { return g.dbias && dispatch::given(*g.dbias); }

GradOut check_gradients(const Inputs& in, const Problem& p, const Gradients& g) {
  args.output(g.dq, p.dtype, in.q.shape, p.device, "dq");
  args.output(g.dk, p.dtype, in.k.shape, p.device, "dk");
  args.output(g.dv, p.dtype, in.v.shape, p.device, "dv");
  GradOut out{g.dq.data, g.dq.dtype, g.dk.data, g.dk.dtype, g.dv.data, g.dv.dtype};
  if (!wants_dbias(g)) return out;
  if (!in.bias) args.fail("dbias is the gradient of a bias: give bias or leave dbias out");
  args.output(*g.dbias, in.bias->dtype, in.bias->shape, p.device, "dbias");
  out.dbias = g.dbias->data, out.dbias_dtype = g.dbias->dtype;
  return out;
}

// No output shares memory with an input, a saved tensor or another output (check_apart); the
// gradients' names and views, dbias when asked for.
dispatch::ArgCheck::Named gradient_views(const Gradients& g) {
  dispatch::ArgCheck::Named v{{"dq", g.dq}, {"dk", g.dk}, {"dv", g.dv}};
  if (wants_dbias(g)) v.push_back({"dbias", *g.dbias});
  return v;
}
std::vector<tune::Buffer> gradient_buffers(const Gradients& g) {
  std::vector<tune::Buffer> b;
  for (const auto& [name, view] : gradient_views(g)) b.push_back(tune::buffer_of(name, view));
  return b;
}

void check_grad_o(const dispatch::Dims& d, const Problem& p, const TensorView& g, const Options& opt) {
  args.output(g, p.dtype, d.shape(o_dims(p.varlen)), p.device, "grad_o");
  if (opt.check_finite) args.finite(g, "grad_o");
}

BackwardIn check_saved(const dispatch::Dims& d, const Problem& p, const BackwardInputs& s, const Options& opt) {
  const ForwardOut fo = check_forward_outputs(d, p, {s.o, s.lse});
  check_grad_o(d, p, s.grad_o, opt);
  if (opt.check_finite) {
    args.finite(s.o, "o");
    if (!all_finite(s.lse, /*allow_neg_inf=*/true)) args.fail("lse contains NaN or +Inf");
  }
  return {fo.o, fo.o_dtype, fo.lse, s.grad_o.data, s.grad_o.dtype};
}

// The block sizes: the call's (validated by the implementation that runs, before anything is
// written), else the tuned table's, else autotune-on-miss (timing this call into `outputs`), else
// the implementation's default; clamped to the call's lengths.
template <class Body>
std::string dispatch_call(const Problem& p, const Options& opt, Pass op, const std::vector<tune::Buffer>& outputs,
                          Body&& body) {
  const tune::DeclaredCall c{
      .dtype = p.dtype,
      .dims = {p.N, std::max(p.Sq, p.Sk), p.Hq, std::max(p.D, p.Dv)},
      .pass = op,
      .threads = p.num_threads,
      .given = opt.block_sizes ? tune::Params{{"q", opt.block_sizes->q}, {"kv", opt.block_sizes->kv}} : tune::Params{},
      .variant = autotune_variant(p)};
  const auto at = [](const tune::Params& s) { return BlockSizes{*tune::param(s, "q"), *tune::param(s, "kv")}; };
  // Only a tunable implementation's sizes are fitted to the lengths: cuda and cudnn have fixed
  // tiles of their own (a q=16,kv=32 clamped to kv=16 for 9 keys is refused by cuda).
  const std::vector<std::string>& tunable = tuning().implementations;
  return tune::dispatch_declared(
      registry(), tuning(), opt, p, c, outputs, at,
      [&](const Implementation& impl, const BlockSizes& bs) {
        const bool fit = std::count(tunable.begin(), tunable.end(), impl.name()) > 0;
        body(impl, fit ? sanitize_for_shape(bs, p) : bs);
      },
      [&](const Implementation& impl) { if (opt.block_sizes) impl.validate_block_sizes(*opt.block_sizes); });
}

// Calls with nothing to compute. No query rows: nothing to write but dk = dv = 0. No keys: every
// row sees nothing (o = 0, lse = −inf, dq = 0). Both are the contract, not a backend's choice.
// Device outputs with no keys go to the backend (its rows see nothing, the same outputs): −inf
// is not a byte pattern the allocator's memset can write into a device lse.
bool trivial_forward(const Problem& p, const ForwardOutputs& out) {
  if (p.total_q > 0 && p.total_k > 0) return false;
  if (p.total_q > 0 && out.lse.device.type != DeviceType::kCPU) return false;
  synchronize(p.device, p.stream);  // the caller's queued work first (zero_fill is not on its stream)
  zero_fill(out.o);
  float* lse = static_cast<float*>(out.lse.data);
  if (out.lse.device.type == DeviceType::kCPU)
    for (int64_t i = 0; i < out.lse.numel(); ++i) lse[i] = -std::numeric_limits<float>::infinity();
  return true;
}
// An empty call runs no implementation, but block sizes it gives are checked by the one that
// would run, as in a non-empty call (before anything is written): a bad setting must not pass on
// an empty batch and fail on the next.
void check_block_sizes_of_empty(const Problem& p, const Options& opt) {
  if (!opt.block_sizes || (p.total_q > 0 && p.total_k > 0)) return;
  registry().dispatch_problem(opt.implementation, p,
                              [&](const Implementation& impl) { impl.validate_block_sizes(*opt.block_sizes); });
}
bool trivial_backward(const Problem& p, const Gradients& g) {
  if (p.total_q > 0 && p.total_k > 0) return false;
  synchronize(p.device, p.stream);
  zero_fill(g.dq);
  zero_fill(g.dk);
  zero_fill(g.dv);
  if (wants_dbias(g)) zero_fill(*g.dbias);
  return true;
}

}  // namespace

std::string BlockSizes::str() const { return "q=" + num(q) + ",kv=" + num(kv); }

void validate_block_sizes(const std::string& implementation, const BlockSizes& bs) {
  registry().require(implementation).validate_block_sizes(bs);
}

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

dispatch::Dims bind_tensors(const Inputs& in, dispatch::BindMode mode) {
  if (!dispatch::given(in.q) || !dispatch::given(in.k) || !dispatch::given(in.v)) args.fail("q, k and v are required");
  if (in.cu_seqlens_q.has_value() != in.cu_seqlens_k.has_value())
    args.fail("cu_seqlens_q and cu_seqlens_k must be given together (the varlen form)");
  if (in.segment_ids_q.has_value() != in.segment_ids_k.has_value())
    args.fail("segment_ids_q and segment_ids_k must be given together");
  if (in.cu_seqlens_q) {
    if (in.segment_ids_q) args.fail("segment ids are for the dense form; the varlen form has cu_seqlens");
    return kVarlen.bind({{"q", in.q}, {"k", in.k}, {"v", in.v}, {"cu_seqlens_q", *in.cu_seqlens_q},
                         {"cu_seqlens_k", *in.cu_seqlens_k}}, mode);
  }
  return kDense.bind({{"q", in.q}, {"k", in.k}, {"v", in.v}, {"segment_ids_q", in.segment_ids_q.value_or(TensorView{})},
                      {"segment_ids_k", in.segment_ids_k.value_or(TensorView{})}}, mode);
}

namespace {
// No output shares memory with an input, a saved tensor or another output: a backend reads its
// inputs after it has written outputs (dq over q), and an autotune sweep writes the outputs
// before the call it keeps.
void check_apart(const Inputs& in, const dispatch::ArgCheck::Named& outputs, dispatch::ArgCheck::Named reads) {
  const TensorView none;  // an absent input spans nothing
  reads.insert(reads.end(), {{"q", in.q}, {"k", in.k}, {"v", in.v}, {"alibi_slopes", in.alibi_slopes.value_or(none)},
                             {"segment_ids_q", in.segment_ids_q.value_or(none)}, {"segment_ids_k", in.segment_ids_k.value_or(none)},
                             {"cu_seqlens_q", in.cu_seqlens_q.value_or(none)}, {"cu_seqlens_k", in.cu_seqlens_k.value_or(none)},
                             {"dropout_seed", in.dropout_seed.value_or(none)}, {"bias", in.bias.value_or(none)}});
  args.apart(outputs, reads);
}
}  // namespace

std::string forward(const Inputs& in, const ForwardOutputs& out, const Options& opt) {
  const dispatch::Dims d = bind_tensors(in, dispatch::BindMode::kFull);
  const Problem p = normalize(in, d, opt);
  const ForwardOut fo = check_forward_outputs(d, p, out);
  check_apart(in, {{"o", out.o}, {"lse", out.lse}}, {});
  registry().check_names(opt.implementation, p.device.type);  // also when nothing runs
  check_block_sizes_of_empty(p, opt);
  if (trivial_forward(p, out)) return "(empty)";
  return dispatch_call(p, opt, Pass::kForward, {tune::buffer_of("o", out.o), tune::buffer_of("lse", out.lse)},
                       [&](const Implementation& impl, const BlockSizes& bs) { impl.forward(p, bs, fo); });
}

std::string backward(const Inputs& in, const BackwardInputs& saved, const Gradients& grads, const Options& opt) {
  const dispatch::Dims d = bind_tensors(in, dispatch::BindMode::kFull);
  const Problem p = normalize(in, d, opt);
  const BackwardIn bi = check_saved(d, p, saved, opt);
  const GradOut go = check_gradients(in, p, grads);
  check_apart(in, gradient_views(grads), {{"o", saved.o}, {"lse", saved.lse}, {"grad_o", saved.grad_o}});
  registry().check_names(opt.implementation, p.device.type);
  check_block_sizes_of_empty(p, opt);
  if (trivial_backward(p, grads)) return "(empty)";
  return dispatch_call(p, opt, Pass::kBackward, gradient_buffers(grads),
                       [&](const Implementation& impl, const BlockSizes& bs) { impl.backward(p, bs, bi, go); });
}

std::string forward_backward(const Inputs& in, const TensorView& grad_o, const ForwardOutputs& out,
                             const Gradients& grads, const Options& opt) {
  const dispatch::Dims d = bind_tensors(in, dispatch::BindMode::kFull);
  const Problem p = normalize(in, d, opt);
  const ForwardOut fo = check_forward_outputs(d, p, out);
  check_grad_o(d, p, grad_o, opt);
  const GradOut go = check_gradients(in, p, grads);
  dispatch::ArgCheck::Named written = gradient_views(grads);
  written.insert(written.begin(), {{"o", out.o}, {"lse", out.lse}});
  check_apart(in, written, {{"grad_o", grad_o}});
  registry().check_names(opt.implementation, p.device.type);
  check_block_sizes_of_empty(p, opt);
  if (trivial_forward(p, out)) {
    trivial_backward(p, grads);
    return "(empty)";
  }
  const BackwardIn bi{out.o.data, out.o.dtype, fo.lse, grad_o.data, grad_o.dtype};
  std::vector<tune::Buffer> outs = gradient_buffers(grads);
  outs.insert(outs.begin(), {tune::buffer_of("o", out.o), tune::buffer_of("lse", out.lse)});
  return dispatch_call(p, opt, Pass::kFused, outs, [&](const Implementation& impl, const BlockSizes& bs) {
    impl.forward(p, bs, fo);
    impl.backward(p, bs, bi, go);
  });
}

namespace {

// Outputs on the inputs' device: o and lse, and with_grad dq, dk, dv in the inputs' dtypes.
Result make_outputs(const Inputs& in, bool with_grad) {
  const dispatch::Dims d = bind_tensors(in, dispatch::BindMode::kShapesOnly);
  const bool varlen = in.cu_seqlens_q.has_value();
  Result r;
  r.o = Tensor::empty(in.q.dtype, d.shape(o_dims(varlen)), in.q.device);
  r.lse = Tensor::empty(DType::kF32, d.shape(lse_dims(varlen)), in.q.device);
  if (!with_grad) return r;
  r.dq = Tensor::empty(in.q.dtype, in.q.shape, in.q.device);
  r.dk = Tensor::empty(in.k.dtype, in.k.shape, in.q.device);
  r.dv = Tensor::empty(in.v.dtype, in.v.shape, in.q.device);
  if (in.bias) r.dbias = Tensor::empty(in.bias->dtype, in.bias->shape, in.q.device);
  return r;
}

}  // namespace

Result compute(const Inputs& in, const Options& opt) {
  Result r = make_outputs(in, false);
  r.implementation = forward(in, {r.o.view(), r.lse.view()}, opt);
  return r;
}

Result compute_with_grad(const Inputs& in, const TensorView& grad_o, const Options& opt) {
  Result r = make_outputs(in, true);
  Gradients g{r.dq.view(), r.dk.view(), r.dv.view(), {}};
  if (r.dbias.defined()) g.dbias = r.dbias.view();
  r.implementation = forward_backward(in, grad_o, {r.o.view(), r.lse.view()}, g, opt);
  return r;
}

}  // namespace tessera::attention
