// slstm: validation (every tensor declared once: rules()) and dispatch. Every check runs before
// any output is touched.
#include <string>
#include <vector>

#include "dispatch/tensor_rules.h"
#include "dispatch/host_f32.h"
#include "kernels/slstm/impl.h"
#include "tune/declared.h"

namespace tessera::slstm {

// Every tensor on wx's device but the resets (read on the host: a device backend copies them).
const dispatch::TensorRules& rules() {
  static const dispatch::TensorRules r{
      kKernelName,
      {{"wx", "B,S,4,NH,DH", "float"}, {"r", "4,NH,DH,DH", "=wx"},      {"b", "4,NH,DH", "=wx"},
       {"resets", "B,S", "int", true}, {"h0", "B,NH,DH", "f32"},        {"c0", "B,NH,DH", "f32"},
       {"n0", "B,NH,DH", "f32"},       {"m0", "B,NH,DH", "f32"},        {"h", "B,S,NH,DH", "f32"},
       {"h_last", "B,NH,DH", "f32"},   {"c_last", "B,NH,DH", "f32"},    {"n_last", "B,NH,DH", "f32"},
       {"m_last", "B,NH,DH", "f32"},   {"dh", "B,S,NH,DH", "=wx|f32"},  {"dh_last", "B,NH,DH", "f32"},
       {"dc_last", "B,NH,DH", "f32"},  {"dn_last", "B,NH,DH", "f32"},   {"dwx", "B,S,4,NH,DH", "=wx"},
       {"dr", "4,NH,DH,DH", "=wx"},    {"db", "4,NH,DH", "=wx"},        {"dh0", "B,NH,DH", "f32"},
       {"dc0", "B,NH,DH", "f32"},      {"dn0", "B,NH,DH", "f32"}}};
  return r;
}

dispatch::Dims bind_inputs(const Inputs& in, dispatch::BindMode mode) {
  return rules().bind({{"wx", in.wx}, {"r", in.r}, {"b", in.b}, {"resets", in.resets}, {"h0", in.h0}, {"c0", in.c0},
                       {"n0", in.n0}, {"m0", in.m0}},
                      mode);
}

namespace {

using dispatch::given;
using dispatch::num;

const dispatch::ArgCheck& args() { return rules().args(); }

// n is the normalizer of c (h = sigmoid(ō)·c/n): n_t = F·n_{t-1} + I stays > 0 from any n0 > 0 (one of
// I, F is 1), but n0 <= 0 gives n_t = 0 wherever I underflows: h = c/0. Host data is checked here;
// device data is not inspected (as with check_finite): a zero there divides by zero, as in the reference.
void require_positive_n0(const TensorView& n0) {
  if (n0.device.type != DeviceType::kCPU) return;
  for (int64_t i = 0; i < n0.numel(); ++i) {
    const float v = n0.data_as<const float>()[i];
    if (!(v > 0.0f))
      args().fail("n0 must be > 0 everywhere (the normalizer of c; n0 <= 0 can make h = c/0), got n0[" + num(i) +
                  "] = " + std::to_string(v));
  }
}

// One call: its bound dims, its Problem and what the API owns for it (the resets as 0/1 bytes, dh
// in f32). The Problem points into it: not copied.
struct Call {
  dispatch::Dims d;
  Problem p;
  std::vector<uint8_t> resets;
  dispatch::F32In dh;
  std::vector<tune::Buffer> outs;  // the outputs checked, for autotune-on-miss

  Call(const Inputs& in, const Options& opt) : d(bind_inputs(in, dispatch::BindMode::kFull)) {
    p.B = d["B"], p.S = d["S"], p.NH = d["NH"], p.DH = d["DH"];
    args().need(p.S > 0, "S = 0: a sequence needs at least one step");
    args().need(p.B > 0 && p.NH > 0 && p.DH > 0, "wx has an empty dimension: " + shape_str(in.wx.shape));
    const int init = int(given(in.h0)) + int(given(in.c0)) + int(given(in.n0)) + int(given(in.m0));
    args().need(init == 0 || init == 4, "an initial state is h0, c0, n0 and m0 together, got " + num(init) + " of them");
    if (init == 4) require_positive_n0(in.n0);
    if (opt.check_finite)
      for (const auto* t : {&in.wx, &in.r, &in.b, &in.h0, &in.c0, &in.n0, &in.m0})
        args().need(dispatch::all_finite(*t), "an input contains NaN or Inf");
    args().need(opt.batch_block >= 0, "batch_block must be >= 1 (0: tuned or the default), got " + num(opt.batch_block));
    p.dtype = in.wx.dtype, p.device = d.device();
    p.wx = in.wx.data, p.r = in.r.data, p.b = in.b.data;
    p.h0 = in.h0.data_as<const float>(), p.c0 = in.c0.data_as<const float>();
    p.n0 = in.n0.data_as<const float>(), p.m0 = in.m0.data_as<const float>();
    if (given(in.resets)) {
      resets.resize(static_cast<size_t>(p.B * p.S));
      for (int64_t i = 0; i < p.B * p.S; ++i) resets[size_t(i)] = load_as_i64(in.resets.data, in.resets.dtype, i) != 0;
      p.resets = resets.data();
    }
    p.num_threads = resolve_num_threads(opt.num_threads);
    p.batch_block = opt.batch_block;
    p.stream = opt.stream;
  }
  void check(const char* name, const TensorView& t) { dispatch::check_rule(d, rules(), name, t); }
  void output(const char* name, const TensorView& t) { check(name, t), outs.push_back(tune::buffer_of(name, t)); }

