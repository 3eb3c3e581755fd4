// slstm: validation (every tensor declared once: tensors()) and dispatch. Every check runs before
// any output is touched.
#include <string>
#include <vector>

#include "dispatch/declared_tensors.h"
#include "dispatch/host_f32.h"
#include "kernels/slstm/impl.h"
#include "tune/declared.h"

namespace tessera::slstm {

// Every tensor declared once (dispatch/declared_tensors.h: the CLI's flags, the Python keywords
// and the help derive from it too); all on wx's device but the resets (read on the host: a device
// backend copies them).
const dispatch::DeclaredTensors<Inputs>& tensors() {
  static const dispatch::DeclaredTensors<Inputs> t{
      kKernelName,
      {{&Inputs::wx, {"wx", "B,S,4,NH,DH", "float"}, "gate pre-activations; gates (i, f, z, o)", true, true},
       {&Inputs::r, {"r", "4,NH,DH,DH", "=wx"}, "head-wise recurrent weights", true, true},
       {&Inputs::b, {"b", "4,NH,DH", "=wx"}, "bias", true, true},
       {&Inputs::resets, {"resets", "B,S", "int", true}, "reset mask: nonzero resets before step t >= 1", false},
       {&Inputs::h0, {"h0", "B,NH,DH", "f32"}, "initial h; with c0, n0, m0", false, true},
       {&Inputs::c0, {"c0", "B,NH,DH", "f32"}, "initial c", false, true},
       {&Inputs::n0, {"n0", "B,NH,DH", "f32"}, "initial n", false, true},
       {&Inputs::m0, {"m0", "B,NH,DH", "f32"}, "initial stabilizer m; no gradient", false}},
      {{"h", "B,S,NH,DH", "=wx|f32"},     {"h_last", "B,NH,DH", "f32"},  {"c_last", "B,NH,DH", "f32"},
       {"n_last", "B,NH,DH", "f32"},  {"m_last", "B,NH,DH", "f32"},  {"dh", "B,S,NH,DH", "=wx|f32"},
       {"dh_last", "B,NH,DH", "f32"}, {"dc_last", "B,NH,DH", "f32"}, {"dn_last", "B,NH,DH", "f32"},
       {"dwx", "B,S,4,NH,DH", "=wx"}, {"dr", "4,NH,DH,DH", "=wx"},   {"db", "4,NH,DH", "=wx"},
       {"dh0", "B,NH,DH", "f32"},     {"dc0", "B,NH,DH", "f32"},     {"dn0", "B,NH,DH", "f32"}}};
  return t;
}

namespace {

using dispatch::given;
using dispatch::num;

const dispatch::ArgCheck& args() { return tensors().args(); }

// One call: its bound dims, its Problem and what the API owns for it (the resets as 0/1 bytes, dh
// in f32). The Problem points into it: not copied.
struct Call {
  dispatch::Dims d;
  Problem p;
  std::vector<uint8_t> resets;
  dispatch::F32In dh;
  std::vector<tune::Buffer> outs;  // the outputs checked, for autotune-on-miss
  dispatch::ArgCheck::Named written, read;  // outputs and upstream gradients, for tensors().apart

  Call(const Inputs& in, const Options& opt) : d(tensors().bind(in, dispatch::BindMode::kFull)) {
    p.B = d["B"], p.S = d["S"], p.NH = d["NH"], p.DH = d["DH"];
    args().need(p.S > 0, "S = 0: a sequence needs at least one step");
    args().need(p.B > 0 && p.NH > 0 && p.DH > 0, "wx has an empty dimension: " + shape_str(in.wx.shape));
    // n is the normalizer of c (h = sigmoid(ō)·c/n): n_t = F·n_{t-1} + I stays > 0 from any n0 > 0
    // (one of I, F is 1), but n0 <= 0 gives n_t = 0 wherever I underflows: h = c/0. Host data only
    // (as check_finite): a zero on a device divides by zero, as in the reference.
    if (args().together({{"h0", in.h0}, {"c0", in.c0}, {"n0", in.n0}, {"m0", in.m0}}))
      args().positive(in.n0, "n0", "the normalizer of c; n0 <= 0 can make h = c/0");
    if (opt.check_finite) tensors().check_finite(in);
    args().need(opt.batch_block >= 0, "batch_block must be >= 1 (0: tuned or the default), got " + num(opt.batch_block));
    p.dtype = in.wx.dtype, p.device = d.device();
    p.wx = in.wx.data, p.r = in.r.data, p.b = in.b.data;
    p.h0 = in.h0.data_as<const float>(), p.c0 = in.c0.data_as<const float>();
    p.n0 = in.n0.data_as<const float>(), p.m0 = in.m0.data_as<const float>();
    p.resets = dispatch::as_flags(in.resets, resets);
    p.num_threads = resolve_num_threads(opt.num_threads);
    p.batch_block = opt.batch_block;
    p.stream = opt.stream;
  }
  void check(const char* name, const TensorView& t) { dispatch::check_rule(d, tensors().rules(), name, t); }
  const float* optional_input(const char* name, const TensorView& t) {
    if (given(t)) check(name, t), read.emplace_back(name, t);
    return t.data_as<const float>();
  }
  // Checks an output and keeps it for autotune-on-miss; its data as the backends take it.
  template <class T = float>
  T* output(const char* name, const TensorView& t) {
    check(name, t), outs.push_back(tune::buffer_of(name, t)), written.emplace_back(name, t);
    return t.data_as<T>();
  }

