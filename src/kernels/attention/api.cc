// attention: the public API. Validates every input and output before anything runs (an error
// touches no output), normalizes the dense and varlen forms into one Problem, picks block sizes
// and dispatches with the fallback rules of src/dispatch.
#include <cmath>
#include <limits>

#include "dispatch/arg_check.h"
#include "kernels/attention/impl.h"
#include "tessera/attention.h"
#include "tessera/error.h"
#include "tune/declared.h"

namespace tessera::attention {
namespace {

using dispatch::all_finite;
using dispatch::num;
const dispatch::ArgCheck args{kKernelName, "q"};

thread_local std::string t_last_impl;

// Validates cu_seqlens (i32 [N+1], starts at 0, non-decreasing, ends at `total`); returns the
// longest sequence.
int64_t check_cu_seqlens(const TensorView& cu, int64_t total, const char* what, const char* rows) {
  const int32_t* c = static_cast<const int32_t*>(cu.data);
  const int64_t n = cu.shape[0];
  if (c[0] != 0) args.fail(std::string(what) + "[0] must be 0, got " + num(c[0]));
  int64_t longest = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (c[i] < c[i - 1])
      args.fail(std::string(what) + " must be non-decreasing, got " + num(c[i - 1]) + " then " + num(c[i]) +
          " at index " + num(i));
    longest = std::max<int64_t>(longest, c[i] - c[i - 1]);
  }
  if (c[n - 1] != total)
    args.fail(std::string(what) + "[N=" + num(n - 1) + "] must equal the " + rows + " (" + num(total) + "), got " +
        num(c[n - 1]));
  return longest;
}

Problem normalize(const Inputs& in, const Options& opt) {
  const TensorView &q = in.q, &k = in.k, &v = in.v;
  if (!is_float(q.dtype)) args.fail(std::string("q must be f32, bf16 or f16, got ") + dtype_name(q.dtype));
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    args.fail(std::string("q, k and v must share one dtype, got q ") + dtype_name(q.dtype) + ", k " +
        dtype_name(k.dtype) + ", v " + dtype_name(v.dtype));
  Problem p;
  p.device = q.device;
  p.dtype = q.dtype;
  args.plain(q, p.device, "q");
  args.plain(k, p.device, "k");
  args.plain(v, p.device, "v");

  if (in.cu_seqlens_q.has_value() != in.cu_seqlens_k.has_value())
    args.fail("cu_seqlens_q and cu_seqlens_k must be given together (the varlen form)");
  p.varlen = in.cu_seqlens_q.has_value();
  const int64_t rank = p.varlen ? 3 : 4;
  const char* form = p.varlen ? "[T, H, D] (varlen form)" : "[B, S, H, D]";
  if (q.ndim() != rank) args.fail(std::string("q must be ") + form + ", got " + shape_str(q.shape));
  if (k.ndim() != rank) args.fail(std::string("k must be ") + form + ", got " + shape_str(k.shape));
  if (v.ndim() != rank) args.fail(std::string("v must be ") + form + ", got " + shape_str(v.shape));
  const int64_t o = rank - 3;  // index of the sequence axis (dense) or the token axis (varlen)
  p.Hq = q.shape[o + 1];
  p.D = q.shape[o + 2];
  p.Hkv = k.shape[o + 1];
  p.Dv = v.shape[o + 2];
  if (p.Hq < 1 || p.Hkv < 1) args.fail("head counts must be >= 1, got Hq=" + num(p.Hq) + ", Hkv=" + num(p.Hkv));
  if (p.D < 1 || p.Dv < 1) args.fail("head dims must be >= 1, got D=" + num(p.D) + ", Dv=" + num(p.Dv));
  if (k.shape[o + 2] != p.D) args.fail("k's head dim " + num(k.shape[o + 2]) + " differs from q's D=" + num(p.D));
  if (p.Hq % p.Hkv != 0)
    args.fail("Hq=" + num(p.Hq) + " is not a multiple of Hkv=" + num(p.Hkv) + " (query head h reads kv head h / (Hq/Hkv))");
  if (!p.varlen && k.shape[0] != q.shape[0])
    args.fail("k's batch " + num(k.shape[0]) + " differs from q's batch " + num(q.shape[0]));
  if (v.shape[o] != k.shape[o] || v.shape[o + 1] != p.Hkv || (!p.varlen && v.shape[0] != k.shape[0]))
    args.fail("v " + shape_str(v.shape) + " must match k " + shape_str(k.shape) + " in all but the last axis");

  if (p.varlen) {
    const TensorView &cq = *in.cu_seqlens_q, &ck = *in.cu_seqlens_k;
    for (const auto* t : {&cq, &ck}) {
      const char* what = t == &cq ? "cu_seqlens_q" : "cu_seqlens_k";
      if (t->dtype != DType::kI32) args.fail(std::string(what) + " must be i32, got " + dtype_name(t->dtype));
      if (t->ndim() != 1 || t->shape[0] < 1) args.fail(std::string(what) + " must be 1-D [N+1], got " + shape_str(t->shape));
      // Host memory whatever q's device: the API validates them and a device backend copies them.
      if (t->device.type != DeviceType::kCPU)
        args.fail(std::string(what) + " must be in host memory (also for device inputs), got " + t->device.str());
      args.contiguous(*t, what);
      args.data(*t, what);
    }
    if (cq.shape[0] != ck.shape[0])
      args.fail("cu_seqlens_q " + shape_str(cq.shape) + " and cu_seqlens_k " + shape_str(ck.shape) +
          " must have the same length N+1");
    if (in.segment_ids_q || in.segment_ids_k) args.fail("segment ids are for the dense form; the varlen form has cu_seqlens");
    p.N = cq.shape[0] - 1;
    p.total_q = q.shape[0];
    p.total_k = k.shape[0];
    p.Sq = check_cu_seqlens(cq, p.total_q, "cu_seqlens_q", "rows of q");
    p.Sk = check_cu_seqlens(ck, p.total_k, "cu_seqlens_k", "rows of k");
    p.cu_q = static_cast<const int32_t*>(cq.data);
    p.cu_k = static_cast<const int32_t*>(ck.data);
  } else {
    p.N = q.shape[0];
    p.Sq = q.shape[1];
    p.Sk = k.shape[1];
    p.total_q = p.N * p.Sq;
    p.total_k = p.N * p.Sk;
  }
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;

  if (in.alibi_slopes) {
    const TensorView& a = *in.alibi_slopes;
    if (a.dtype != DType::kF32) args.fail(std::string("alibi_slopes must be f32, got ") + dtype_name(a.dtype));
    if (a.shape == Shape{p.Hq}) {
      p.alibi_seq_stride = 0;
    } else if (a.shape == Shape{p.N, p.Hq}) {
      p.alibi_seq_stride = p.Hq;
    } else {
      args.fail("alibi_slopes must be [Hq=" + num(p.Hq) + "] or [" + (p.varlen ? "N=" : "B=") + num(p.N) + ", Hq=" +
          num(p.Hq) + "], got " + shape_str(a.shape));
    }
    args.plain(a, p.device, "alibi_slopes");
    p.alibi = static_cast<const float*>(a.data);
  }

  if (in.segment_ids_q.has_value() != in.segment_ids_k.has_value())
    args.fail("segment_ids_q and segment_ids_k must be given together");
  if (in.segment_ids_q) {
    const TensorView &sq = *in.segment_ids_q, &sk = *in.segment_ids_k;
    if (sq.dtype != DType::kI32 || sk.dtype != DType::kI32)
      args.fail(std::string("segment ids must be i32, got ") + dtype_name(sq.dtype) + " and " + dtype_name(sk.dtype));
    if (sq.shape != Shape{p.N, p.Sq})
      args.fail("segment_ids_q must be [B=" + num(p.N) + ", Sq=" + num(p.Sq) + "], got " + shape_str(sq.shape));
    if (sk.shape != Shape{p.N, p.Sk})
      args.fail("segment_ids_k must be [B=" + num(p.N) + ", Sk=" + num(p.Sk) + "], got " + shape_str(sk.shape));
    args.plain(sq, p.device, "segment_ids_q");
    args.plain(sk, p.device, "segment_ids_k");
    p.seg_q = static_cast<const int32_t*>(sq.data);
    p.seg_k = static_cast<const int32_t*>(sk.data);
  }

  if (opt.scale && !(std::isfinite(*opt.scale) && *opt.scale > 0.0))
    args.fail("scale must be finite and > 0, got " + std::to_string(*opt.scale));
  if (!(opt.softcap >= 0.0) || !std::isfinite(opt.softcap))
    args.fail("softcap must be finite and >= 0 (0 disables it), got " + std::to_string(opt.softcap));
  if (opt.window_left < -1) args.fail("window_left must be >= 0 or -1 (unbounded), got " + num(opt.window_left));
  if (opt.window_right < -1) args.fail("window_right must be >= 0 or -1 (unbounded), got " + num(opt.window_right));
  p.scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(p.D));
  p.softcap = opt.softcap;
  p.causal = opt.causal;
  p.window_left = opt.window_left;
  p.window_right = opt.window_right;
  p.num_threads = resolve_num_threads(opt.num_threads);
  p.stream = opt.stream;
  p.memory_budget = opt.memory_budget;

