#include "kernels/attention/testing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include "core/random.h"
#include "primitives/philox.h"
#include "tessera/error.h"

namespace tessera::attention::testing {
namespace {

bool varlen(const CaseSpec& s) { return !s.seqlens_q.empty(); }
int64_t sum(const std::vector<int64_t>& v) {
  int64_t t = 0;
  for (int64_t x : v) t += x;
  return t;
}


using harness::to_doubles;

Tensor i32_tensor(const Shape& shape) { return Tensor::zeros(DType::kI32, shape); }

// Sorted segment ids for one row of length len: `segments` contiguous runs with random cut
// points (some runs may be empty, so ids in q and k rows need not all occur in both).
void fill_segments(int32_t* ids, int64_t len, int segments, uint64_t seed) {
  std::vector<int64_t> cuts;
  for (int s = 1; s < segments; ++s)
    cuts.push_back(static_cast<int64_t>(random_bits(seed, static_cast<uint64_t>(s)) % static_cast<uint64_t>(len + 1)));
  std::sort(cuts.begin(), cuts.end());
  int32_t id = 0;
  size_t c = 0;
  for (int64_t i = 0; i < len; ++i) {
    while (c < cuts.size() && cuts[c] <= i) ++c, ++id;
    ids[i] = id;
  }
}

// The case's bias: U(−1, 1) in its shape ("B", "H", "Q", "K" full, "1" broadcast), about one
// entry in 6 −inf with bias_masks.
void make_bias(const CaseSpec& s, uint64_t seed, CaseData& d) {
  check(s.bias.size() == 4 && !varlen(s), ErrorCode::kInvalidArgument, "a case's bias is 4 letters, dense form");
  const int64_t full[4] = {s.B, s.Hq, s.Sq, s.Sk};
  Shape shape;
  for (int i = 0; i < 4; ++i) shape.push_back(s.bias[static_cast<size_t>(i)] == '1' ? 1 : full[i]);
  d.bias = Tensor::empty(s.bias_f32 ? DType::kF32 : s.dtype, shape);
  fill_uniform(d.bias, -1.0, 1.0, seed);
  if (!s.bias_masks) return;
  for (int64_t i = 0; i < d.bias.numel(); ++i)
    if (random_bits(seed + 1, static_cast<uint64_t>(i)) % 6 == 0)
      store_from_f32(d.bias.data(), d.bias.dtype(), i, -std::numeric_limits<float>::infinity());
}

}  // namespace

Shape o_shape(const CaseSpec& s) {
  if (varlen(s)) return {sum(s.seqlens_q), s.Hq, s.Dv};
  return {s.B, s.Sq, s.Hq, s.Dv};
}
Shape lse_shape(const CaseSpec& s) {
  if (varlen(s)) return {s.Hq, sum(s.seqlens_q)};
  return {s.B, s.Hq, s.Sq};
}

std::string CaseSpec::name() const {
  std::ostringstream os;
  os << dtype_name(dtype);
  if (varlen(*this)) {
    os << " varlen q=[";
    for (size_t i = 0; i < seqlens_q.size(); ++i) os << (i ? "," : "") << seqlens_q[i];
    os << "] k=[";
    for (size_t i = 0; i < seqlens_k.size(); ++i) os << (i ? "," : "") << seqlens_k[i];
    os << "]";
  } else {
    os << " B=" << B << " Sq=" << Sq << " Sk=" << Sk;
  }
  os << " Hq=" << Hq << " Hkv=" << Hkv << " D=" << D;
  if (Dv != D) os << " Dv=" << Dv;
  if (opt.causal) os << " causal";
  if (opt.window_left >= 0 || opt.window_right >= 0) os << " window=(" << opt.window_left << "," << opt.window_right << ")";
  if (opt.softcap > 0) os << " softcap=" << opt.softcap;
  if (opt.scale) os << " scale=" << *opt.scale;
  if (alibi) os << (alibi == 1 ? " alibi[H]" : " alibi[B,H]");
  if (segments) os << " segments=" << segments;
  if (opt.dropout_p > 0) os << " dropout=" << opt.dropout_p;
  if (!bias.empty()) os << " bias[" << bias << "]" << (bias_f32 ? ":f32" : "") << (bias_masks ? "-inf" : "");
  if (o_f32) os << " o:f32";
  if (f32_grads) os << " f32grads";
  if (logit_scale != 2.0) os << " logits~" << logit_scale;
  if (opt.block_sizes) os << " blocks=" << opt.block_sizes->str();
  if (opt.num_threads) os << " threads=" << opt.num_threads;
  return os.str();
}

CaseData make_case(const CaseSpec& s) {
  // One stream per tensor (core/random: values depend only on seed and index).
  const uint64_t seed = s.seed * 0x9E3779B97F4A7C15ull + 777;
  CaseData d;
  const bool vl = varlen(s);
  const Shape lead_q = vl ? Shape{sum(s.seqlens_q)} : Shape{s.B, s.Sq};
  const Shape lead_k = vl ? Shape{sum(s.seqlens_k)} : Shape{s.B, s.Sk};
  auto shape = [](Shape lead, int64_t h, int64_t d) {
    lead.push_back(h);
    lead.push_back(d);
    return lead;
  };
  // scale·q·k with q, k ~ U(−a, a) has std scale·sqrt(D)·a²/3: pick a for |s| ~ logit_scale.
  const double scale = s.opt.scale ? *s.opt.scale : 1.0 / std::sqrt(static_cast<double>(s.D));
  const double a = std::sqrt(3.0 * s.logit_scale / (scale * std::sqrt(static_cast<double>(s.D))));
  d.q = Tensor::empty(s.dtype, shape(lead_q, s.Hq, s.D));
  d.k = Tensor::empty(s.dtype, shape(lead_k, s.Hkv, s.D));
  d.v = Tensor::empty(s.dtype, shape(lead_k, s.Hkv, s.Dv));
  fill_uniform(d.q, -a, a, seed + 1);
  fill_uniform(d.k, -a, a, seed + 2);
  fill_uniform(d.v, -1.0, 1.0, seed + 3);
  d.grad_o = Tensor::empty(s.o_f32 ? DType::kF32 : s.dtype, o_shape(s));
  fill_uniform(d.grad_o, -1.0, 1.0, seed + 4);
  const int64_t nseq = vl ? static_cast<int64_t>(s.seqlens_q.size()) : s.B;
  if (s.alibi) {
    d.alibi = Tensor::empty(DType::kF32, s.alibi == 1 ? Shape{s.Hq} : Shape{nseq, s.Hq});
    // The geometric slopes of the ALiBi paper (2^(−8h/H)), perturbed per batch row.
    for (int64_t i = 0; i < d.alibi.numel(); ++i)
      d.alibi.data_as<float>()[i] = static_cast<float>(
          std::exp2(-8.0 * static_cast<double>(i % s.Hq + 1) / static_cast<double>(s.Hq)) * (1.0 + 0.1 * static_cast<double>(i / s.Hq)));
  }
  if (s.segments > 0 && !vl) {
    d.seg_q = i32_tensor({s.B, s.Sq});
    d.seg_k = i32_tensor({s.B, s.Sk});
    for (int64_t b = 0; b < s.B; ++b) {
      fill_segments(d.seg_q.data_as<int32_t>() + b * s.Sq, s.Sq, s.segments, seed + 100 + 2 * static_cast<uint64_t>(b));
      fill_segments(d.seg_k.data_as<int32_t>() + b * s.Sk, s.Sk, s.segments, seed + 101 + 2 * static_cast<uint64_t>(b));
    }
  }
  if (s.opt.dropout_p > 0) {  // the Philox key: two words of the case's seed
    d.dropout_seed = i32_tensor({2});
    d.dropout_seed.data_as<int32_t>()[0] = static_cast<int32_t>(static_cast<uint32_t>(seed * 2654435761u));
    d.dropout_seed.data_as<int32_t>()[1] = static_cast<int32_t>(static_cast<uint32_t>(seed >> 32) ^ 0x5bd1e995u);
  }
  if (!s.bias.empty()) make_bias(s, seed + 6, d);
  if (vl) {
    const int64_t n = nseq;
    d.cu_q = i32_tensor({n + 1});
    d.cu_k = i32_tensor({n + 1});
    for (int64_t i = 0; i < n; ++i) {
      d.cu_q.data_as<int32_t>()[i + 1] = d.cu_q.data_as<int32_t>()[i] + static_cast<int32_t>(s.seqlens_q[i]);
      d.cu_k.data_as<int32_t>()[i + 1] = d.cu_k.data_as<int32_t>()[i] + static_cast<int32_t>(s.seqlens_k[i]);
    }
  }
  return d;
}

Inputs CaseData::inputs() const {
  Inputs in;
  in.q = q.view();
  in.k = k.view();
  in.v = v.view();
  if (alibi.defined()) in.alibi_slopes = alibi.view();
  if (seg_q.defined()) {
    in.segment_ids_q = seg_q.view();
    in.segment_ids_k = seg_k.view();
  }
  if (cu_q.defined()) {
    in.cu_seqlens_q = cu_q.view();
    in.cu_seqlens_k = cu_k.view();
  }
  if (dropout_seed.defined()) in.dropout_seed = dropout_seed.view();
  if (bias.defined()) in.bias = bias.view();
  return in;
}

CaseData CaseData::to(Device device) const {
  auto mv = [&](const Tensor& t) { return t.defined() ? t.to(device) : Tensor(); };
  CaseData d;
  d.q = mv(q), d.k = mv(k), d.v = mv(v), d.alibi = mv(alibi), d.seg_q = mv(seg_q), d.seg_k = mv(seg_k);
  d.grad_o = mv(grad_o), d.dropout_seed = mv(dropout_seed), d.bias = mv(bias);
  d.cu_q = cu_q, d.cu_k = cu_k;  // host memory, shared
  return d;
}

// Tolerances. Every implementation sees the same (already rounded) inputs, so the differences
// from the double-precision oracle come from (a) f32 arithmetic: dot products of length D, exp
// in f32, sums of up to Sk probabilities — relative errors ~ sqrt(n)·2^-24 < 1e-5 here; (b) a
// backend that rounds P and dS to the input dtype before its matrix products (as FlashAttention
// does on tensor cores, and the cpu backend on its bf16 dot route), an error of one unit roundoff u per term of a
// sum of signed terms, hence ≲ u·max|x| for the whole tensor; and (c) rounding the stored output
// to its dtype, which both the oracle and the implementation do, so their stored values can
// differ by one ulp = 2u relative.
// So: compute = max(2e-4, 2.5·u_in) as the absolute part (scaled by the tensor's largest
// magnitude, since outputs and gradients are sums of signed terms that can cancel to ~0) and
// compute + 2·u_store as the relative part, with u = 2^-8 (bf16), 2^-11 (f16), 0 (f32). The 2e-4
// floor for f32 leaves > 20x margin over (a) and still catches any wrong term (a missing key, a
// wrong mask edge or a missing softcap factor moves values by 1e-2 or more at these sizes).
// lse is f32 and sums positive terms: rtol 1e-4 with an absolute floor of 1e-5·max|lse|.
Tolerances tolerances(const CaseSpec& s) {
  auto unit = [](DType t) {
    switch (t) {
      case DType::kBF16: return std::ldexp(1.0, -8);
      case DType::kF16: return std::ldexp(1.0, -11);
      default: return 0.0;
    }
  };
  const double compute = std::max(2e-4, 2.5 * unit(s.dtype));
  auto field = [&](DType stored) { return harness::Tolerance{compute + 2.0 * unit(stored), compute}; };
  Tolerances t;
  t.o = field(s.o_f32 ? DType::kF32 : s.dtype);
  t.lse = {1e-4, 1e-5};
  const DType g = s.f32_grads ? DType::kF32 : s.dtype;
  t.dq = field(g);
  t.dk = field(g);
  t.dv = field(g);
  t.dbias = field(s.bias_f32 ? DType::kF32 : s.dtype);  // dbias is stored in the bias's dtype
  return t;
}

std::string report_str(const ParityReport& r) {
  std::string s = r.case_name + " [" + r.pass + "]";
  if (!r.ran) return s + " did not run: " + r.error;
  for (const auto& f : r.fields) s += "\n  " + f.field + ": " + f.dev.str();
  return s;
}

void lse_for_compare(std::vector<double>& got, std::vector<double>& want) {
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const bool gi = got[i] == -INFINITY, wi = want[i] == -INFINITY;
    if (gi && wi) {
      got[i] = want[i] = 0.0;
    } else if (gi || wi) {
      got[i] = NAN;
      if (wi) want[i] = 0.0;
    }
  }
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

harness::Deviation compare_with_floor(const std::vector<double>& got, const std::vector<double>& want,
                                      harness::Tolerance tol, double floor) {
  harness::Deviation d = harness::compare(got, want, tol);  // statistics; violations redone below
  const double atol = tol.atol_scale * std::max(d.ref_scale, floor);
  d.violations = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    if (std::isfinite(got[i]) && std::fabs(got[i] - want[i]) > atol + tol.rtol * std::fabs(want[i])) ++d.violations;
  return d;
}

namespace {

struct Outputs {
  Tensor o, lse, dq, dk, dv, dbias;
};

// An output filled with NaN before the call (made on the host, then copied to `dev`): an element
// the implementation leaves unwritten shows as non-finite in the comparison.
Tensor nan_filled(DType dt, const Shape& shape, Device dev) {
  Tensor t = Tensor::empty(dt, shape);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_f32(t.data(), dt, i, std::numeric_limits<float>::quiet_NaN());
  return dev.type == DeviceType::kCPU ? t : t.to(dev);
}

Outputs make_outputs(const CaseSpec& s, const CaseData& d, Device dev = Device::cpu()) {
  Outputs o;
  o.o = nan_filled(s.o_f32 ? DType::kF32 : s.dtype, o_shape(s), dev);
  o.lse = nan_filled(DType::kF32, lse_shape(s), dev);
  const DType g = s.f32_grads ? DType::kF32 : s.dtype;
  o.dq = nan_filled(g, d.q.shape(), dev);
  o.dk = nan_filled(g, d.k.shape(), dev);
  o.dv = nan_filled(g, d.v.shape(), dev);
  if (d.bias.defined()) o.dbias = nan_filled(d.bias.dtype(), d.bias.shape(), dev);
  return o;
}

// The outputs `pass` writes, the others left out: copying never-written device memory back is
// what compute-sanitizer initcheck reported (docs/gpu_results/2026-11-27-eighth).
Outputs written_by(Outputs o, Pass pass) {
  if (pass == Pass::kBackward) o.o = o.lse = Tensor();
  if (pass == Pass::kForward) o.dq = o.dk = o.dv = o.dbias = Tensor();
  return o;
}

Outputs copy_outputs(const Outputs& o, Device dev) {
  auto mv = [&](const Tensor& t) { return t.defined() ? t.to(dev) : Tensor(); };
  return {mv(o.o), mv(o.lse), mv(o.dq), mv(o.dk), mv(o.dv), mv(o.dbias)};
}

void run_one(const CaseSpec& s, const CaseData& d, const std::string& impl, Pass pass, const Outputs* saved,
             Outputs& o) {
  Options opt = s.opt;
  opt.implementation = impl;
  const Inputs in = d.inputs();
  Gradients g{o.dq.view(), o.dk.view(), o.dv.view(), {}};
  if (o.dbias.defined()) g.dbias = o.dbias.view();
  switch (pass) {
    case Pass::kForward: forward(in, {o.o.view(), o.lse.view()}, opt); break;
    case Pass::kBackward: backward(in, {saved->o.view(), saved->lse.view(), d.grad_o.view()}, g, opt); break;
    case Pass::kFused: forward_backward(in, d.grad_o.view(), {o.o.view(), o.lse.view()}, g, opt); break;
  }
}

}  // namespace

ParityReport check_parity(const CaseSpec& s, const std::string& impl, Pass pass, Device device) {
  ParityReport r;
  r.case_name = s.name();
  r.implementation = impl;
  r.pass = pass_name(pass);
  const CaseData d = make_case(s);
  Outputs want = make_outputs(s, d), got = make_outputs(s, d);
  CaseSpec ref = s;
  ref.opt.block_sizes.reset();
  ref.opt.num_threads = 0;
  if (pass == Pass::kBackward) run_one(ref, d, "reference", Pass::kForward, nullptr, want);
  run_one(ref, d, "reference", pass, &want, want);
  try {
    if (device.type == DeviceType::kCPU) {
      run_one(s, d, impl, pass, &want, got);
    } else {  // inputs, the saved o / lse and the outputs on the device; results copied back
      const CaseData dd = d.to(device);
      const Outputs saved = copy_outputs(written_by(want, Pass::kForward), device);  // o, lse
      Outputs out = make_outputs(s, dd, device);
      run_one(s, dd, impl, pass, &saved, out);
      got = copy_outputs(written_by(out, pass), Device::cpu());
    }
    r.ran = true;
  } catch (const Error& e) {
    r.error = e.what();
    r.skipped = e.code() == ErrorCode::kUnsupported;
    return r;
  }
  const Tolerances tol = tolerances(s);
  if (pass != Pass::kBackward) {
    r.fields.push_back({"o", harness::compare(to_doubles(got.o), to_doubles(want.o), tol.o)});
    std::vector<double> gl = to_doubles(got.lse), wl = to_doubles(want.lse);
    lse_for_compare(gl, wl);
    r.fields.push_back({"lse", harness::compare(gl, wl, tol.lse)});
  }
  if (pass != Pass::kForward) {
    // dq and dk are sums of dS_ij·k_j (q_i) whose terms can cancel to exactly 0 (with one key,
    // dS = P·(dP − Δ) = 0 in exact arithmetic), leaving only rounding noise against a zero
    // oracle. The gradients of one call share a scale, so their absolute tolerance is taken
    // relative to the largest magnitude of all three (grad_floor), not of each alone.
    const std::vector<double> wq = to_doubles(want.dq), wk = to_doubles(want.dk), wv = to_doubles(want.dv);
    const double floor = std::max({max_abs(wq), max_abs(wk), max_abs(wv)});
    r.fields.push_back({"dq", compare_with_floor(to_doubles(got.dq), wq, tol.dq, floor)});
    r.fields.push_back({"dk", compare_with_floor(to_doubles(got.dk), wk, tol.dk, floor)});
    r.fields.push_back({"dv", compare_with_floor(to_doubles(got.dv), wv, tol.dv, floor)});
    // dbias sums dS (as dq and dk do, times k and q) and shares their scale: a bias broadcast over
    // the keys has dbias = Σ_j dS_ij = 0 exactly (softmax ignores a per-row shift), which leaves
    // only rounding noise against a zero oracle.
    if (want.dbias.defined()) {
      const std::vector<double> wb = to_doubles(want.dbias);
      r.fields.push_back(
          {"dbias", compare_with_floor(to_doubles(got.dbias), wb, tol.dbias, std::max(floor, max_abs(wb)))});
    }
  }
  return r;
}

std::vector<uint8_t> dropout_mask_through_o(const std::string& implementation, Device device, DType dtype, int64_t B,
                                            int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv, double p,
                                            const int32_t seed[2], std::optional<BlockSizes> blocks, int threads) {
  const int64_t D = 8;
  Tensor q = Tensor::zeros(dtype, {B, Sq, Hq, D}), k = Tensor::zeros(dtype, {B, Sk, Hkv, D});
  Tensor v = Tensor::zeros(dtype, {B, Sk, Hkv, Sk}), s = i32_tensor({2});
  fill_uniform(k, -1.0, 1.0, 5);  // any keys: q = 0 makes every score 0
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < Sk; ++j)
      for (int64_t h = 0; h < Hkv; ++h) store_from_f32(v.data(), dtype, ((b * Sk + j) * Hkv + h) * Sk + j, 1.0f);
  s.data_as<int32_t>()[0] = seed[0], s.data_as<int32_t>()[1] = seed[1];
  const Tensor qd = q.to(device), kd = k.to(device), vd = v.to(device), sd = s.to(device);
  Inputs in;
  in.q = qd.view(), in.k = kd.view(), in.v = vd.view(), in.dropout_seed = sd.view();
  Options opt;
  opt.implementation = implementation;
  opt.dropout_p = p;
  opt.block_sizes = blocks;
  opt.num_threads = threads;
  Tensor o = Tensor::empty(DType::kF32, {B, Sq, Hq, Sk}, device), lse = Tensor::empty(DType::kF32, {B, Hq, Sq}, device);
  forward(in, {o.view(), lse.view()}, opt);
  const Tensor host = o.to(Device::cpu());
  const double kept = 1.0 / ((1.0 - p) * static_cast<double>(Sk));
  const double unit = dtype == DType::kF32 ? 1e-6 : dtype == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double tol = 4.0 * unit;
  std::vector<uint8_t> mask(static_cast<size_t>(host.numel()));
  for (size_t i = 0; i < mask.size(); ++i) {
    const double x = host.data_as<float>()[i];
    mask[i] = x == 0.0 ? 0 : std::fabs(x - kept) <= tol * kept ? 1 : 2;
  }
  return mask;
}

