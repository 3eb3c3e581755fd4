// mlstm: validation, conversion to the f32 Problem (host calls; a device call hands its arrays
// over unconverted: impl.h), dispatch. Every check runs before any output is touched.
#include <cmath>
#include <vector>

#include "dispatch/host_f32.h"
#include "kernels/mlstm/impl.h"
#include "tune/declared.h"
#include "tessera/error.h"

namespace tessera::mlstm {
namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, std::string(kKernelName) + ": " + msg);
}

using dispatch::as_f32;
using dispatch::as_f32_out;
using dispatch::F32In;
using dispatch::F32Out;
using dispatch::given;

// Every array of a call lives on q's device `dev` (host memory, or one CUDA device for the cuda
// backend).
void need_shape(const char* name, const TensorView& t, const Shape& want, const Device& dev) {
  if (t.shape != want) fail(std::string(name) + " must be " + shape_str(want) + ", got " + t.str());
  if (t.device != dev) fail(std::string(name) + " must be on q's device " + dev.str() + ", got " + t.str());
  if (!t.is_contiguous()) fail(std::string(name) + " must be contiguous, got " + t.str());
  if (t.numel() > 0 && t.data == nullptr) fail(std::string(name) + " has no data");
}

void need_float(const char* name, const TensorView& t) {
  if (!is_float(t.dtype)) fail(std::string(name) + " must be f32, bf16 or f16, got " + t.str());
}
void need_f32(const char* name, const TensorView& t) {
  if (t.dtype != DType::kF32) fail(std::string(name) + " must be f32, got " + t.str());
}
void need_dtype_or_f32(const char* name, const TensorView& t, DType like) {
  if (t.dtype != like && t.dtype != DType::kF32)
    fail(std::string(name) + " must be " + dtype_name(like) + " or f32, got " + t.str());
}

// The validated inputs in f32, with the Problem pointing into them.
struct Prepared {
  Problem p;
  F32In q, k, v, i, f, c0, n0, m0;
  std::vector<uint8_t> resets;
  DType qkv = DType::kF32, gates = DType::kF32;
};

void prepare(const Inputs& in, const Options& opt, Prepared& r) {
  const TensorView& q = in.q;
  if (q.ndim() != 4) fail("q must be [B, NH, S, DHQK], got " + q.str());
  const int64_t B = q.shape[0], NH = q.shape[1], S = q.shape[2], DK = q.shape[3];
  if (S == 0) fail("S must be >= 1 (q is " + q.str() + ")");
  if (B == 0 || NH == 0 || DK == 0) fail("B, NH and DHQK must be >= 1, got q " + q.str());
  if (in.v.ndim() != 4) fail("v must be [B, NH, S, DHV], got " + in.v.str());
  const int64_t DV = in.v.shape[3];
  if (DV == 0) fail("DHV must be >= 1, got v " + in.v.str());
  need_float("q", q);
  need_shape("q", q, q.shape, q.device);
  need_shape("k", in.k, q.shape, q.device);
  need_shape("v", in.v, {B, NH, S, DV}, q.device);
  if (in.k.dtype != q.dtype || in.v.dtype != q.dtype)
    fail("q, k and v must share one dtype, got " + q.str() + ", " + in.k.str() + ", " + in.v.str());
  need_shape("i", in.i, {B, NH, S}, q.device);
  need_shape("f", in.f, {B, NH, S}, q.device);
  need_float("i", in.i);
  need_float("f", in.f);
  if (in.i.dtype != in.f.dtype) fail("i and f must share one dtype, got " + in.i.str() + ", " + in.f.str());
  if (given(in.resets)) {
    need_shape("resets", in.resets, {B, S}, q.device);
    if (in.resets.dtype != DType::kI32 && in.resets.dtype != DType::kI64)
      fail("resets must be i32 or i64 (nonzero = reset), got " + in.resets.str());
  }
  const int states = int(given(in.c0)) + int(given(in.n0)) + int(given(in.m0));
  if (states != 0 && states != 3) fail("c0, n0 and m0 go together: give all three or none");
  if (states == 3) {
    need_shape("c0", in.c0, {B, NH, DK, DV}, q.device);
    need_shape("n0", in.n0, {B, NH, DK}, q.device);
    need_shape("m0", in.m0, {B, NH}, q.device);
    need_f32("c0", in.c0), need_f32("n0", in.n0), need_f32("m0", in.m0);
  }
  if (!(opt.eps >= 0.0) || !std::isfinite(opt.eps)) fail("eps must be finite and >= 0, got " + std::to_string(opt.eps));
  if (opt.chunk_size < 0) fail("chunk_size must be >= 1 (0: the backend's default), got " + std::to_string(opt.chunk_size));
  if (opt.check_finite) {
    const std::pair<const char*, const TensorView*> all[] = {{"q", &q},         {"k", &in.k},   {"v", &in.v},
                                                             {"i", &in.i},      {"f", &in.f},   {"c0", &in.c0},
                                                             {"n0", &in.n0},    {"m0", &in.m0}};
    for (const auto& [name, t] : all)
      if (given(*t) && !dispatch::all_finite(*t)) fail(std::string(name) + " contains NaN or Inf");
  }
  r.qkv = q.dtype, r.gates = in.i.dtype;
  Problem& p = r.p;
  p.B = B, p.NH = NH, p.S = S, p.DK = DK, p.DV = DV;
  p.device = q.device;
  p.eps = opt.eps;
  p.chunk = opt.chunk_size;
  p.num_threads = resolve_num_threads(opt.num_threads);
  p.stream = opt.stream;
}

