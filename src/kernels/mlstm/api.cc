// mlstm: validation (every tensor declared once: tensors()), conversion to the f32 Problem (host
// calls; a device call hands its arrays over unconverted: impl.h), dispatch with the declared
// chunk tuning. Every check runs before any output is touched.
#include <cmath>
#include <vector>

#include "dispatch/declared_tensors.h"
#include "dispatch/host_f32.h"
#include "kernels/mlstm/impl.h"
#include "tune/declared.h"

namespace tessera::mlstm {

// Every tensor declared once (dispatch/declared_tensors.h: the CLI's flags, the Python keywords
// and the help derive from it too); all on q's device (host memory, or one CUDA device for the
// cuda backend).
const dispatch::DeclaredTensors<Inputs>& tensors() {
  static const dispatch::DeclaredTensors<Inputs> t{
      kKernelName,
      {{&Inputs::q, {"q", "B,NH,S,DHQK", "float"}, "queries", true, true},
       {&Inputs::k, {"k", "B,NH,S,DHQK", "=q"}, "keys", true, true},
       {&Inputs::v, {"v", "B,NH,S,DHV", "=q"}, "values", true, true},
       {&Inputs::i, {"i", "B,NH,S", "float"}, "input gate pre-activations", true, true},
       {&Inputs::f, {"f", "B,NH,S", "=i"}, "forget gate pre-activations", true, true},
       {&Inputs::resets, {"resets", "B,S", "int"},
        "reset mask: nonzero starts step t from the zero state (bool/uint8 .npy files load as integers)", false},
       {&Inputs::c0, {"c0", "B,NH,DHQK,DHV", "f32"}, "initial matrix memory; with n0 and m0", false, true},
       {&Inputs::n0, {"n0", "B,NH,DHQK", "f32"}, "initial normalizer", false, true},
       {&Inputs::m0, {"m0", "B,NH", "f32"}, "initial stabilizer; no gradient", false}},
      {{"h", "B,NH,S,DHV", "=q|f32"},         {"c_last", "B,NH,DHQK,DHV", "f32"},  {"n_last", "B,NH,DHQK", "f32"},
       {"m_last", "B,NH", "f32"},             {"dh", "B,NH,S,DHV", "=q|f32"},      {"dc_last", "B,NH,DHQK,DHV", "f32"},
       {"dn_last", "B,NH,DHQK", "f32"},       {"dq", "B,NH,S,DHQK", "=q|f32"},     {"dk", "B,NH,S,DHQK", "=q|f32"},
       {"dv", "B,NH,S,DHV", "=q|f32"},        {"di", "B,NH,S", "=i|f32"},          {"df", "B,NH,S", "=i|f32"},
       {"dc0", "B,NH,DHQK,DHV", "f32"},       {"dn0", "B,NH,DHQK", "f32"}}};
  return t;
}

namespace {

using dispatch::as_f32;
using dispatch::as_f32_out;
using dispatch::F32In;
using dispatch::F32Out;
using dispatch::given;
using dispatch::num;

const dispatch::ArgCheck& args() { return tensors().args(); }

bool on_device(const Problem& p) { return p.device.type != DeviceType::kCPU; }
DevIn dev_in(const TensorView& t) { return {given(t) ? t.data : nullptr, t.dtype}; }
DevOut dev_out(const TensorView& t) { return {t.data, t.dtype}; }
// An output the backends write in f32 (the caller's, or the scratch stored back after the call).
tune::Buffer f32_buffer(const char* name, const F32Out& o) { return {name, o.ptr, DType::kF32, o.user.shape}; }

// One call: its bound dims, its Problem and what the API owns for it (f32 copies of inputs and
// f32 scratch for outputs in other dtypes, resets as 0/1 bytes). The Problem points into it: not
// copied. Every check (constructor, check_forward, check_backward) runs before convert and bind.
struct Call {
  dispatch::Dims d;
  Problem p;
  F32In q, k, v, i, f, c0, n0, m0, dh, dcl, dnl;
  F32Out h, dq, dk, dv, di, df;
  std::vector<uint8_t> resets;
  ForwardOut out;
  BackwardArgs a;
  std::vector<tune::Buffer> outs;  // the f32 outputs the backends write, for autotune-on-miss
  dispatch::ArgCheck::Named written, read;  // outputs and upstream gradients, for tensors().apart

