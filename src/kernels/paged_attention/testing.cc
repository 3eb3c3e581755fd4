// paged_attention: the check grid and parity against the reference.
#include "kernels/paged_attention/testing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>

#include "core/random.h"
#include "tessera/error.h"

namespace tessera::paged_attention::testing {
namespace {

using harness::to_doubles;

int64_t pages_of(const CaseSpec& s, size_t i) { return (s.kv_lens[i] + s.page_size - 1) / s.page_size; }

// The NaN-filled outputs (a row an implementation forgets to write shows).
struct Outputs {
  Tensor o, lse;
};
Outputs make_outputs(const CaseSpec& s, const CaseData& d, Device dev) {
  const int64_t T = d.q.shape()[0];
  Outputs out{harness::nan_filled(s.f32_out ? DType::kF32 : s.dtype, {T, s.Hq, s.Dv}),
              harness::nan_filled(DType::kF32, {T, s.Hq})};
  if (dev.type != DeviceType::kCPU) out = {out.o.to(dev), out.lse.to(dev)};
  return out;
}

// A cache uniform in [-1, 1] after dequantization: in s.dtype, or f8e4m3 values up to 1/scale
// (rounded to 3 mantissa bits; a scale left out would move o and lse by far more than the tolerance).
Tensor cache_values(const CaseSpec& s, const Shape& shape, double scale, uint64_t seed) {
  return s.f8_cache ? random_uniform(DType::kF8E4M3, shape, static_cast<float>(1.0 / scale), seed)
                    : random_uniform(s.dtype, shape, 1.0f, seed);
}

}  // namespace

std::string CaseSpec::name() const {
  std::ostringstream o;
  o << label << "_N" << q_lens.size() << "_H" << Hq << "x" << Hkv << "_D" << D;
  if (Dv != D) o << "v" << Dv;
  o << "_ps" << page_size << "_" << dtype_name(dtype);
  if (f8_cache) o << "_f8kv";
  if (f32_out) o << "_f32out";
  if (causal) o << "_causal";
  if (window >= 0) o << "_w" << window;
  if (softcap > 0) o << "_cap";
  if (sinks) o << "_sinks";
  if (shared_pages) o << "_shared";
  if (num_threads > 0) o << "_t" << num_threads;
  return o.str();
}

Inputs CaseData::inputs() const {
  Inputs in{q.view(), k_cache.view(), v_cache.view(), page_table.view(), kv_lens.view(), cu_q_lens.view(), {}};
  if (sinks.defined()) in.sinks = sinks.view();
  return in;
}

Options options_of(const CaseSpec& s) {
  Options o;
  o.causal = s.causal, o.window = s.window, o.softcap = s.softcap, o.scale = s.scale;
  o.k_scale = s.k_scale, o.v_scale = s.v_scale;
  o.num_threads = s.num_threads;
  return o;
}

CaseData make_case(const CaseSpec& s) {
  check(s.q_lens.size() == s.kv_lens.size(), ErrorCode::kInvalidArgument, "paged_attention case: q_lens and kv_lens differ in length");
  const int64_t N = static_cast<int64_t>(s.q_lens.size());
  const int64_t T = std::accumulate(s.q_lens.begin(), s.q_lens.end(), int64_t{0});
  // Page ids: sequence 0's pages, then the others' (their shared prefix reusing sequence 0's),
  // then the spare ones; all of it a shuffled permutation of [0, P).
  int64_t max_pages = 1, own = 0;
  std::vector<int64_t> shared(static_cast<size_t>(N), 0);
  for (size_t i = 0; i < static_cast<size_t>(N); ++i) {
    max_pages = std::max(max_pages, pages_of(s, i) + 1);  // one entry more than used: never read
    if (s.shared_pages && i > 0) shared[i] = std::max<int64_t>(0, std::min(pages_of(s, 0), pages_of(s, i)) - 1);
    own += pages_of(s, i) - shared[i];
  }
  const int64_t P = own + s.spare_pages;
  std::vector<int32_t> perm(static_cast<size_t>(P));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(s.seed));
  CaseData d;
  d.page_table = Tensor::empty(DType::kI32, {N, max_pages});
  d.kv_lens = Tensor::empty(DType::kI32, {N});
  d.cu_q_lens = Tensor::empty(DType::kI32, {N + 1});
  int32_t* pt = d.page_table.data_as<int32_t>();
  std::fill(pt, pt + N * max_pages, -7);
  size_t next = 0;
  d.cu_q_lens.data_as<int32_t>()[0] = 0;
  for (int64_t i = 0; i < N; ++i) {
    const size_t u = static_cast<size_t>(i);
    for (int64_t j = 0; j < pages_of(s, u); ++j) pt[i * max_pages + j] = j < shared[u] ? pt[j] : perm[next++];
    d.kv_lens.data_as<int32_t>()[i] = static_cast<int32_t>(s.kv_lens[u]);
    d.cu_q_lens.data_as<int32_t>()[i + 1] = static_cast<int32_t>(d.cu_q_lens.data_as<int32_t>()[i] + s.q_lens[u]);
  }
  d.q = random_uniform(s.dtype, {T, s.Hq, s.D}, 2.0f, s.seed * 7 + 1);
  d.k_cache = cache_values(s, {P, s.page_size, s.Hkv, s.D}, s.k_scale, s.seed * 7 + 2);
  d.v_cache = cache_values(s, {P, s.page_size, s.Hkv, s.Dv}, s.v_scale, s.seed * 7 + 3);
  const DType cache = d.k_cache.dtype();
  // NaN wherever no sequence reads.
  std::vector<char> used(static_cast<size_t>(P * s.page_size), 0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < s.kv_lens[static_cast<size_t>(i)]; ++j)
      used[static_cast<size_t>(pt[i * max_pages + j / s.page_size] * s.page_size + j % s.page_size)] = 1;
  for (int64_t r = 0; r < P * s.page_size; ++r) {
    if (used[static_cast<size_t>(r)]) continue;
    for (int64_t e = 0; e < s.Hkv * s.D; ++e) store_from_f32(d.k_cache.data(), cache, r * s.Hkv * s.D + e, NAN);
    for (int64_t e = 0; e < s.Hkv * s.Dv; ++e) store_from_f32(d.v_cache.data(), cache, r * s.Hkv * s.Dv + e, NAN);
  }
  if (s.sinks) {
    d.sinks = random_uniform(DType::kF32, {s.Hq}, 2.0f, s.seed * 7 + 4);
    d.sinks.data_as<float>()[0] = -std::numeric_limits<float>::infinity();  // a sink that takes nothing
  }
  return d;
}