  void outputs(const Outputs& out) {
    output("h", out.h);
    p.h = out.h.data_as<float>();
    const int last = int(given(out.h_last)) + int(given(out.c_last)) + int(given(out.n_last)) + int(given(out.m_last));
    args().need(last == 0 || last == 4, "the last state is h_last, c_last, n_last and m_last together, got " + num(last));
    if (last == 0) return;
    output("h_last", out.h_last), output("c_last", out.c_last);
    output("n_last", out.n_last), output("m_last", out.m_last);
    p.h_last = out.h_last.data_as<float>(), p.c_last = out.c_last.data_as<float>();
    p.n_last = out.n_last.data_as<float>(), p.m_last = out.m_last.data_as<float>();
  }

  void backward(const Upstream& up, const Grads& g, const Options& opt) {
    check("dh", up.dh);
    if (opt.check_finite) args().finite(up.dh, "dh");
    for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"dh_last", &up.dh_last},
                                  {"dc_last", &up.dc_last}, {"dn_last", &up.dn_last}})
      if (given(*t)) check(name, *t);
    p.dh_last = up.dh_last.data_as<const float>(), p.dc_last = up.dc_last.data_as<const float>();
    p.dn_last = up.dn_last.data_as<const float>();
    output("dwx", g.dwx), output("dr", g.dr), output("db", g.db);
    p.dwx = g.dwx.data, p.dr = g.dr.data, p.db = g.db.data;
    const int d0 = int(given(g.dh0)) + int(given(g.dc0)) + int(given(g.dn0));
    if (p.has_initial() && d0 != 3) args().fail("with an initial state, dh0, dc0 and dn0 are required");
    if (!p.has_initial() && d0 != 0) args().fail("dh0, dc0 and dn0 are written only with an initial state (h0, c0, n0, m0)");
    if (p.has_initial()) {
      output("dh0", g.dh0), output("dc0", g.dc0), output("dn0", g.dn0);
      p.dh0 = g.dh0.data_as<float>(), p.dc0 = g.dc0.data_as<float>(), p.dn0 = g.dn0.data_as<float>();
    }
    p.dh_given = up.dh.data, p.dh_dtype = up.dh.dtype;
    if (up.dh.dtype == DType::kF32 || p.device.type == DeviceType::kCPU) {  // rounded values widened once
      dh = dispatch::as_f32(up.dh);
      p.dh = dh.ptr;
    }
    p.backward = true;
  }

  // Runs `p` with the batch block its implementation takes: the call's (> 0), else the tuned
  // table's, else autotune-on-miss (timing the implementation on this call), else the default.
  std::string run(const Options& opt) const {
    const tune::DeclaredCall c{.dtype = p.dtype,
                               .dims = {p.B, p.S, p.NH, p.DH},
                               .pass = p.backward ? (p.h ? Pass::kFused : Pass::kBackward) : Pass::kForward,
                               .threads = p.num_threads,
                               .given = {{"batch_block", p.batch_block}}};
    const auto at = [this](const tune::Params& cand) {
      Problem q = p;
      q.batch_block = tune::param(cand, "batch_block").value_or(0);
      return q;
    };
    return tune::dispatch_declared(registry(), tuning(), opt, p, c, outs, at,
                                   [](const Implementation& impl, const Problem& q) { impl.run(q); });
  }
};

}  // namespace

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

std::string forward(const Inputs& in, const Outputs& out, const Options& opt) {
  Call c(in, opt);
  c.outputs(out);
  return c.run(opt);
}

std::string backward(const Inputs& in, const Upstream& up, const Grads& grads, const Options& opt) {
  Call c(in, opt);
  c.backward(up, grads, opt);
  return c.run(opt);
}

std::string forward_backward(const Inputs& in, const Upstream& up, const Outputs& out, const Grads& grads,
                             const Options& opt) {
  Call c(in, opt);
  c.outputs(out);
  c.backward(up, grads, opt);
  return c.run(opt);
}

}  // namespace tessera::slstm
