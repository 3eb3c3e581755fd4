// mlstm: the check grid and parity against the reference.
#include "kernels/mlstm/testing.h"

#include <cmath>
#include <sstream>

#include "core/random.h"
#include "tessera/error.h"

namespace tessera::mlstm::testing {
namespace {

TensorView view_or_empty(const Tensor& t) { return t.defined() ? t.view() : TensorView{}; }

using harness::to_doubles;

using harness::nan_filled;

Tensor to_dev(const Tensor& t, Device dev) { return t.defined() ? t.to(dev) : Tensor{}; }

struct Outputs {
  Tensor h, c, n, m, dq, dk, dv, di, df, dc0, dn0;
  Outputs to(Device dev) const {
    return {to_dev(h, dev),  to_dev(c, dev),  to_dev(n, dev),  to_dev(m, dev),   to_dev(dq, dev), to_dev(dk, dev),
            to_dev(dv, dev), to_dev(di, dev), to_dev(df, dev), to_dev(dc0, dev), to_dev(dn0, dev)};
  }
};

Outputs make_outputs(const CaseSpec& s, const CaseData& d) {
  Outputs o;
  o.h = nan_filled(s.dtype, {s.B, s.NH, s.S, s.DV});
  o.c = nan_filled(DType::kF32, {s.B, s.NH, s.DK, s.DV});
  o.n = nan_filled(DType::kF32, {s.B, s.NH, s.DK});
  o.m = nan_filled(DType::kF32, {s.B, s.NH});
  o.dq = nan_filled(s.dtype, d.q.shape()), o.dk = nan_filled(s.dtype, d.k.shape()), o.dv = nan_filled(s.dtype, d.v.shape());
  o.di = nan_filled(DType::kF32, d.i.shape()), o.df = nan_filled(DType::kF32, d.f.shape());
  if (s.initial_state) o.dc0 = nan_filled(DType::kF32, d.c0.shape()), o.dn0 = nan_filled(DType::kF32, d.n0.shape());
  return o;
}

void run_one(const CaseSpec& s, const CaseData& d, const std::string& impl, Pass pass, Outputs& o) {
  Options opt = s.opt;
  opt.implementation = impl;
  const LastStates last = s.last_states ? LastStates{o.c.view(), o.n.view(), o.m.view()} : LastStates{};
  const Grads g{o.dq.view(), o.dk.view(), o.dv.view(), o.di.view(), o.df.view(), view_or_empty(o.dc0), view_or_empty(o.dn0)};
  const TensorView dcl = s.last_states ? d.dc_last.view() : TensorView{}, dnl = s.last_states ? d.dn_last.view() : TensorView{};
  if (pass == Pass::kFused) {  // the one-call path (cpu: the chunk states formed once for both)
    forward_backward(d.inputs(), o.h.view(), last, d.dh.view(), g, opt, dcl, dnl);
    return;
  }
  if (pass == Pass::kForward) forward(d.inputs(), o.h.view(), last, opt);
  if (pass == Pass::kBackward) backward(d.inputs(), d.dh.view(), g, opt, dcl, dnl);
}

}  // namespace

std::string CaseSpec::name() const {
  std::ostringstream o;
  o << label << "_B" << B << "NH" << NH << "S" << S << "DK" << DK << "DV" << DV << "_" << dtype_name(dtype)
    << (gate_dtype != DType::kF32 ? std::string("_gates_") + dtype_name(gate_dtype) : "") << "_r"
    << resets << (initial_state ? "_init" : "") << (last_states ? "" : "_nolast") << "_c" << opt.chunk_size;
  return o.str();
}

Inputs CaseData::inputs() const {
  return {q.view(), k.view(), v.view(), i.view(), f.view(), view_or_empty(resets), view_or_empty(c0),
          view_or_empty(n0), view_or_empty(m0)};
}

CaseData CaseData::to(Device dev) const {
  return {to_dev(q, dev),  to_dev(k, dev),  to_dev(v, dev),  to_dev(i, dev),  to_dev(f, dev),       to_dev(resets, dev),
          to_dev(c0, dev), to_dev(n0, dev), to_dev(m0, dev), to_dev(dh, dev), to_dev(dc_last, dev), to_dev(dn_last, dev)};
}

// `t` (f32) in dtype `dt`.
Tensor cast(const Tensor& t, DType dt) {
  if (dt == DType::kF32) return t;
  Tensor r = Tensor::empty(dt, t.shape());
  for (int64_t j = 0; j < t.numel(); ++j) store_from_f32(r.data(), dt, j, t.data_as<float>()[j]);
  return r;
}

CaseData make_case(const CaseSpec& s) {
  CaseData d;
  const uint64_t r = s.seed * 16;
  d.q = random_uniform(s.dtype, {s.B, s.NH, s.S, s.DK}, 1.0f, r + 1);
  d.k = random_uniform(s.dtype, {s.B, s.NH, s.S, s.DK}, 1.0f, r + 2);
  d.v = random_uniform(s.dtype, {s.B, s.NH, s.S, s.DV}, 1.0f, r + 3);
  d.i = random_uniform(DType::kF32, {s.B, s.NH, s.S}, s.gate_scale, r + 4);
  d.f = random_uniform(DType::kF32, {s.B, s.NH, s.S}, s.gate_scale, r + 5);
  for (int64_t j = 0; j < d.f.numel(); ++j) d.f.data_as<float>()[j] += 2.0f;
  d.i = cast(d.i, s.gate_dtype), d.f = cast(d.f, s.gate_dtype);
  d.dh = random_uniform(DType::kF32, {s.B, s.NH, s.S, s.DV}, 1.0f, r + 6);
  d.dc_last = random_uniform(DType::kF32, {s.B, s.NH, s.DK, s.DV}, 1.0f, r + 7);
  d.dn_last = random_uniform(DType::kF32, {s.B, s.NH, s.DK}, 1.0f, r + 8);
  if (s.initial_state) {
    d.c0 = random_uniform(DType::kF32, {s.B, s.NH, s.DK, s.DV}, 1.0f, r + 9);
    d.n0 = random_uniform(DType::kF32, {s.B, s.NH, s.DK}, 1.0f, r + 10);
    d.m0 = random_uniform(DType::kF32, {s.B, s.NH}, 1.0f, r + 11);
  }
  if (s.resets == "none") return d;
  d.resets = Tensor::zeros(DType::kI32, {s.B, s.S});
  const int64_t chunk = s.opt.chunk_size > 0 ? s.opt.chunk_size : 64;
  Tensor u = random_uniform(DType::kF32, {s.B, s.S}, 1.0f, r + 12);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.S; ++t) {
      int32_t& x = d.resets.data_as<int32_t>()[b * s.S + t];
      if (s.resets == "chunk") x = t % chunk == 0;
      else if (s.resets == "inside") x = t % chunk == chunk / 2 + b % 3;
      else if (s.resets == "every") x = 1;
      else if (s.resets == "pair")  // two in a row, and a pair straddling every chunk boundary
        x = t % 11 == 3 || t % 11 == 4 || t % chunk == chunk - 1 || (t % chunk == 0 && t > 0);
      else if (s.resets == "random") x = u.data_as<float>()[b * s.S + t] > 0.8f;
      else throw Error(ErrorCode::kInvalidArgument, "mlstm testing: unknown reset pattern " + s.resets);
    }
  return d;
}