// Both sides read the same rounded inputs; the reference works in double, the implementations in
// f32: scores are f32 dot products of D ≤ 128 terms of magnitude ≤ 2 (relative error ~1e-6),
// exp within a few ulp, sums of up to 32k weights (~1e-6·sqrt(n) relative). o is a convex
// combination of values in [-1, 1]: 5e-5 of its scale covers all of it with margin, while a
// wrong, missing or leaked key moves o by ~1/kv_len of the scale at the least and NaN shows as
// a non-finite. The stored o differs by at most one unit 2u of its dtype (u = 2^-8 bf16, 2^-11
// f16). lse (f32, |lse| ≲ 15): 2e-5 relative.
harness::Tolerance o_tolerance(const CaseSpec& s) {
  const DType stored = s.f32_out ? DType::kF32 : s.dtype;
  const double u = stored == DType::kBF16 ? std::ldexp(1.0, -8) : stored == DType::kF16 ? std::ldexp(1.0, -11) : 0.0;
  return {5e-5 + 2.0 * u, 5e-5 + 2.0 * u};
}
harness::Tolerance lse_tolerance(const CaseSpec&) { return {2e-5, 2e-5}; }

harness::ParityReport check_parity(const CaseSpec& s, const std::string& impl, Device dev) {
  harness::ParityReport r;
  r.case_name = s.name();
  r.implementation = impl;
  r.pass = pass_name(Pass::kForward);
  const CaseData d = make_case(s);
  Outputs want = make_outputs(s, d, Device{}), got = make_outputs(s, d, dev);
  Options opt = options_of(s);
  opt.implementation = "reference";
  forward(d.inputs(), {want.o.view(), want.lse.view()}, opt);
  try {
    opt.implementation = impl;
    Inputs in = d.inputs();
    CaseData dd;  // device copies of q, the caches and the sinks
    if (dev.type != DeviceType::kCPU) {
      dd.q = d.q.to(dev), dd.k_cache = d.k_cache.to(dev), dd.v_cache = d.v_cache.to(dev);
      in.q = dd.q.view(), in.k_cache = dd.k_cache.view(), in.v_cache = dd.v_cache.view();
      if (d.sinks.defined()) dd.sinks = d.sinks.to(dev), in.sinks = dd.sinks.view();
    }
    forward(in, {got.o.view(), got.lse.view()}, opt);
    if (dev.type != DeviceType::kCPU) got = {got.o.to(Device{}), got.lse.to(Device{})};
    r.ran = true;
  } catch (const Error& e) {
    r.error = e.what();
    r.skipped = e.code() == ErrorCode::kUnsupported;
    return r;
  }
  r.fields.push_back({"o", harness::compare(to_doubles(got.o), to_doubles(want.o), o_tolerance(s))});
  r.fields.push_back({"lse", harness::compare(to_doubles(got.lse), to_doubles(want.lse), lse_tolerance(s))});
  return r;
}

