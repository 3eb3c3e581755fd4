// slstm: validation and dispatch. Every check runs before any output is touched.
#include <cmath>
#include <vector>

#include "dispatch/arg_check.h"
#include "dispatch/host_f32.h"
#include "kernels/slstm/impl.h"
#include "tune/declared.h"
#include "tessera/error.h"

namespace tessera::slstm {
namespace {

using dispatch::given;
using dispatch::num;
const dispatch::ArgCheck args{kKernelName, "wx"};


// n is the normalizer of c (h = sigmoid(ō)·c/n): n_t = F·n_{t-1} + I stays > 0 from any n0 > 0 (one of
// I, F is 1), but n0 <= 0 gives n_t = 0 wherever I underflows: h = c/0. Host data is checked here;
// device data is not inspected (as with check_finite): a zero there divides by zero, as in the reference.
void require_positive_n0(const TensorView& n0) {
  if (n0.device.type != DeviceType::kCPU) return;
  for (int64_t i = 0; i < n0.numel(); ++i) {
    const float v = n0.data_as<const float>()[i];
    if (!(v > 0.0f))
      args.fail("n0 must be > 0 everywhere (the normalizer of c; n0 <= 0 can make h = c/0), got n0[" + num(i) + "] = " +
          std::to_string(v));
  }
}

// What the API owns for one call: the resets as 0/1 bytes, dh in f32.
struct Owned {
  std::vector<uint8_t> resets;
  dispatch::F32In dh;
};

Problem normalize(const Inputs& in, const Options& opt, Owned& own) {
  const TensorView& wx = in.wx;
  if (wx.ndim() != 5 || wx.shape[2] != 4) args.fail("wx must be [B, S, 4, NH, DH] (gates i, f, z, o), got " + shape_str(wx.shape));
  args.floating(wx, "wx");
  Problem p;
  p.B = wx.shape[0], p.S = wx.shape[1], p.NH = wx.shape[3], p.DH = wx.shape[4];
  if (p.S == 0) args.fail("S = 0: a sequence needs at least one step");
  if (p.B == 0 || p.NH == 0 || p.DH == 0) args.fail("wx has an empty dimension: " + shape_str(wx.shape));
  p.dtype = wx.dtype;
  p.device = wx.device;
  args.plain(wx, p.device, "wx");
  args.tensor(in.r, p.device, {4, p.NH, p.DH, p.DH}, p.dtype, "r");
  args.tensor(in.b, p.device, {4, p.NH, p.DH}, p.dtype, "b");
  p.wx = wx.data, p.r = in.r.data, p.b = in.b.data;
  if (given(in.resets)) {
    const TensorView& rs = in.resets;
    // Tessera's DType has no bool or uint8 yet: masks come as int32 / int64 (callers cast).
    args.integer(rs, "resets");
    if (rs.shape != Shape{p.B, p.S}) args.fail("resets must be [B, S] = " + shape_str({p.B, p.S}) + ", got " + shape_str(rs.shape));
    args.host(rs, "resets");  // the API converts them; a device backend copies them
    own.resets.assign(static_cast<size_t>(p.B * p.S), 0);
    for (int64_t i = 0; i < p.B * p.S; ++i)
      own.resets[static_cast<size_t>(i)] = rs.dtype == DType::kI32 ? rs.data_as<const int32_t>()[i] != 0
                                                                   : rs.data_as<const int64_t>()[i] != 0;
    p.resets = own.resets.data();
  }
  const int init = given(in.h0) + given(in.c0) + given(in.n0) + given(in.m0);
  if (init != 0 && init != 4) args.fail("an initial state is h0, c0, n0 and m0 together, got " + num(init) + " of them");
  const Shape state{p.B, p.NH, p.DH};
  if (init == 4) {
    args.tensor(in.h0, p.device, state, DType::kF32, "h0");
    args.tensor(in.c0, p.device, state, DType::kF32, "c0");
    args.tensor(in.n0, p.device, state, DType::kF32, "n0");
    args.tensor(in.m0, p.device, state, DType::kF32, "m0");
    p.h0 = in.h0.data_as<const float>(), p.c0 = in.c0.data_as<const float>();
    p.n0 = in.n0.data_as<const float>(), p.m0 = in.m0.data_as<const float>();
    require_positive_n0(in.n0);
  }
  if (opt.check_finite)
    for (const auto* t : {&in.wx, &in.r, &in.b, &in.h0, &in.c0, &in.n0, &in.m0})
      if (!dispatch::all_finite(*t)) args.fail("an input contains NaN or Inf");
  p.num_threads = resolve_num_threads(opt.num_threads);
  if (opt.batch_block < 0)
    args.fail("batch_block must be >= 1 (0: tuned or the default), got " + num(opt.batch_block));
  p.batch_block = opt.batch_block;
  p.stream = opt.stream;
  return p;
}

void set_outputs(Problem& p, const Outputs& out) {
  const Shape state{p.B, p.NH, p.DH};
  args.tensor(out.h, p.device, {p.B, p.S, p.NH, p.DH}, DType::kF32, "h");
  p.h = out.h.data_as<float>();
  const int last = given(out.h_last) + given(out.c_last) + given(out.n_last) + given(out.m_last);
  if (last != 0 && last != 4) args.fail("the last state is h_last, c_last, n_last and m_last together, got " + num(last));
  if (last == 0) return;
  args.tensor(out.h_last, p.device, state, DType::kF32, "h_last");
  args.tensor(out.c_last, p.device, state, DType::kF32, "c_last");
  args.tensor(out.n_last, p.device, state, DType::kF32, "n_last");
  args.tensor(out.m_last, p.device, state, DType::kF32, "m_last");
  p.h_last = out.h_last.data_as<float>(), p.c_last = out.c_last.data_as<float>();
  p.n_last = out.n_last.data_as<float>(), p.m_last = out.m_last.data_as<float>();
}

void set_backward(Problem& p, const Inputs& in, const Upstream& up, const Grads& g, const Options& opt, Owned& own) {
  const Shape state{p.B, p.NH, p.DH};
  const Shape hs{p.B, p.S, p.NH, p.DH};
  if (up.dh.shape != hs) args.fail("dh must have h's shape " + shape_str(hs) + ", got " + shape_str(up.dh.shape));
  if (up.dh.dtype != DType::kF32 && up.dh.dtype != p.dtype)
    args.fail("dh must be f32 or the inputs' dtype, got " + std::string(dtype_name(up.dh.dtype)));
  args.plain(up.dh, p.device, "dh");
  if (opt.check_finite) args.finite(up.dh, "dh");
  auto opt_state = [&](const TensorView& t, const char* what) -> const float* {
    if (!given(t)) return nullptr;
    args.tensor(t, p.device, state, DType::kF32, what);
    return t.data_as<const float>();
  };
  p.dh_last = opt_state(up.dh_last, "dh_last");
  p.dc_last = opt_state(up.dc_last, "dc_last");
  p.dn_last = opt_state(up.dn_last, "dn_last");
  args.tensor(g.dwx, p.device, in.wx.shape, p.dtype, "dwx");
  args.tensor(g.dr, p.device, in.r.shape, p.dtype, "dr");
  args.tensor(g.db, p.device, in.b.shape, p.dtype, "db");
  p.dwx = g.dwx.data, p.dr = g.dr.data, p.db = g.db.data;
  const int d0 = given(g.dh0) + given(g.dc0) + given(g.dn0);
  if (p.has_initial() && d0 != 3) args.fail("with an initial state, dh0, dc0 and dn0 are required");
  if (!p.has_initial() && d0 != 0) args.fail("dh0, dc0 and dn0 are written only with an initial state (h0, c0, n0, m0)");
  if (p.has_initial()) {
    args.tensor(g.dh0, p.device, state, DType::kF32, "dh0");
    args.tensor(g.dc0, p.device, state, DType::kF32, "dc0");
    args.tensor(g.dn0, p.device, state, DType::kF32, "dn0");
    p.dh0 = g.dh0.data_as<float>(), p.dc0 = g.dc0.data_as<float>(), p.dn0 = g.dn0.data_as<float>();
  }
  p.dh_given = up.dh.data, p.dh_dtype = up.dh.dtype;
  if (up.dh.dtype == DType::kF32 || p.device.type == DeviceType::kCPU) {  // rounded values widened once
    own.dh = dispatch::as_f32(up.dh);
    p.dh = own.dh.ptr;
  }
  p.backward = true;
}

// Runs `p` with the batch block its implementation takes: the call's (> 0), else the tuned table's,
// else autotune-on-miss (timing the implementation on this call), else the default.
std::string dispatch_call(const Problem& p, const Options& opt) {
  tune::DeclaredCall c;
  c.dtype = p.dtype;
  c.dims = {p.B, p.S, p.NH, p.DH};
  c.pass = p.backward ? (p.h ? Pass::kFused : Pass::kBackward) : Pass::kForward;
  c.threads = p.num_threads;
  c.given = {{"batch_block", p.batch_block}};
  const Shape st{p.B, p.NH, p.DH};
  const std::vector<tune::Buffer> outs = {
      {"h", p.h, DType::kF32, {p.B, p.S, p.NH, p.DH}}, {"h_last", p.h_last, DType::kF32, st},
      {"c_last", p.c_last, DType::kF32, st}, {"n_last", p.n_last, DType::kF32, st},
      {"m_last", p.m_last, DType::kF32, st}, {"dwx", p.dwx, p.dtype, {p.B, p.S, 4, p.NH, p.DH}},
      {"dr", p.dr, p.dtype, {4, p.NH, p.DH, p.DH}}, {"db", p.db, p.dtype, {4, p.NH, p.DH}},
      {"dh0", p.dh0, DType::kF32, st}, {"dc0", p.dc0, DType::kF32, st}, {"dn0", p.dn0, DType::kF32, st}};
  const auto at = [&p](const tune::Params& cand) {
    Problem q = p;
    q.batch_block = tune::param(cand, "batch_block").value_or(0);
    return q;
  };
  return tune::dispatch_declared(registry(), tuning(), opt, p, c, outs, at,
                                 [](const Implementation& impl, const Problem& q) { impl.run(q); });
}

}  // namespace

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

std::string forward(const Inputs& in, const Outputs& out, const Options& opt) {
  Owned own;
  Problem p = normalize(in, opt, own);
  set_outputs(p, out);
  return dispatch_call(p, opt);
}

std::string backward(const Inputs& in, const Upstream& up, const Grads& grads, const Options& opt) {
  Owned own;
  Problem p = normalize(in, opt, own);
  set_backward(p, in, up, grads, opt, own);
  return dispatch_call(p, opt);
}

std::string forward_backward(const Inputs& in, const Upstream& up, const Outputs& out, const Grads& grads,
                             const Options& opt) {
  Owned own;
  Problem p = normalize(in, opt, own);
  set_outputs(p, out);
  set_backward(p, in, up, grads, opt, own);
  return dispatch_call(p, opt);
}

}  // namespace tessera::slstm