  if (opt.check_finite) {
    args.finite(q, "q"), args.finite(k, "k"), args.finite(v, "v");
    if (in.alibi_slopes && !all_finite(*in.alibi_slopes)) args.fail("alibi_slopes contain NaN or Inf");
  }
  return p;
}

Shape o_shape(const Inputs& in, const Problem& p) {
  Shape s = in.q.shape;
  s.back() = p.Dv;
  return s;
}
Shape lse_shape(const Problem& p) { return p.varlen ? Shape{p.Hq, p.total_q} : Shape{p.N, p.Hq, p.Sq}; }

void check_lse(const TensorView& t, const Problem& p) {
  if (t.dtype != DType::kF32) args.fail(std::string("lse must be f32, got ") + dtype_name(t.dtype));
  args.shape(t, lse_shape(p), "lse");
  args.plain(t, p.device, "lse");
}

ForwardOut check_forward_outputs(const Inputs& in, const Problem& p, const ForwardOutputs& out) {
  args.output(out.o, p.dtype, o_shape(in, p), p.device, "o");
  check_lse(out.lse, p);
  return {out.o.data, out.o.dtype, static_cast<float*>(out.lse.data)};
}

GradOut check_gradients(const Inputs& in, const Problem& p, const Gradients& g) {
  args.output(g.dq, p.dtype, in.q.shape, p.device, "dq");
  args.output(g.dk, p.dtype, in.k.shape, p.device, "dk");
  args.output(g.dv, p.dtype, in.v.shape, p.device, "dv");
  return {g.dq.data, g.dq.dtype, g.dk.data, g.dk.dtype, g.dv.data, g.dv.dtype};
}

