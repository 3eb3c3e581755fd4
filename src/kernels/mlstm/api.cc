// mlstm: validation (every tensor declared once: rules()), conversion to the f32 Problem (host
// calls; a device call hands its arrays over unconverted: impl.h), dispatch with the declared
// chunk tuning. Every check runs before any output is touched.
#include <cmath>
#include <vector>

#include "dispatch/glue_rnn.h"
#include "dispatch/host_f32.h"
#include "kernels/mlstm/impl.h"
#include "tune/declared.h"

namespace tessera::mlstm {

// Every tensor of a call lives on q's device (host memory, or one CUDA device for the cuda backend).
const dispatch::TensorRules& rules() {
  static const dispatch::TensorRules r{
      kKernelName,
      {{"q", "B,NH,S,DHQK", "float"},         {"k", "B,NH,S,DHQK", "=q"},          {"v", "B,NH,S,DHV", "=q"},
       {"i", "B,NH,S", "float"},              {"f", "B,NH,S", "=i"},               {"resets", "B,S", "int"},
       {"c0", "B,NH,DHQK,DHV", "f32"},        {"n0", "B,NH,DHQK", "f32"},          {"m0", "B,NH", "f32"},
       {"h", "B,NH,S,DHV", "=q|f32"},         {"c_last", "B,NH,DHQK,DHV", "f32"},  {"n_last", "B,NH,DHQK", "f32"},
       {"m_last", "B,NH", "f32"},             {"dh", "B,NH,S,DHV", "=q|f32"},      {"dc_last", "B,NH,DHQK,DHV", "f32"},
       {"dn_last", "B,NH,DHQK", "f32"},       {"dq", "B,NH,S,DHQK", "=q|f32"},     {"dk", "B,NH,S,DHQK", "=q|f32"},
       {"dv", "B,NH,S,DHV", "=q|f32"},        {"di", "B,NH,S", "=i|f32"},          {"df", "B,NH,S", "=i|f32"},
       {"dc0", "B,NH,DHQK,DHV", "f32"},       {"dn0", "B,NH,DHQK", "f32"}}};
  return r;
}

dispatch::Dims bind_inputs(const Inputs& in, dispatch::BindMode mode) {
  return rules().bind({{"q", in.q}, {"k", in.k}, {"v", in.v}, {"i", in.i}, {"f", in.f}, {"resets", in.resets},
                       {"c0", in.c0}, {"n0", in.n0}, {"m0", in.m0}},
                      mode);
}

namespace {

using dispatch::as_f32;
using dispatch::as_f32_out;
using dispatch::F32In;
using dispatch::F32Out;
using dispatch::given;
using dispatch::num;

const dispatch::ArgCheck& args() { return rules().args(); }

bool on_device(const Problem& p) { return p.device.type != DeviceType::kCPU; }
DevIn dev_in(const TensorView& t) { return {given(t) ? t.data : nullptr, t.dtype}; }
DevOut dev_out(const TensorView& t) { return {t.data, t.dtype}; }

// The validated inputs (in f32 once converted), with the Problem pointing into them.
struct Prepared {
  dispatch::Dims d;
  Problem p;
  F32In q, k, v, i, f, c0, n0, m0;
  std::vector<uint8_t> resets;