std::vector<uint8_t> dropout_mask_rule(int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, double p, const int32_t seed[2]) {
  const uint32_t thr = primitives::philox::dropout_threshold(p);
  const auto u = [](int64_t v) { return static_cast<uint32_t>(v); };
  std::vector<uint8_t> mask;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t j = 0; j < Sk; ++j)
          mask.push_back(primitives::philox::dropout_keep(u(seed[0]), u(seed[1]), thr, u(b), u(h), u(i), u(j)));
  return mask;
}

namespace {

// A grid case's sizes; a 0 keeps base's (B = 2, Sq = 7, Sk = 9, Hq = 4, Hkv = 2, D = Dv = 16).
struct Sizes {
  int64_t B = 0, Sq = 0, Sk = 0, Hq = 0, Hkv = 0, D = 0, Dv = 0;
};
CaseSpec sized(const CaseSpec& base, const Sizes& s) {
  CaseSpec c = base;
  const std::pair<int64_t CaseSpec::*, int64_t> fields[] = {{&CaseSpec::B, s.B},   {&CaseSpec::Sq, s.Sq},
                                                            {&CaseSpec::Sk, s.Sk}, {&CaseSpec::Hq, s.Hq},
                                                            {&CaseSpec::Hkv, s.Hkv}, {&CaseSpec::D, s.D},
                                                            {&CaseSpec::Dv, s.Dv}};
  for (const auto& [field, v] : fields)
    if (v) c.*field = v;
  return c;
}

}  // namespace