bool on_device(const Problem& p) { return p.device.type != DeviceType::kCPU; }
DevIn dev_in(const TensorView& t) { return {given(t) ? t.data : nullptr, t.dtype}; }
DevOut dev_out(const TensorView& t) { return {t.data, t.dtype}; }

// Conversion after every check (prepare) passed.
void convert(const Inputs& in, Prepared& r) {
  if (on_device(r.p)) {  // nothing converted: the device backend reads every dtype
    Problem& p = r.p;
    p.dev = {dev_in(in.q), dev_in(in.k), dev_in(in.v), dev_in(in.i), dev_in(in.f), dev_in(in.resets)};
    if (given(in.c0)) p.c0 = in.c0.data_as<const float>(), p.n0 = in.n0.data_as<const float>(), p.m0 = in.m0.data_as<const float>();
    return;
  }
  r.q = as_f32(in.q), r.k = as_f32(in.k), r.v = as_f32(in.v), r.i = as_f32(in.i), r.f = as_f32(in.f);
  r.c0 = as_f32(in.c0), r.n0 = as_f32(in.n0), r.m0 = as_f32(in.m0);
  Problem& p = r.p;
  p.q = r.q.ptr, p.k = r.k.ptr, p.v = r.v.ptr, p.i = r.i.ptr, p.f = r.f.ptr;
  p.c0 = r.c0.ptr, p.n0 = r.n0.ptr, p.m0 = r.m0.ptr;
  if (given(in.resets)) {
    r.resets.resize(static_cast<size_t>(p.B * p.S));
    for (int64_t j = 0; j < p.B * p.S; ++j) r.resets[static_cast<size_t>(j)] = load_as_i64(in.resets.data, in.resets.dtype, j) != 0;
    p.resets = r.resets.data();
  }
}

std::string run(const Problem& p, const std::string& requested,
                const std::function<void(const Implementation&)>& body) {
  return registry().dispatch(
      requested, p.device.type, [&](const Implementation& impl) { return impl.supports(p); }, body);
}

// `p` with the chunk length `impl` runs: the call's (chunk_size > 0), else the tuned table's,
// else autotune-on-miss (timing `pass` of `impl` itself through `once`), else the default.
Problem with_chunk(const Problem& p, const Implementation& impl, DType dtype, Pass pass, const Options& opt,
                   const std::function<void(const Problem&)>& once, const tune::OutputsFn& outputs) {
  tune::DeclaredCall c;
  c.implementation = impl.name();
  c.device = impl.device_type();
  c.dtype = dtype;
  c.dims = {p.B, p.NH, p.S, p.DK, p.DV};
  c.pass = pass;
  c.threads = p.num_threads;
  c.given = {{"chunk_size", p.chunk}};
  c.autotune_on_miss = opt.autotune_on_miss;
  Problem q = p;
  const tune::Choice ch = tune::choose_declared(
      tuning(), c,
      [&](const tune::Params& cand) {
        Problem t = p;
        t.chunk = tune::param(cand, "chunk_size").value_or(0);
        once(t);
      },
      outputs);
  q.chunk = tune::param(ch.params, "chunk_size").value_or(0);
  return q;
}

}  // namespace

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