// f32: the chunkwise form sums the same terms in another order, in f32 (exp(D − m) ≤ 1, so no
// cancellation beyond the dot products'): 2e-4 relative plus 1e-4 of the largest value covers
// S up to ~1000 with margin. bf16 / f16 outputs add their rounding (2 units of 2^-8 / 2^-11).
harness::Tolerance tolerance(const CaseSpec& s) {
  const double u = s.dtype == DType::kBF16 ? std::ldexp(1.0, -8) : s.dtype == DType::kF16 ? std::ldexp(1.0, -11) : 0.0;
  return {2e-4 + 2.0 * u, 1e-4 + 2.0 * u};
}

harness::ParityReport check_parity(const CaseSpec& s, const std::string& impl, Pass pass, Device dev) {
  harness::ParityReport r;
  r.case_name = s.name();
  r.implementation = impl;
  r.pass = pass_name(pass);
  const CaseData d = make_case(s);
  Outputs want = make_outputs(s, d), got = make_outputs(s, d);
  run_one(s, d, "reference", pass, want);
  try {
    if (dev.type == DeviceType::kCPU) {
      run_one(s, d, impl, pass, got);
    } else {
      Outputs on = got.to(dev);
      run_one(s, d.to(dev), impl, pass, on);
      got = on.to(Device{});
    }
    r.ran = true;
  } catch (const Error& e) {
    r.error = e.what();
    r.skipped = e.code() == ErrorCode::kUnsupported;
    return r;
  }
  const harness::Tolerance tol = tolerance(s);
  auto add = [&](const char* name, const Tensor& g, const Tensor& w) {
    r.fields.push_back({name, harness::compare(to_doubles(g), to_doubles(w), tol)});
  };
  if (pass != Pass::kBackward) add("h", got.h, want.h);
  if (pass != Pass::kBackward && s.last_states)
    add("c_last", got.c, want.c), add("n_last", got.n, want.n), add("m_last", got.m, want.m);
  if (pass != Pass::kForward) {
    add("dq", got.dq, want.dq), add("dk", got.dk, want.dk), add("dv", got.dv, want.dv);
    add("di", got.di, want.di), add("df", got.df, want.df);
    if (s.initial_state) add("dc0", got.dc0, want.dc0), add("dn0", got.dn0, want.dn0);
  }
  return r;
}

