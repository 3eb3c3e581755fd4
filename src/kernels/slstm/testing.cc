// slstm: the check grid and parity against the reference.
#include "kernels/slstm/testing.h"

#include <cmath>
#include <sstream>

#include "core/random.h"
#include "tessera/error.h"

namespace tessera::slstm::testing {
namespace {

using harness::to_doubles;

TensorView view_or_none(const Tensor& t) { return t.numel() > 0 ? t.view() : TensorView{}; }

// NaN-filled: an element an implementation forgets to write is caught.
using harness::nan_filled;

struct Results {
  std::vector<std::pair<std::string, Tensor>> t;  // name -> tensor, in output order
  Tensor& get(const std::string& n) {
    for (auto& [name, x] : t)
      if (name == n) return x;
    throw Error(ErrorCode::kInternal, "slstm testing: no output " + n);
  }
};

Results make_results(const CaseSpec& s, const CaseData& d, Pass pass) {
  Results r;
  const Shape st{s.B, s.NH, s.DH};
  if (pass != Pass::kBackward) {
    r.t.push_back({"h", nan_filled(DType::kF32, {s.B, s.S, s.NH, s.DH})});
    if (s.last)
      for (const char* n : {"h_last", "c_last", "n_last", "m_last"}) r.t.push_back({n, nan_filled(DType::kF32, st)});
  }
  if (pass != Pass::kForward) {
    r.t.push_back({"dwx", nan_filled(s.dtype, d.wx.shape())});
    r.t.push_back({"dr", nan_filled(s.dtype, d.r.shape())});
    r.t.push_back({"db", nan_filled(s.dtype, d.b.shape())});
    if (s.initial)
      for (const char* n : {"dh0", "dc0", "dn0"}) r.t.push_back({n, nan_filled(DType::kF32, st)});
  }
  return r;
}

TensorView opt_view(Results& r, const char* n) {
  for (auto& [name, x] : r.t)
    if (name == n) return x.view();
  return {};
}

void run_one(const CaseSpec& s, const CaseData& d, const std::string& impl, Pass pass, Results& r) {
  Options opt;
  opt.implementation = impl;
  opt.num_threads = s.num_threads;
  const Outputs out{opt_view(r, "h"), opt_view(r, "h_last"), opt_view(r, "c_last"), opt_view(r, "n_last"),
                    opt_view(r, "m_last")};
  const Grads g{opt_view(r, "dwx"), opt_view(r, "dr"), opt_view(r, "db"),
                opt_view(r, "dh0"), opt_view(r, "dc0"), opt_view(r, "dn0")};
  switch (pass) {
    case Pass::kForward: forward(d.inputs(), out, opt); break;
    case Pass::kBackward: backward(d.inputs(), d.upstream(), g, opt); break;
    case Pass::kFused: forward_backward(d.inputs(), d.upstream(), out, g, opt); break;
  }
}

}  // namespace

std::string CaseSpec::name() const {
  std::ostringstream o;
  o << label << "_B" << B << "S" << S << "NH" << NH << "DH" << DH << "_" << dtype_name(dtype) << "_reset-" << resets;
  if (gate_scale != 1.0f) o << "_gates" << gate_scale;
  if (initial) o << "_init";
  if (!last) o << "_nolast";
  if (num_threads) o << "_t" << num_threads;
  return o.str();
}

Inputs CaseData::inputs() const {
  return {wx.view(), r.view(), b.view(), view_or_none(resets), view_or_none(h0), view_or_none(c0),
          view_or_none(n0), view_or_none(m0)};
}

Upstream CaseData::upstream() const {
  return {dh.view(), view_or_none(dh_last), view_or_none(dc_last), view_or_none(dn_last)};
}

CaseData make_case(const CaseSpec& s) {
  CaseData d;
  const uint64_t k = s.seed * 16;
  d.wx = random_uniform(s.dtype, {s.B, s.S, 4, s.NH, s.DH}, s.gate_scale, k + 1);
  // ‖r‖ about 0.6: the recurrence is contractive, so f32 and double stay close over 300 steps.
  d.r = random_uniform(s.dtype, {4, s.NH, s.DH, s.DH}, 0.5f / std::sqrt(float(s.DH)), k + 2);
  d.b = random_uniform(s.dtype, {4, s.NH, s.DH}, 0.5f, k + 3);
  d.dh = random_uniform(DType::kF32, {s.B, s.S, s.NH, s.DH}, 1.0f, k + 4);
  const Shape st{s.B, s.NH, s.DH};
  if (s.resets != "none") {
    d.resets = Tensor::zeros(DType::kI32, {s.B, s.S});
    const Tensor u = random_uniform(DType::kF32, {s.B, s.S}, 1.0f, k + 5);
    for (int64_t i = 0; i < s.B * s.S; ++i) {
      const int64_t t = i % s.S;
      const bool on = s.resets == "every" ? true : s.resets == "at1" ? t == 1 : u.data_as<float>()[i] > 0.6f;
      d.resets.data_as<int32_t>()[i] = on;
    }
  }
  if (s.initial) {
    d.h0 = random_uniform(DType::kF32, st, 1.0f, k + 6);
    d.c0 = random_uniform(DType::kF32, st, 1.0f, k + 7);
    d.n0 = random_uniform(DType::kF32, st, 0.5f, k + 8);
    for (int64_t i = 0; i < d.n0.numel(); ++i) d.n0.data_as<float>()[i] += 1.0f;  // n0 in [0.5, 1.5]
    d.m0 = random_uniform(DType::kF32, st, 1.0f, k + 9);
  }
  if (s.last) {
    d.dh_last = random_uniform(DType::kF32, st, 1.0f, k + 10);
    d.dc_last = random_uniform(DType::kF32, st, 0.5f, k + 11);  // a next call's gradient through c, n
    d.dn_last = random_uniform(DType::kF32, st, 0.5f, k + 12);
  }
  return d;
}

// Both sides see the same rounded inputs; the implementation evaluates gates and states in f32,
// the reference in double. Per step the f32 error is a few ulp (~1e-6 relative) of the gate
// values; the grid's recurrence is contractive (‖r‖ ≈ 0.6, gate derivatives ≤ 1) and the
// normalized state c/n is a weighted mean, so errors do not grow with S: 1e-4 relative plus
// 1e-4 of the output's scale is ~50x the expected error. Gradients sum B·S terms of either sign
// (dr, db) in f32: 3e-4 of the scale covers sqrt(B·S)·1e-6 with margin. Gradients stored in
// bf16/f16 differ by up to one unit of their dtype (2u relative) on top.
harness::Tolerance tolerance(const CaseSpec& s, bool gradient) {
  const double u = s.dtype == DType::kBF16 ? std::ldexp(1.0, -8) : s.dtype == DType::kF16 ? std::ldexp(1.0, -11) : 0.0;
  if (!gradient) return {1e-4, 1e-4};
  return {3e-4 + 2.0 * u, 3e-4 + 2.0 * u};
}

harness::ParityReport check_parity(const CaseSpec& s, const std::string& impl, Pass pass, Device dev) {
  harness::ParityReport rep;
  rep.case_name = s.name();
  rep.implementation = impl;
  rep.pass = pass_name(pass);
  const CaseData d = make_case(s);
  Results want = make_results(s, d, pass), got = make_results(s, d, pass);
  run_one(s, d, "reference", pass, want);
  try {
    if (dev.type == DeviceType::kCPU) {
      run_one(s, d, impl, pass, got);
    } else {  // inputs and NaN-filled outputs copied to the device (resets stay host memory), results back
      CaseData dd = d;
      for (Tensor* t : {&dd.wx, &dd.r, &dd.b, &dd.h0, &dd.c0, &dd.n0, &dd.m0, &dd.dh, &dd.dh_last, &dd.dc_last, &dd.dn_last})
        if (t->defined()) *t = t->to(dev);
      Results on = got;
      for (auto& [name, t] : on.t) t = t.to(dev);
      run_one(s, dd, impl, pass, on);
      for (auto& [name, t] : on.t) got.get(name) = t.to(Device{});
    }
    rep.ran = true;
  } catch (const Error& e) {
    rep.error = e.what();
    rep.skipped = e.code() == ErrorCode::kUnsupported;
    return rep;
  }
  for (auto& [name, t] : want.t) {
    const bool grad = name[0] == 'd';
    rep.fields.push_back({name, harness::compare(to_doubles(got.get(name)), to_doubles(t), tolerance(s, grad))});
  }
  return rep;
}

std::vector<CaseSpec> check_grid(bool quick) {
  harness::SeededGrid<CaseSpec> add(100);
  const std::vector<DType> dtypes = harness::check_dtypes(quick);
  for (DType dt : dtypes) {
    CaseSpec c;
    c.dtype = dt;
    c.label = "one_step", c.B = 1, c.S = 1, c.NH = 1, c.DH = 8;
    add(c);
    c.label = "two_steps", c.B = 17, c.S = 2, c.NH = 4, c.DH = 8, c.initial = true;
    add(c);
    c.label = "resets_random", c.B = 17, c.S = 33, c.NH = 1, c.DH = 64, c.initial = true, c.resets = "random";
    add(c);
    c.label = "resets_every", c.B = 1, c.S = 33, c.NH = 4, c.DH = 8, c.initial = false, c.resets = "every";
    add(c);
    c.label = "reset_at1", c.B = 33, c.S = 2, c.NH = 1, c.DH = 96, c.initial = true, c.resets = "at1";
    add(c);
  }
  CaseSpec c;
  c.label = "gates50", c.B = 17, c.S = 33, c.NH = 1, c.DH = 8, c.gate_scale = 50.0f, c.resets = "random";
  add(c);
  c.label = "gates50_init", c.initial = true, c.NH = 4;
  add(c);
  c = CaseSpec{}, c.label = "long", c.B = 1, c.S = 300, c.NH = 1, c.DH = 8, c.last = false;
  add(c);
  c = CaseSpec{}, c.label = "tails", c.B = 7, c.S = 6, c.NH = 2, c.DH = 13, c.initial = true, c.resets = "random";
  add(c);  // 4·DH = 52 columns: vector tails; 7 rows: 4 + 2 + 1 row blocks
  c = CaseSpec{}, c.label = "dh128", c.B = 2, c.S = 3, c.NH = 1, c.DH = 128, c.initial = true, c.resets = "random";
  add(c);
  if (!quick) {
    c = CaseSpec{}, c.label = "dh64_heads", c.B = 33, c.S = 33, c.NH = 4, c.DH = 64, c.resets = "random";
    add(c);
    c.label = "threads3", c.num_threads = 3, c.B = 17, c.S = 2;
    add(c);
    c.label = "threads3_one_head", c.NH = 1, c.initial = true;  // 3 batch blocks: dr, db summed over them
    add(c);
  }
  return add.take();
}

}  // namespace tessera::slstm::testing