namespace {

// h and the last states checked (before anything is converted or written); the count of last states.
int check_forward_outputs(const Prepared& r, const TensorView& h, const LastStates& last) {
  const Problem& p = r.p;
  need_shape("h", h, {p.B, p.NH, p.S, p.DV}, p.device);
  need_dtype_or_f32("h", h, r.qkv);
  const int outs = int(given(last.c)) + int(given(last.n)) + int(given(last.m));
  if (outs != 0 && outs != 3) fail("the last states c, n and m go together: give all three or none");
  if (outs == 3) {
    need_shape("c_last", last.c, {p.B, p.NH, p.DK, p.DV}, p.device);
    need_shape("n_last", last.n, {p.B, p.NH, p.DK}, p.device);
    need_shape("m_last", last.m, {p.B, p.NH}, p.device);
    need_f32("c_last", last.c), need_f32("n_last", last.n), need_f32("m_last", last.m);
  }
  return outs;
}

// The forward's outputs as the backends take them (h through an f32 scratch where it is not f32).
struct ForwardBind {
  F32Out h;
  ForwardOut out;
  ForwardBind(const Problem& p, const TensorView& h_view, const LastStates& last, int outs) {
    if (!on_device(p)) h = as_f32_out(h_view);
    out.h = h.ptr;
    if (on_device(p)) out.h_dev = dev_out(h_view);
    if (outs == 3) out.c_last = last.c.data_as<float>(), out.n_last = last.n.data_as<float>(), out.m_last = last.m.data_as<float>();
  }
  tune::OutputsFn borrowed(const Problem& p) const {
    return tune::borrowed_outputs({{"h", out.h, DType::kF32, {p.B, p.NH, p.S, p.DV}},
                                   {"c_last", out.c_last, DType::kF32, {p.B, p.NH, p.DK, p.DV}},
                                   {"n_last", out.n_last, DType::kF32, {p.B, p.NH, p.DK}},
                                   {"m_last", out.m_last, DType::kF32, {p.B, p.NH}}});
  }
};

// dh, the upstream gradients of the last states and the gradients checked.
void check_backward_args(const Inputs& in, const Prepared& r, const Options& opt, const TensorView& dh, const Grads& g,
                         const TensorView& dc_last, const TensorView& dn_last) {
  const Problem& p = r.p;
  need_shape("dh", dh, {p.B, p.NH, p.S, p.DV}, p.device);
  need_dtype_or_f32("dh", dh, r.qkv);
  if (given(dc_last)) need_shape("dc_last", dc_last, {p.B, p.NH, p.DK, p.DV}, p.device), need_f32("dc_last", dc_last);
  if (given(dn_last)) need_shape("dn_last", dn_last, {p.B, p.NH, p.DK}, p.device), need_f32("dn_last", dn_last);
  need_shape("dq", g.dq, in.q.shape, p.device), need_dtype_or_f32("dq", g.dq, r.qkv);
  need_shape("dk", g.dk, in.k.shape, p.device), need_dtype_or_f32("dk", g.dk, r.qkv);
  need_shape("dv", g.dv, in.v.shape, p.device), need_dtype_or_f32("dv", g.dv, r.qkv);
  need_shape("di", g.di, in.i.shape, p.device), need_dtype_or_f32("di", g.di, r.gates);
  need_shape("df", g.df, in.f.shape, p.device), need_dtype_or_f32("df", g.df, r.gates);
  const bool state = given(in.c0);
  if (state != given(g.dc0) || state != given(g.dn0))
    fail(state ? "dc0 and dn0 are required with an initial state" : "dc0 and dn0 are written only with an initial state");
  if (state) {
    need_shape("dc0", g.dc0, in.c0.shape, p.device), need_f32("dc0", g.dc0);
    need_shape("dn0", g.dn0, in.n0.shape, p.device), need_f32("dn0", g.dn0);
  }
  if (opt.check_finite && !dispatch::all_finite(dh)) fail("dh contains NaN or Inf");
}

// The backward's arguments as the backends take them (f32 copies and scratch where needed; device
// calls: nothing converted, dc_last, dn_last are f32).
struct BackwardBind {
  F32In dh32, dcl, dnl;
  F32Out dq, dk, dv, di, df;
  BackwardArgs a;
  BackwardBind(const Inputs& in, const Problem& p, const TensorView& dh, const Grads& g, const TensorView& dc_last,
               const TensorView& dn_last) {
    const bool dev = on_device(p);
    if (!dev) {
      dh32 = as_f32(dh);
      dq = as_f32_out(g.dq), dk = as_f32_out(g.dk), dv = as_f32_out(g.dv), di = as_f32_out(g.di), df = as_f32_out(g.df);
    } else {
      a.dh_dev = dev_in(dh);
      a.dq_dev = dev_out(g.dq), a.dk_dev = dev_out(g.dk), a.dv_dev = dev_out(g.dv);
      a.di_dev = dev_out(g.di), a.df_dev = dev_out(g.df);
    }
    dcl = as_f32(dc_last), dnl = as_f32(dn_last);
    a.dh = dh32.ptr, a.dc_last = dcl.ptr, a.dn_last = dnl.ptr;
    a.dq = dq.ptr, a.dk = dk.ptr, a.dv = dv.ptr, a.di = di.ptr, a.df = df.ptr;
    if (given(in.c0)) a.dc0 = g.dc0.data_as<float>(), a.dn0 = g.dn0.data_as<float>();
  }
  tune::OutputsFn borrowed(const Problem& p) const {
    const Shape qk{p.B, p.NH, p.S, p.DK}, gs{p.B, p.NH, p.S};
    return tune::borrowed_outputs({{"dq", a.dq, DType::kF32, qk}, {"dk", a.dk, DType::kF32, qk},
                                   {"dv", a.dv, DType::kF32, {p.B, p.NH, p.S, p.DV}},
                                   {"di", a.di, DType::kF32, gs}, {"df", a.df, DType::kF32, gs},
                                   {"dc0", a.dc0, DType::kF32, {p.B, p.NH, p.DK, p.DV}},
                                   {"dn0", a.dn0, DType::kF32, {p.B, p.NH, p.DK}}});
  }
  void finish() const {
    for (const F32Out* o : {&dq, &dk, &dv, &di, &df}) o->finish();
  }
};

}  // namespace