void check_grad_o(const Inputs& in, const Problem& p, const TensorView& g, const Options& opt) {
  args.output(g, p.dtype, o_shape(in, p), p.device, "grad_o");
  if (opt.check_finite) args.finite(g, "grad_o");
}

BackwardIn check_saved(const Inputs& in, const Problem& p, const BackwardInputs& s, const Options& opt) {
  args.output(s.o, p.dtype, o_shape(in, p), p.device, "o");
  check_lse(s.lse, p);
  check_grad_o(in, p, s.grad_o, opt);
  if (opt.check_finite) {
    args.finite(s.o, "o");
    if (!all_finite(s.lse, /*allow_neg_inf=*/true)) args.fail("lse contains NaN or +Inf");
  }
  return {s.o.data, s.o.dtype, static_cast<const float*>(s.lse.data), s.grad_o.data, s.grad_o.dtype};
}

// The block sizes: the call's (validated by the implementation that runs, before anything is
// written), else the tuned table's, else autotune-on-miss (timing this call into `outputs`), else
// the implementation's default; clamped to the call's lengths.
template <class Body>
std::string dispatch_call(const Problem& p, const Options& opt, Pass op, const std::vector<tune::Buffer>& outputs,
                          Body&& body) {
  tune::DeclaredCall c;
  c.dtype = p.dtype;
  c.dims = {p.N, std::max(p.Sq, p.Sk), p.Hq, std::max(p.D, p.Dv)};
  c.pass = op;
  c.threads = p.num_threads;
  if (opt.block_sizes) c.given = {{"q", opt.block_sizes->q}, {"kv", opt.block_sizes->kv}};
  c.variant = autotune_variant(p);
  const auto at = [&p](const tune::Params& s) {
    return sanitize_for_shape({*tune::param(s, "q"), *tune::param(s, "kv")}, p);
  };
  return t_last_impl = tune::dispatch_declared(registry(), tuning(), opt, p, c, outputs, at,
                                               [&](const Implementation& impl, const BlockSizes& bs) {
                                                 if (opt.block_sizes) impl.validate_block_sizes(*opt.block_sizes);
                                                 body(impl, bs);
                                               });
}