  Call(const Inputs& in, const Options& opt) : d(tensors().bind(in, dispatch::BindMode::kFull)) {
    p.B = d["B"], p.NH = d["NH"], p.S = d["S"], p.DK = d["DHQK"], p.DV = d["DHV"];
    args().need(p.S >= 1, "S must be >= 1 (q is " + in.q.str() + ")");
    args().need(p.B >= 1 && p.NH >= 1 && p.DK >= 1 && p.DV >= 1,
                "B, NH, DHQK and DHV must be >= 1, got q " + in.q.str() + ", v " + in.v.str());
    args().together({{"c0", in.c0}, {"n0", in.n0}, {"m0", in.m0}});
    args().nonnegative_f32(opt.eps, "eps");
    args().need(opt.chunk_size >= 0, "chunk_size must be >= 1 (0: the backend's default), got " + num(opt.chunk_size));
    if (opt.check_finite) tensors().check_finite(in);
    p.device = d.device();
    p.eps = opt.eps;
    p.chunk = opt.chunk_size;
    p.num_threads = resolve_num_threads(opt.num_threads);
    p.stream = opt.stream;
  }
  void check(const char* name, const TensorView& t, bool output = true) {
    dispatch::check_rule(d, tensors().rules(), name, t), (output ? written : read).emplace_back(name, t);
  }

  // h and the last states (c, n, m: all three or none).
  void check_forward(const TensorView& h_view, const LastStates& last) {
    check("h", h_view);
    if (args().together({{"c_last", last.c}, {"n_last", last.n}, {"m_last", last.m}}))
      check("c_last", last.c), check("n_last", last.n), check("m_last", last.m);
  }

  // dh, the upstream gradients of the last states and the gradients.
  void check_backward(const Inputs& in, const Options& opt, const TensorView& dh_view, const Grads& g,
                      const TensorView& dc_last, const TensorView& dn_last) {
    check("dh", dh_view, false);
    if (given(dc_last)) check("dc_last", dc_last, false);
    if (given(dn_last)) check("dn_last", dn_last, false);
    check("dq", g.dq), check("dk", g.dk), check("dv", g.dv), check("di", g.di), check("df", g.df);
    if (args().exactly_with(given(in.c0), "an initial state", {{"dc0", g.dc0}, {"dn0", g.dn0}}))
      check("dc0", g.dc0), check("dn0", g.dn0);
    if (opt.check_finite)  // host data; absent ones (null) pass
      for (auto [t, what] : {std::pair{&dh_view, "dh"}, {&dc_last, "dc_last"}, {&dn_last, "dn_last"}}) args().finite(*t, what);
  }

  // The inputs as the backends take them: f32 host arrays, or a device call's own (impl.h).
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
    p.resets = dispatch::as_flags(in.resets, resets);
  }

  // The forward's outputs (h through an f32 scratch where it is not f32; the states are f32).
  void bind_forward(const TensorView& h_view, const LastStates& last) {
    if (!on_device(p)) h = as_f32_out(h_view);
    out.h = h.ptr;
    if (on_device(p)) out.h_dev = dev_out(h_view);
    out.c_last = last.c.data_as<float>(), out.n_last = last.n.data_as<float>(), out.m_last = last.m.data_as<float>();
    outs.insert(outs.end(), {f32_buffer("h", h), tune::buffer_of("c_last", last.c), tune::buffer_of("n_last", last.n),
                             tune::buffer_of("m_last", last.m)});
  }