  Prepared(const Inputs& in, const Options& opt) : d(bind_inputs(in, dispatch::BindMode::kFull)) {
    p.B = d["B"], p.NH = d["NH"], p.S = d["S"], p.DK = d["DHQK"], p.DV = d["DHV"];
    args().need(p.S >= 1, "S must be >= 1 (q is " + in.q.str() + ")");
    args().need(p.B >= 1 && p.NH >= 1 && p.DK >= 1 && p.DV >= 1,
                "B, NH, DHQK and DHV must be >= 1, got q " + in.q.str() + ", v " + in.v.str());
    const int states = int(given(in.c0)) + int(given(in.n0)) + int(given(in.m0));
    args().need(states == 0 || states == 3, "c0, n0 and m0 go together: give all three or none");
    args().need(opt.eps >= 0.0 && std::isfinite(opt.eps), "eps must be finite and >= 0, got " + std::to_string(opt.eps));
    args().need(opt.chunk_size >= 0,
                "chunk_size must be >= 1 (0: the backend's default), got " + num(opt.chunk_size));
    if (opt.check_finite)
      for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"q", &in.q}, {"k", &in.k}, {"v", &in.v},
                                    {"i", &in.i}, {"f", &in.f}, {"c0", &in.c0}, {"n0", &in.n0}, {"m0", &in.m0}})
        args().finite(*t, name);
    p.device = d.device();
    p.eps = opt.eps;
    p.chunk = opt.chunk_size;
    p.num_threads = resolve_num_threads(opt.num_threads);
    p.stream = opt.stream;
  }
  DType qkv() const { return d.dtype("=q"); }
  void check(const char* name, const TensorView& t) { dispatch::check_rule(d, rules(), name, t); }

  // After every check passed.
  void convert(const Inputs& in) {
    if (on_device(p)) {  // nothing converted: the device backend reads every dtype
      p.dev = {dev_in(in.q), dev_in(in.k), dev_in(in.v), dev_in(in.i), dev_in(in.f), dev_in(in.resets)};
      p.c0 = in.c0.data_as<const float>(), p.n0 = in.n0.data_as<const float>(), p.m0 = in.m0.data_as<const float>();
      return;
    }
    q = as_f32(in.q), k = as_f32(in.k), v = as_f32(in.v), i = as_f32(in.i), f = as_f32(in.f);
    c0 = as_f32(in.c0), n0 = as_f32(in.n0), m0 = as_f32(in.m0);
    p.q = q.ptr, p.k = k.ptr, p.v = v.ptr, p.i = i.ptr, p.f = f.ptr;
    p.c0 = c0.ptr, p.n0 = n0.ptr, p.m0 = m0.ptr;
    if (!given(in.resets)) return;
    resets.resize(static_cast<size_t>(p.B * p.S));
    for (int64_t j = 0; j < p.B * p.S; ++j) resets[size_t(j)] = load_as_i64(in.resets.data, in.resets.dtype, j) != 0;
    p.resets = resets.data();
  }

  // Runs `pass` on the implementation the registry picks, at the chunk length it takes: the call's
  // (chunk_size > 0), else the tuned table's, else autotune-on-miss (timing `run` itself into
  // `outs`, the call's f32 buffers), else the default.
  template <class Run>
  std::string run_tuned(const Options& opt, Pass pass, const std::vector<tune::Buffer>& outs, Run&& run) const {
    tune::DeclaredCall c;
    c.dtype = qkv();
    c.dims = {p.B, p.NH, p.S, p.DK, p.DV};
    c.pass = pass;
    c.threads = p.num_threads;
    c.given = {{"chunk_size", p.chunk}};
    const auto at = [this](const tune::Params& cand) {
      Problem t = p;
      t.chunk = tune::param(cand, "chunk_size").value_or(0);
      return t;
    };
    return tune::dispatch_declared(registry(), tuning(), opt, p, c, outs, at, run);
  }
};

// h and the last states checked (before anything is converted or written); the count of last states.
int check_forward_outputs(Prepared& r, const TensorView& h, const LastStates& last) {
  r.check("h", h);
  const int outs = int(given(last.c)) + int(given(last.n)) + int(given(last.m));
  args().need(outs == 0 || outs == 3, "the last states c, n and m go together: give all three or none");
  if (outs == 3) r.check("c_last", last.c), r.check("n_last", last.n), r.check("m_last", last.m);
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
  std::vector<tune::Buffer> buffers(const Problem& p) const {
    return {{"h", out.h, DType::kF32, {p.B, p.NH, p.S, p.DV}},
            {"c_last", out.c_last, DType::kF32, {p.B, p.NH, p.DK, p.DV}},
            {"n_last", out.n_last, DType::kF32, {p.B, p.NH, p.DK}},
            {"m_last", out.m_last, DType::kF32, {p.B, p.NH}}};
  }
};