std::vector<CaseSpec> check_grid(bool quick) {
  harness::SeededGrid<CaseSpec> add(100);
  auto mk = [](const char* label, int64_t B, int64_t S, int64_t DK, int64_t DV, int64_t chunk, const char* resets) {
    CaseSpec c;
    c.label = label, c.B = B, c.S = S, c.DK = DK, c.DV = DV, c.resets = resets;
    c.opt.chunk_size = chunk;
    return c;
  };
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    CaseSpec c = mk("dtype", 2, 29, 8, 12, 8, "random");
    c.dtype = dt, c.initial_state = true;
    add(c);
  }
  add(mk("s1", 1, 1, 8, 8, 4, "none"));
  add(mk("s7", 1, 7, 16, 8, 4, "none"));               // chunk does not divide S
  add(mk("s64", 1, 64, 8, 16, 16, "chunk"));           // resets at chunk boundaries
  add(mk("s129", 2, 129, 12, 8, 32, "inside"));        // resets inside chunks, tail chunk of 1
  add(mk("every", 1, 20, 8, 8, 8, "every"));
  add(mk("pair", 1, 40, 8, 8, 16, "pair"));             // two resets in a row, across a chunk boundary
  add(mk("default_chunk", 1, 130, 8, 8, 0, "random"));
  CaseSpec init = mk("init", 2, 33, 8, 16, 8, "none");
  init.initial_state = true;
  add(init);
  CaseSpec big = mk("gates_large", 1, 50, 8, 8, 16, "random");
  big.gate_scale = 40.0f;  // ±40: m far from 0 both ways
  big.initial_state = true;
  add(big);
  add(mk("batch17", 17, 9, 4, 6, 4, "random"));
  if (!quick) {
    add(mk("batch33", 33, 5, 4, 4, 2, "random"));
    add(mk("s1000", 1, 1000, 16, 16, 64, "random"));
  }
  for (DType dt : {DType::kBF16, DType::kF16}) {  // gates in another dtype than q, k, v
    CaseSpec c = mk("gate_dtype", 2, 21, 8, 4, 8, "inside");
    c.gate_dtype = dt;
    add(c);
  }
  return add.take();
}

std::vector<std::vector<float>> forward_backward_outputs(const CaseData& host, const std::string& impl,
                                                         int64_t chunk, Device dev) {
  const CaseData d = host.to(dev);
  const Shape& qs = d.q.shape();
  const int64_t B = qs[0], NH = qs[1], DK = qs[3], DV = d.v.shape()[3];
  auto zeros = [dev](const Shape& shape) { return Tensor::zeros(DType::kF32, shape, dev); };
  const Shape cs{B, NH, DK, DV}, ns{B, NH, DK};
  Tensor h = zeros(d.v.shape()), c = zeros(cs), n = zeros(ns), m = zeros({B, NH});
  std::vector<Tensor> g = {zeros(qs), zeros(d.k.shape()), zeros(d.v.shape()), zeros(d.i.shape()), zeros(d.f.shape()),
                           zeros(cs), zeros(ns)};
  Options o;
  o.implementation = impl, o.eps = 1e-6, o.chunk_size = chunk;
  forward(d.inputs(), h.view(), {c.view(), n.view(), m.view()}, o);
  backward(d.inputs(), d.dh.view(), {g[0].view(), g[1].view(), g[2].view(), g[3].view(), g[4].view(), g[5].view(), g[6].view()},
           o, d.dc_last.view(), d.dn_last.view());
  std::vector<std::vector<float>> out;
  for (const Tensor* t : {&h, &c, &n, &m, &g[0], &g[1], &g[2], &g[3], &g[4], &g[5], &g[6]}) {
    const Tensor on_host = t->to(Device{});
    out.emplace_back(on_host.data_as<float>(), on_host.data_as<float>() + on_host.numel());
  }
  return out;
}

CaseData erasing_forget_case(float erase) {
  CaseSpec s;
  s.NH = 3, s.S = 29, s.resets = "random", s.initial_state = true;
  CaseData d = make_case(s);
  for (int64_t bh = 0; bh < 3; ++bh)
    for (int64_t t : {0, 8, 15, 19, 21, 28})
      if ((t + bh) % 3 != 1) d.f.data_as<float>()[bh * s.S + t] = erase;
  return d;
}

}  // namespace tessera::mlstm::testing