// Calls with nothing to compute. No query rows: nothing to write but dk = dv = 0. No keys: every
// row sees nothing (o = 0, lse = −inf, dq = 0). Both are the contract, not a backend's choice.
// Device outputs with no keys go to the backend (its rows see nothing, the same outputs): −inf
// is not a byte pattern the allocator's memset can write into a device lse.
bool trivial_forward(const Problem& p, const ForwardOutputs& out) {
  if (p.total_q > 0 && p.total_k > 0) return false;
  if (p.total_q > 0 && out.lse.device.type != DeviceType::kCPU) return false;
  zero_fill(out.o);
  float* lse = static_cast<float*>(out.lse.data);
  if (out.lse.device.type == DeviceType::kCPU)
    for (int64_t i = 0; i < out.lse.numel(); ++i) lse[i] = -std::numeric_limits<float>::infinity();
  t_last_impl = "(empty)";
  return true;
}
bool trivial_backward(const Problem& p, const Gradients& g) {
  if (p.total_q > 0 && p.total_k > 0) return false;
  zero_fill(g.dq);
  zero_fill(g.dk);
  zero_fill(g.dv);
  t_last_impl = "(empty)";
  return true;
}

}  // namespace

const std::string& last_implementation() { return t_last_impl; }

std::string BlockSizes::str() const { return "q=" + num(q) + ",kv=" + num(kv); }

void validate_block_sizes(const std::string& implementation, const BlockSizes& bs) {
  registry().require(implementation).validate_block_sizes(bs);
}

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

std::string forward(const Inputs& in, const ForwardOutputs& out, const Options& opt) {
  const Problem p = normalize(in, opt);
  const ForwardOut fo = check_forward_outputs(in, p, out);
  if (trivial_forward(p, out)) return t_last_impl;
  return dispatch_call(p, opt, Pass::kForward, {tune::buffer_of("o", out.o), tune::buffer_of("lse", out.lse)},
                       [&](const Implementation& impl, const BlockSizes& bs) { impl.forward(p, bs, fo); });
}

std::string backward(const Inputs& in, const BackwardInputs& saved, const Gradients& grads, const Options& opt) {
  const Problem p = normalize(in, opt);
  const BackwardIn bi = check_saved(in, p, saved, opt);
  const GradOut go = check_gradients(in, p, grads);
  if (trivial_backward(p, grads)) return t_last_impl;
  const std::vector<tune::Buffer> outs{tune::buffer_of("dq", grads.dq), tune::buffer_of("dk", grads.dk),
                                       tune::buffer_of("dv", grads.dv)};
  return dispatch_call(p, opt, Pass::kBackward, outs,
                       [&](const Implementation& impl, const BlockSizes& bs) { impl.backward(p, bs, bi, go); });
}

std::string forward_backward(const Inputs& in, const TensorView& grad_o, const ForwardOutputs& out,
                             const Gradients& grads, const Options& opt) {
  const Problem p = normalize(in, opt);
  const ForwardOut fo = check_forward_outputs(in, p, out);
  check_grad_o(in, p, grad_o, opt);
  const GradOut go = check_gradients(in, p, grads);
  if (trivial_forward(p, out)) {
    trivial_backward(p, grads);
    return t_last_impl;
  }
  const BackwardIn bi{out.o.data, out.o.dtype, fo.lse, grad_o.data, grad_o.dtype};
  const std::vector<tune::Buffer> outs{tune::buffer_of("o", out.o), tune::buffer_of("lse", out.lse),
                                       tune::buffer_of("dq", grads.dq), tune::buffer_of("dk", grads.dk),
                                       tune::buffer_of("dv", grads.dv)};
  return dispatch_call(p, opt, Pass::kFused, outs, [&](const Implementation& impl, const BlockSizes& bs) {
    impl.forward(p, bs, fo);
    impl.backward(p, bs, bi, go);
  });
}

namespace {

Result make_outputs(const Inputs& in, bool with_grad) {
  Result r;
  const Device dev = in.q.device;
  check(in.q.ndim() >= 3 && in.v.ndim() >= 3, ErrorCode::kInvalidArgument,
        std::string(kKernelName) + ": q and v must be [B, S, H, D] or [T, H, D]");
  Shape os = in.q.shape;
  os.back() = in.v.shape.back();
  const int64_t Hq = in.q.shape[in.q.ndim() - 2];
  Shape ls;
  if (in.q.ndim() == 3)
    ls = {Hq, in.q.shape[0]};
  else
    ls = {in.q.shape[0], Hq, in.q.shape[1]};
  r.o = Tensor::empty(in.q.dtype, os, dev);
  r.lse = Tensor::empty(DType::kF32, ls, dev);
  if (with_grad) {
    r.dq = Tensor::empty(in.q.dtype, in.q.shape, dev);
    r.dk = Tensor::empty(in.k.dtype, in.k.shape, dev);
    r.dv = Tensor::empty(in.v.dtype, in.v.shape, dev);
  }
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
  r.implementation = forward_backward(in, grad_o, {r.o.view(), r.lse.view()}, {r.dq.view(), r.dk.view(), r.dv.view()}, opt);
  return r;
}

}  // namespace tessera::attention