// dh, the upstream gradients of the last states and the gradients checked.
void check_backward_args(const Inputs& in, Prepared& r, const Options& opt, const TensorView& dh, const Grads& g,
                         const TensorView& dc_last, const TensorView& dn_last) {
  r.check("dh", dh);
  if (given(dc_last)) r.check("dc_last", dc_last);
  if (given(dn_last)) r.check("dn_last", dn_last);
  r.check("dq", g.dq), r.check("dk", g.dk), r.check("dv", g.dv), r.check("di", g.di), r.check("df", g.df);
  const bool state = given(in.c0);
  if (state != given(g.dc0) || state != given(g.dn0))
    args().fail(state ? "dc0 and dn0 are required with an initial state" : "dc0 and dn0 are written only with an initial state");
  if (state) r.check("dc0", g.dc0), r.check("dn0", g.dn0);
  if (opt.check_finite) args().finite(dh, "dh");
}

// The backward's arguments as the backends take them (f32 copies and scratch where needed; device
// calls: nothing converted, dc_last, dn_last are f32).
struct BackwardBind {
  F32In dh32, dcl, dnl;
  F32Out dq, dk, dv, di, df;
  BackwardArgs a;
  BackwardBind(const Inputs& in, const Problem& p, const TensorView& dh, const Grads& g, const TensorView& dc_last,
               const TensorView& dn_last) {
    if (!on_device(p)) {
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
  std::vector<tune::Buffer> buffers(const Problem& p) const {
    const Shape qk{p.B, p.NH, p.S, p.DK}, gs{p.B, p.NH, p.S};
    return {{"dq", a.dq, DType::kF32, qk}, {"dk", a.dk, DType::kF32, qk}, {"dv", a.dv, DType::kF32, {p.B, p.NH, p.S, p.DV}},
            {"di", a.di, DType::kF32, gs}, {"df", a.df, DType::kF32, gs},
            {"dc0", a.dc0, DType::kF32, {p.B, p.NH, p.DK, p.DV}}, {"dn0", a.dn0, DType::kF32, {p.B, p.NH, p.DK}}};
  }
  void finish() const {
    for (const F32Out* o : {&dq, &dk, &dv, &di, &df}) o->finish();
  }
};

}  // namespace

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

std::string forward(const Inputs& in, const TensorView& h, const LastStates& last, const Options& opt) {
  Prepared r(in, opt);
  const int outs = check_forward_outputs(r, h, last);
  r.convert(in);
  const ForwardBind fb(r.p, h, last, outs);
  const std::string ran = r.run_tuned(opt, Pass::kForward, fb.buffers(r.p),
                                     [&](const Implementation& impl, const Problem& t) { impl.forward(t, fb.out); });
  fb.h.finish();
  return ran;
}

std::string backward(const Inputs& in, const TensorView& dh, const Grads& g, const Options& opt,
                     const TensorView& dc_last, const TensorView& dn_last) {
  Prepared r(in, opt);
  check_backward_args(in, r, opt, dh, g, dc_last, dn_last);
  r.convert(in);
  const BackwardBind bb(in, r.p, dh, g, dc_last, dn_last);
  const std::string ran = r.run_tuned(opt, Pass::kBackward, bb.buffers(r.p),
                                     [&](const Implementation& impl, const Problem& t) { impl.backward(t, bb.a); });
  bb.finish();
  return ran;
}

std::string forward_backward(const Inputs& in, const TensorView& h, const LastStates& last, const TensorView& dh,
                             const Grads& g, const Options& opt, const TensorView& dc_last, const TensorView& dn_last) {
  Prepared r(in, opt);
  const int outs = check_forward_outputs(r, h, last);
  check_backward_args(in, r, opt, dh, g, dc_last, dn_last);
  r.convert(in);
  const ForwardBind fb(r.p, h, last, outs);
  const BackwardBind bb(in, r.p, dh, g, dc_last, dn_last);
  std::vector<tune::Buffer> outs_all = fb.buffers(r.p), grads = bb.buffers(r.p);
  outs_all.insert(outs_all.end(), grads.begin(), grads.end());
  const std::string ran = r.run_tuned(opt, Pass::kFused, outs_all, [&](const Implementation& impl, const Problem& t) {
    impl.forward_backward(t, fb.out, bb.a);
  });
  fb.h.finish();
  bb.finish();
  return ran;
}

}  // namespace tessera::mlstm