std::string forward(const Inputs& in, const TensorView& h, const LastStates& last, const Options& opt) {
  Prepared r;
  prepare(in, opt, r);
  const Problem& p = r.p;
  const int outs = check_forward_outputs(r, h, last);
  convert(in, r);
  const ForwardBind fb(p, h, last, outs);
  const std::string ran = run(p, opt.implementation, [&](const Implementation& impl) {
    const auto once = [&](const Problem& t) { impl.forward(t, fb.out); };
    once(with_chunk(p, impl, r.qkv, Pass::kForward, opt, once, fb.borrowed(p)));
  });
  fb.h.finish();
  return ran;
}

std::string backward(const Inputs& in, const TensorView& dh, const Grads& g, const Options& opt,
                     const TensorView& dc_last, const TensorView& dn_last) {
  Prepared r;
  prepare(in, opt, r);
  const Problem& p = r.p;
  check_backward_args(in, r, opt, dh, g, dc_last, dn_last);
  convert(in, r);
  const BackwardBind bb(in, p, dh, g, dc_last, dn_last);
  const std::string ran = run(p, opt.implementation, [&](const Implementation& impl) {
    const auto once = [&](const Problem& t) { impl.backward(t, bb.a); };
    once(with_chunk(p, impl, r.qkv, Pass::kBackward, opt, once, bb.borrowed(p)));
  });
  bb.finish();
  return ran;
}

std::string forward_backward(const Inputs& in, const TensorView& h, const LastStates& last, const TensorView& dh,
                             const Grads& g, const Options& opt, const TensorView& dc_last, const TensorView& dn_last) {
  Prepared r;
  prepare(in, opt, r);
  const Problem& p = r.p;
  const int outs = check_forward_outputs(r, h, last);
  check_backward_args(in, r, opt, dh, g, dc_last, dn_last);
  convert(in, r);
  const ForwardBind fb(p, h, last, outs);
  const BackwardBind bb(in, p, dh, g, dc_last, dn_last);
  const std::string ran = run(p, opt.implementation, [&](const Implementation& impl) {
    const auto once = [&](const Problem& t) { impl.forward_backward(t, fb.out, bb.a); };
    const tune::OutputsFn fo = fb.borrowed(p), bo = bb.borrowed(p);
    const tune::OutputsFn both = [fo, bo] {
      auto v = fo(), w = bo();
      v.insert(v.end(), w.begin(), w.end());
      return v;
    };
    once(with_chunk(p, impl, r.qkv, Pass::kFused, opt, once, both));
  });
  fb.h.finish();
  bb.finish();
  return ran;
}

}  // namespace tessera::mlstm