std::vector<CaseSpec> check_grid(bool quick) {
  harness::SeededGrid<CaseSpec> add(100);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    CaseSpec base;
    base.dtype = dt;
    add(sized(base, {.Hq = 3, .Hkv = 3}));  // MHA, small odd shape
    {  // GQA, causal square, D = 64, f32 outputs
      CaseSpec c = sized(base, {.B = 1, .Sq = 33, .Sk = 33, .Hq = 6, .Hkv = 2, .D = 64, .Dv = 64});
      c.opt.causal = true;
      c.o_f32 = c.f32_grads = true;
      add(c);
    }
    {  // MQA, causal with Sq < Sk (bottom-right: the last query sees every key), D = 80
      CaseSpec c = sized(base, {.Sq = 5, .Sk = 37, .Hq = 4, .Hkv = 1, .D = 80, .Dv = 80});
      c.opt.causal = true;
      add(c);
    }
    {  // Causal with Sq > Sk: the first Sq − Sk rows see no key (o = 0, lse = −inf); Dv != D
      CaseSpec c = sized(base, {.Sq = 37, .Sk = 13, .Hq = 2, .Hkv = 1, .Dv = 24});
      c.opt.causal = true;
      add(c);
    }
    {  // Sliding window, left only, causal (local attention), D = 32
      CaseSpec c = sized(base, {.B = 1, .Sq = 40, .Sk = 40, .D = 32, .Dv = 32});
      c.opt.causal = true;
      c.opt.window_left = 8;
      add(c);
    }
    {  // Sliding window on both sides, not causal, Sq < Sk
      CaseSpec c = sized(base, {.Sq = 20, .Sk = 29});
      c.opt.window_left = 5;
      c.opt.window_right = 3;
      add(c);
    }
    {  // Softcap with an explicit scale, large logits
      CaseSpec c = sized(base, {.Sq = 11, .Sk = 23});
      c.opt.scale = 0.3;
      c.opt.softcap = 5.0;
      c.logit_scale = 8.0;
      add(c);
    }
    {  // ALiBi per head, causal; ALiBi per batch row, not causal, Sq > Sk
      CaseSpec c = sized(base, {.Sq = 19, .Sk = 19});
      c.alibi = 1;
      c.opt.causal = true;
      add(c);
      c.Sq = 21, c.Sk = 15;
      c.alibi = 2;
      c.opt.causal = false;
      add(c);
    }
    {  // Segment ids (packed sequences) with causal
      CaseSpec c = sized(base, {.Sq = 31, .Sk = 31});
      c.segments = 3;
      c.opt.causal = true;
      add(c);
    }
    {  // Varlen, causal, GQA, an empty sequence and a single-row one; again with ALiBi per
       // sequence and a two-sided window instead of causal
      CaseSpec c = sized(base, {.Hq = 4, .Hkv = 2});
      c.seqlens_q = {5, 0, 17, 1, 9};
      c.seqlens_k = {9, 3, 17, 1, 4};
      c.opt.causal = true;
      add(c);
      c.opt.causal = false;
      c.opt.window_left = 3;
      c.opt.window_right = 2;
      c.alibi = 2;
      add(c);
    }
    {  // A two-sided window with Sq > Sk: rows before the keys see nothing
      CaseSpec c = sized(base, {.Sq = 29, .Sk = 20});
      c.opt.window_left = 4;
      c.opt.window_right = 2;
      c.alibi = 1;
      add(c);
    }
    {  // Everything at once: window, softcap, ALiBi, segments, GQA, Dv != D
      CaseSpec c = sized(base, {.Sq = 26, .Sk = 30, .Hq = 4, .Hkv = 2, .D = 24, .Dv = 40});
      c.opt.causal = true;
      c.opt.window_left = 9;
      c.opt.softcap = 3.0;
      c.alibi = 2;
      c.segments = 2;
      c.logit_scale = 4.0;
      add(c);
    }
    {  // Dropout (p = 0.25), GQA, causal (the cpu tests also run it with kv tiles that start off
       // the four keys of one Philox call); varlen with a window and p = 0.6
      CaseSpec c = sized(base, {.Sq = 19, .Sk = 23});
      c.opt.causal = true;
      c.opt.dropout_p = 0.25;
      add(c);
      c.seqlens_q = {7, 0, 12};
      c.seqlens_k = {9, 4, 13};
      c.opt.causal = false;
      c.opt.window_left = 4;
      c.opt.window_right = 3;
      c.opt.dropout_p = 0.6;
      add(c);
    }
    {  // Biases: T5's [1, Hq, Sq, Sk] in f32 under a soft cap (broadcast over B; after the cap),
       // and a full [B, Hq, Sq, Sk] with −inf entries, causal, GQA
      CaseSpec c = sized(base, {.Sq = 21, .Sk = 26});
      c.bias = "1HQK";
      c.bias_f32 = true;
      c.opt.softcap = 3.0;
      c.logit_scale = 4.0;
      add(c);
      c = sized(base, {.Sq = 17, .Sk = 17, .Hq = 4, .Hkv = 1});
      c.bias = "BHQK";
      c.bias_masks = true;
      c.opt.causal = true;
      add(c);
    }
    if (quick) continue;
    {  // Biases broadcast over heads and rows or keys: a key padding mask [B, 1, 1, Sk] with
       // ALiBi, segments and dropout; a per-row bias [B, 1, Sq, 1] with −inf rows (o = 0); a
       // shared [1, 1, Sq, Sk] over 129 keys (tiles past the first)
      CaseSpec c = sized(base, {.Sq = 23, .Sk = 29});
      c.bias = "B11K";
      c.bias_masks = true;
      c.alibi = 2;
      c.segments = 2;
      c.opt.dropout_p = 0.2;
      add(c);
      c = sized(base, {.Sq = 13, .Sk = 11});
      c.bias = "B1Q1";
      c.bias_masks = true;
      add(c);
      c = sized(base, {.B = 3, .Sq = 40, .Sk = 129, .Hq = 2, .Hkv = 2, .D = 32, .Dv = 32});
      c.bias = "11QK";
      c.bias_f32 = true;
      c.opt.window_left = 50;
      add(c);
    }
    {  // Dropout with everything else: softcap, ALiBi, segments, Dv != D, D = 80 over 129 keys
      CaseSpec c = sized(base, {.B = 1, .Sq = 33, .Sk = 129, .D = 80, .Dv = 48});
      c.opt.softcap = 4.0;
      c.alibi = 1;
      c.segments = 2;
      c.opt.dropout_p = 0.1;
      add(c);
    }
    {  // Dv != D at D = 64; one key; one query against many keys (decode)
      CaseSpec c = sized(base, {.B = 1, .Sq = 7, .Sk = 129, .D = 64, .Dv = 32});
      add(c);
      c.Sq = 1, c.Sk = 1;
      add(c);
      c.Sq = 1, c.Sk = 257;
      c.D = c.Dv = 16;
      c.opt.causal = true;
      add(c);
    }
    {  // D = 128 over 129 rows (one row past a 128 block), causal, GQA
      CaseSpec c = sized(base, {.B = 1, .Sq = 129, .Sk = 129, .Hq = 2, .Hkv = 1, .D = 128, .Dv = 128});
      c.opt.causal = true;
      add(c);
    }
    // D = 256 (the cpu backend's limit), not causal.
    add(sized(base, {.B = 1, .Sq = 7, .Sk = 65, .Hq = 1, .Hkv = 1, .D = 256, .Dv = 256}));
    {  // 257 rows and keys (past two 128 blocks), window, MQA
      CaseSpec c = sized(base, {.B = 1, .Sq = 257, .Sk = 257, .Hq = 2, .Hkv = 1});
      c.opt.window_left = 100;
      c.opt.window_right = 20;
      add(c);
    }
  }
  return add.take();
}

}  // namespace tessera::attention::testing