  Call& outputs(const Outputs& out) {
    p.h = output<void>("h", out.h), p.h_dtype = out.h.dtype;
    if (args().together({{"h_last", out.h_last}, {"c_last", out.c_last}, {"n_last", out.n_last}, {"m_last", out.m_last}}))
      p.h_last = output("h_last", out.h_last), p.c_last = output("c_last", out.c_last),
      p.n_last = output("n_last", out.n_last), p.m_last = output("m_last", out.m_last);
    return *this;
  }

  Call& backward(const Upstream& up, const Grads& g, const Options& opt) {
    check("dh", up.dh), read.emplace_back("dh", up.dh);
    p.dh_last = optional_input("dh_last", up.dh_last), p.dc_last = optional_input("dc_last", up.dc_last);
    p.dn_last = optional_input("dn_last", up.dn_last);
    for (auto [t, what] : {std::pair{&up.dh, "dh"}, {&up.dh_last, "dh_last"}, {&up.dc_last, "dc_last"}, {&up.dn_last, "dn_last"}})
      if (opt.check_finite) args().finite(*t, what);  // host data; absent ones (null) pass
    p.dwx = output<void>("dwx", g.dwx), p.dr = output<void>("dr", g.dr), p.db = output<void>("db", g.db);
    if (args().exactly_with(p.has_initial(), "an initial state (h0, c0, n0, m0)",
                            {{"dh0", g.dh0}, {"dc0", g.dc0}, {"dn0", g.dn0}}))
      p.dh0 = output("dh0", g.dh0), p.dc0 = output("dc0", g.dc0), p.dn0 = output("dn0", g.dn0);
    p.dh_given = up.dh.data, p.dh_dtype = up.dh.dtype;
    if (up.dh.dtype == DType::kF32 || p.device.type == DeviceType::kCPU) {  // rounded values widened once
      dh = dispatch::as_f32(up.dh);
      p.dh = dh.ptr;
    }
    p.backward = true;
    return *this;
  }

  // Runs `p` with the batch block its implementation takes: the call's (> 0), else the tuned
  // table's, else autotune-on-miss (timing the implementation on this call), else the default.
  // First: no output aliases an input or another output (an in-place h_last = h0 is a copy first).
  std::string run(const Inputs& in, const Options& opt) const {
    tensors().apart(in, written, read);
    const tune::DeclaredCall c{.dtype = p.dtype,
                               .dims = {p.B, p.S, p.NH, p.DH},
                               .pass = p.backward ? (p.h ? Pass::kFused : Pass::kBackward) : Pass::kForward,
                               .threads = p.num_threads,
                               .given = {{"batch_block", p.batch_block}}};
    return tune::dispatch_declared(registry(), tuning(), opt, p, c, outs,
                                   tune::with_param(p, &Problem::batch_block, "batch_block"),
                                   [](const Implementation& impl, const Problem& q) { impl.run(q); });
  }
};

}  // namespace

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

std::string forward(const Inputs& in, const Outputs& out, const Options& opt) {
  return Call(in, opt).outputs(out).run(in, opt);
}

std::string backward(const Inputs& in, const Upstream& up, const Grads& grads, const Options& opt) {
  return Call(in, opt).backward(up, grads, opt).run(in, opt);
}

std::string forward_backward(const Inputs& in, const Upstream& up, const Outputs& out, const Grads& grads,
                             const Options& opt) {
  return Call(in, opt).outputs(out).backward(up, grads, opt).run(in, opt);
}

}  // namespace tessera::slstm