  // The backward's arguments (f32 copies and scratch where needed; device calls: nothing converted).
  void bind_backward(const TensorView& dh_view, const Grads& g, const TensorView& dc_last, const TensorView& dn_last) {
    if (on_device(p)) {
      a.dh_dev = dev_in(dh_view);
      a.dq_dev = dev_out(g.dq), a.dk_dev = dev_out(g.dk), a.dv_dev = dev_out(g.dv);
      a.di_dev = dev_out(g.di), a.df_dev = dev_out(g.df);
    } else {
      dh = as_f32(dh_view);
      dq = as_f32_out(g.dq), dk = as_f32_out(g.dk), dv = as_f32_out(g.dv), di = as_f32_out(g.di), df = as_f32_out(g.df);
    }
    dcl = as_f32(dc_last), dnl = as_f32(dn_last);
    a.dh = dh.ptr, a.dc_last = dcl.ptr, a.dn_last = dnl.ptr;
    a.dq = dq.ptr, a.dk = dk.ptr, a.dv = dv.ptr, a.di = di.ptr, a.df = df.ptr;
    a.dc0 = g.dc0.data_as<float>(), a.dn0 = g.dn0.data_as<float>();
    outs.insert(outs.end(), {f32_buffer("dq", dq), f32_buffer("dk", dk), f32_buffer("dv", dv), f32_buffer("di", di),
                             f32_buffer("df", df), tune::buffer_of("dc0", g.dc0), tune::buffer_of("dn0", g.dn0)});
  }

  // Runs `pass` on the implementation the registry picks, at the chunk length it takes: the call's
  // (chunk_size > 0), else the tuned table's, else autotune-on-miss (timing `run` itself into
  // `outs`), else the default; then stores the f32 scratch back in the caller's dtypes. First: no
  // output aliases an input or another output (an in-place c_last = c0 is a copy first).
  template <class Run>
  std::string run(const Inputs& in, const Options& opt, Pass pass, Run&& body) {
    tensors().apart(in, written, read);
    const tune::DeclaredCall c{.dtype = d.dtype("=q"),
                               .dims = {p.B, p.NH, p.S, p.DK, p.DV},
                               .pass = pass,
                               .threads = p.num_threads,
                               .given = {{"chunk_size", p.chunk}}};
    const std::string ran = tune::dispatch_declared(registry(), tuning(), opt, p, c, outs,
                                                    tune::with_param(p, &Problem::chunk, "chunk_size"), body);
    for (const F32Out* o : {&h, &dq, &dk, &dv, &di, &df}) o->finish();
    return ran;
  }
};

}  // namespace

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

std::string forward(const Inputs& in, const TensorView& h, const LastStates& last, const Options& opt) {
  Call c(in, opt);
  c.check_forward(h, last);
  c.convert(in), c.bind_forward(h, last);
  return c.run(in, opt, Pass::kForward, [&](const Implementation& impl, const Problem& t) { impl.forward(t, c.out); });
}

std::string backward(const Inputs& in, const TensorView& dh, const Grads& g, const Options& opt,
                     const TensorView& dc_last, const TensorView& dn_last) {
  Call c(in, opt);
  c.check_backward(in, opt, dh, g, dc_last, dn_last);
  c.convert(in), c.bind_backward(dh, g, dc_last, dn_last);
  return c.run(in, opt, Pass::kBackward, [&](const Implementation& impl, const Problem& t) { impl.backward(t, c.a); });
}

// The cpu backend forms the chunk states once for both passes.
std::string forward_backward(const Inputs& in, const TensorView& h, const LastStates& last, const TensorView& dh,
                             const Grads& g, const Options& opt, const TensorView& dc_last, const TensorView& dn_last) {
  Call c(in, opt);
  c.check_forward(h, last), c.check_backward(in, opt, dh, g, dc_last, dn_last);
  c.convert(in), c.bind_forward(h, last), c.bind_backward(dh, g, dc_last, dn_last);
  return c.run(in, opt, Pass::kFused, [&](const Implementation& impl, const Problem& t) {
    impl.forward_backward(t, c.out, c.a);
  });
}

}  // namespace tessera::mlstm