std::vector<CaseSpec> check_grid(bool quick) {
  harness::SeededGrid<CaseSpec> add(300);
  const std::vector<DType> dtypes = harness::check_dtypes(quick);
  for (DType dt : dtypes) {
    CaseSpec b;
    b.dtype = dt;
    CaseSpec c = b;
    c.label = "decode", c.q_lens = {1, 1, 1, 1}, c.kv_lens = {1, 7, 16, 45};
    add(c);
    c = b, c.label = "prefill", c.q_lens = {9, 17, 30}, c.kv_lens = {9, 23, 30};
    add(c);
    c = b, c.label = "mixed", c.q_lens = {1, 0, 12, 1, 5}, c.kv_lens = {33, 6, 19, 3, 5}, c.Dv = 24;
    add(c);  // q_len 0, Dv != D, kv_len not a multiple of page_size
    c.label = "mixed_shared_window_cap_sinks", c.shared_pages = true, c.window = 6, c.softcap = 3.0, c.sinks = true;
    add(c);
    c = b, c.label = "noncausal_mqa", c.causal = false, c.Hq = 6, c.Hkv = 1, c.q_lens = {2, 1, 4}, c.kv_lens = {11, 13, 4};
    add(c);
    c.label = "noncausal_window_mha_f32out", c.window = 3, c.Hkv = 6, c.f32_out = true, c.scale = 0.37;
    add(c);
    // An f8e4m3 KV cache (k_scale 1/40, v_scale 1/20: raw values up to 40 and 20), a mixed batch
    // with Dv != D, shared pages, window, soft cap and sinks.
    c = b, c.label = "f8kv_mixed", c.f8_cache = true, c.k_scale = 0.025, c.v_scale = 0.05;
    c.q_lens = {1, 0, 12, 1, 5}, c.kv_lens = {33, 6, 19, 3, 5}, c.Dv = 24;
    c.shared_pages = true, c.window = 6, c.softcap = 3.0, c.sinks = true;
    add(c);
  }
  CaseSpec c;
  for (DType dt : {DType::kBF16, DType::kF16}) {  // head dims that leave vector tails
    c = CaseSpec{}, c.label = "odd_dims", c.dtype = dt, c.D = 21, c.Dv = 13, c.Hq = 10, c.Hkv = 2, c.page_size = 3;
    c.q_lens = {1, 2, 7}, c.kv_lens = {17, 8, 9}, c.sinks = true;
    add(c);
  }
  c = CaseSpec{};
  c.label = "page1", c.page_size = 1, c.q_lens = {1, 6, 3}, c.kv_lens = {10, 6, 8}, c.shared_pages = true;
  add(c);
  c = CaseSpec{}, c.label = "page128", c.page_size = 128, c.q_lens = {1, 40, 1}, c.kv_lens = {300, 130, 129};
  c.D = 64, c.Dv = 32, c.dtype = DType::kBF16;
  add(c);
  c = CaseSpec{}, c.label = "gqa8_head128", c.Hq = 16, c.Hkv = 2, c.D = 128, c.Dv = 128, c.page_size = 16;
  c.q_lens = {1, 1, 20}, c.kv_lens = {200, 77, 20};
  add(c);
  // bf16 decode rows with D, Dv multiples of 32 (the cpu's vdpbf16ps path): head groups of 4 + 2
  // (G = 6) and 3, Dv with a 32-wide tail, blocks cut short by page ends (page_size 5) and by
  // kv_len, window + soft cap + sinks; and G = 1.
  c = CaseSpec{}, c.label = "bf16_decode_g6", c.dtype = DType::kBF16, c.Hq = 12, c.Hkv = 2, c.D = 64, c.Dv = 96;
  c.page_size = 5, c.q_lens = {1, 1, 1, 3}, c.kv_lens = {37, 1, 70, 9}, c.window = 20, c.softcap = 4.0, c.sinks = true;
  add(c);
  c = CaseSpec{}, c.label = "bf16_decode_g3", c.dtype = DType::kBF16, c.Hq = 6, c.Hkv = 2, c.D = 32, c.Dv = 64;
  c.page_size = 16, c.q_lens = {1, 1}, c.kv_lens = {100, 17}, c.f32_out = true;
  add(c);
  c.label = "bf16_decode_mha", c.Hq = 2, c.f32_out = false, c.causal = false;
  add(c);
  // f8e4m3 caches: bf16 decode rows of GQA 8 and D 128 (the cpu's bf16 dot path, widening the codes
  // in registers; cuda_v2's 16-byte key loads), and f16 with head dims of vector tails (D 20, Dv 24).
  c = CaseSpec{}, c.label = "f8kv_decode_gqa8", c.dtype = DType::kBF16, c.f8_cache = true, c.k_scale = 0.01;
  c.v_scale = 0.1, c.Hq = 16, c.Hkv = 2, c.D = 128, c.Dv = 128, c.page_size = 16, c.q_lens = {1, 1, 1};
  c.kv_lens = {200, 77, 16}, c.sinks = true;
  add(c);
  c = CaseSpec{}, c.label = "f8kv_odd_dims", c.dtype = DType::kF16, c.f8_cache = true, c.k_scale = 0.5, c.v_scale = 2.0;
  c.D = 20, c.Dv = 24, c.Hq = 6, c.Hkv = 3, c.page_size = 3, c.q_lens = {1, 4, 2}, c.kv_lens = {17, 9, 2};
  c.f32_out = true, c.softcap = 2.0;
  add(c);
  if (!quick) {  // long contexts on a few rows: split-KV and the combine
    c = CaseSpec{}, c.label = "long32k", c.page_size = 64, c.q_lens = {1, 2}, c.kv_lens = {32768, 20001};
    c.sinks = true, c.window = -1;
    add(c);
    c.label = "long32k_window", c.window = 5000, c.sinks = false, c.dtype = DType::kBF16, c.shared_pages = true;
    add(c);
    c.label = "long_f8kv", c.window = -1, c.sinks = true, c.f8_cache = true, c.k_scale = 0.02, c.v_scale = 0.04;
    c.kv_lens = {20001, 9000};  // split-KV: partials normalized with v_scale, then combined
    add(c);
  }
  return add.take();
}

}  // namespace tessera::paged_attention::testing
