// mla_decode: the check grid and parity against the reference.
#include "kernels/mla_decode/testing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/random.h"
#include "tessera/error.h"

namespace tessera::mla_decode::testing {
namespace {

int64_t pages_of(int64_t L, int64_t ps) { return (L + ps - 1) / ps; }

using harness::to_doubles;

using harness::nan_filled;

struct Outputs {
  Tensor o, lse;
};

Outputs make_outputs(const CaseSpec& s) {
  return {nan_filled(s.o_f32 ? DType::kF32 : s.dtype, {s.B(), s.Sq, s.Hq, s.Dv}),
          nan_filled(DType::kF32, {s.B(), s.Sq, s.Hq})};
}

void run(const CaseSpec& s, const Inputs& in, const std::string& impl, Outputs& o) {
  Options opt = s.opt;
  opt.dv = s.Dv;
  opt.implementation = impl;
  if (impl == "reference") opt.block_sizes.reset();
  forward(in, {o.o.view(), o.lse.view()}, opt);
}

// lse as doubles: a −inf on both sides compares as 0 = 0, on one side only as NaN in got.
void lse_for_compare(std::vector<double>& got, std::vector<double>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    const bool g = std::isinf(got[i]) && got[i] < 0, w = std::isinf(want[i]) && want[i] < 0;
    if (g && w) got[i] = want[i] = 0.0;
    else if (g || w) got[i] = NAN, want[i] = w ? 0.0 : want[i];
  }
}

}  // namespace

std::string CaseSpec::name() const {
  std::ostringstream n;
  n << "B" << B() << "_Sq" << Sq << "_Hq" << Hq << "_D" << D << "v" << Dv << "_ps" << page_size << "_L";
  n << *std::max_element(seqlens.begin(), seqlens.end()) << "_" << dtype_name(dtype);
  if (f8_cache) n << "_f8kv";
  if (!o_f32) n << "_o" << dtype_name(dtype);
  if (opt.causal) n << "_causal";
  if (shared) n << "_shared";
  if (!shuffle) n << "_inorder";
  if (opt.block_sizes) n << "_split" << opt.block_sizes->split_keys;
  return n.str();
}

Inputs CaseData::inputs() const { return {q.view(), kv.view(), page_table.view(), seqlens.view()}; }

CaseData make_case(const CaseSpec& s) {
  const int64_t B = s.B(), ps = s.page_size;
  int64_t max_pages = 1;
  for (int64_t L : s.seqlens) max_pages = std::max(max_pages, pages_of(L, ps) + 1);
  // Physical pages: entry b's pages in order, entry 0's first ones reused when shared, one spare.
  std::vector<std::vector<int64_t>> logical(static_cast<size_t>(B));
  int64_t P = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < pages_of(s.seqlens[static_cast<size_t>(b)], ps); ++k) {
      const bool reuse = s.shared && b > 0 && k + 1 < pages_of(s.seqlens[0], ps);
      logical[static_cast<size_t>(b)].push_back(reuse ? logical[0][static_cast<size_t>(k)] : P++);
    }
  ++P;
  std::vector<int64_t> perm(static_cast<size_t>(P));
  std::iota(perm.begin(), perm.end(), 0);
  if (s.shuffle)
    for (int64_t i = P - 1; i > 0; --i)
      std::swap(perm[static_cast<size_t>(i)], perm[random_bits(s.seed * 7 + 5, static_cast<uint64_t>(i)) % static_cast<uint64_t>(i + 1)]);
  CaseData d;
  d.q = random_uniform(s.dtype, {B, s.Sq, s.Hq, s.D}, 1.0f, s.seed * 7 + 1);
  // Values in [-1, 1] after dequantization (an f8e4m3 cache's raw values up to 1/kv_scale).
  const DType cache = s.f8_cache ? DType::kF8E4M3 : s.dtype;
  d.kv = random_uniform(cache, {P, ps, 1, s.D}, s.f8_cache ? static_cast<float>(1.0 / s.opt.kv_scale) : 1.0f, s.seed * 7 + 2);
  d.page_table = Tensor::empty(DType::kI32, {B, max_pages});
  d.seqlens = Tensor::empty(DType::kI32, {B});
  std::vector<char> read(static_cast<size_t>(P * ps), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = s.seqlens[static_cast<size_t>(b)];
    d.seqlens.data_as<int32_t>()[b] = static_cast<int32_t>(L);
    for (int64_t k = 0; k < max_pages; ++k) {
      const bool used = k < static_cast<int64_t>(logical[static_cast<size_t>(b)].size());
      const int64_t id = used ? perm[static_cast<size_t>(logical[static_cast<size_t>(b)][static_cast<size_t>(k)])] : -1;
      d.page_table.data_as<int32_t>()[b * max_pages + k] = static_cast<int32_t>(id);
    }
    for (int64_t j = 0; j < L; ++j) read[static_cast<size_t>(d.page_table.data_as<int32_t>()[b * max_pages + j / ps] * ps + j % ps)] = 1;
  }
  for (int64_t slot = 0; slot < P * ps; ++slot)
    if (!read[static_cast<size_t>(slot)])
      for (int64_t e = 0; e < s.D; ++e) store_from_f32(d.kv.data(), cache, slot * s.D + e, NAN);
  return d;
}

// Every implementation sees the same (already rounded) inputs and accumulates in f32, the
// reference in double. Scores are dot products of D ≤ 1024 values in [-1, 1] scaled by 1/√D (f32
// sum error ~ √D·2^-24 relative, < 1e-5 absolute), exponentiated and summed over up to ~8k keys
// in f32 (relative ~1e-6 with the running max shift), so o is within ~1e-5 of its scale and lse
// within ~1e-5 absolute. The tolerance 2e-4 (attention's) keeps 10x margin; a stored bf16 / f16
// o may differ by one unit 2u from the reference's rounding, and low-precision inputs also get
// 2.5u in the relative part (as attention). bf16 inputs on cpu's dot-product path also round the
// weights P to bf16 for P·V (as FlashMLA): each weight moves by δ_j ≤ 2^-8 of itself, o by
// Σ_j w_j δ_j v_j — at most 2^-8·|v| when one key dominates (then o ≈ v: one unit of the scale),
// ~2^-8·|v|·√(Σ w_j²) when the weights spread (o shrinks alike): inside the 2.5 units above
// (measured: 1.6e-3 of a scale ~1, 4e-5 of 0.035 at L = 8200; lse is summed from the f32
// weights and keeps 1e-5). A wrong key, page or mask moves o by a sizeable fraction of its
// scale (~1/√L), far past it.
harness::Tolerance o_tolerance(const CaseSpec& s) {
  auto unit = [](DType t) {
    return t == DType::kBF16 ? std::ldexp(1.0, -8) : t == DType::kF16 ? std::ldexp(1.0, -11) : 0.0;
  };
  const double compute = std::max(2e-4, 2.5 * unit(s.dtype));
  return {compute + 2.0 * unit(s.o_f32 ? DType::kF32 : s.dtype), compute};
}
harness::Tolerance lse_tolerance() { return {1e-4, 1e-5}; }

harness::ParityReport check_parity(const CaseSpec& s, const std::string& impl, Device dev) {
  harness::ParityReport r;
  r.case_name = s.name();
  r.implementation = impl;
  r.pass = pass_name(Pass::kForward);
  const CaseData d = make_case(s);
  Outputs want = make_outputs(s), got = make_outputs(s);
  run(s, d.inputs(), "reference", want);
  try {
    if (dev.type == DeviceType::kCPU) {
      run(s, d.inputs(), impl, got);
    } else {  // q, cache and outputs on the device; page table and lengths stay on the host
      const Tensor q = d.q.to(dev), kv = d.kv.to(dev);
      Outputs on{got.o.to(dev), got.lse.to(dev)};
      run(s, {q.view(), kv.view(), d.page_table.view(), d.seqlens.view()}, impl, on);
      got = {on.o.to(Device{}), on.lse.to(Device{})};
    }
    r.ran = true;
  } catch (const Error& e) {
    r.error = e.what();
    r.skipped = e.code() == ErrorCode::kUnsupported;
    return r;
  }
  r.fields.push_back({"o", harness::compare(to_doubles(got.o), to_doubles(want.o), o_tolerance(s))});
  std::vector<double> gl = to_doubles(got.lse), wl = to_doubles(want.lse);
  lse_for_compare(gl, wl);
  r.fields.push_back({"lse", harness::compare(gl, wl, lse_tolerance())});
  return r;
}

std::vector<CaseSpec> check_grid(bool quick) {
  harness::SeededGrid<CaseSpec> add(300);
  const std::vector<DType> dtypes{DType::kF32, DType::kBF16, DType::kF16};
  for (DType dt : dtypes) {
    // DeepSeek's shape: D 576 / Dv 512, 64-key pages, lengths not multiples of 64, causal Sq 2.
    CaseSpec ds;
    ds.dtype = dt, ds.D = 576, ds.Dv = 512, ds.page_size = 64, ds.Sq = 2, ds.Hq = 16;
    ds.seqlens = {1, 130, 700};
    ds.opt.causal = true;
    add(ds);
    // The same with an f8e4m3 cache (kv_scale 1/32: raw values up to 32; a lost scale moves o and
    // lse far past the tolerance).
    CaseSpec f8 = ds;
    f8.f8_cache = true, f8.opt.kv_scale = 1.0 / 32, f8.o_f32 = dt == DType::kF32;
    add(f8);
    // Many small entries sharing their first pages, o in the inputs' dtype.
    CaseSpec sm;
    sm.dtype = dt, sm.shared = true, sm.o_f32 = false, sm.page_size = 16;
    sm.seqlens.clear();
    for (int64_t b = 0; b < 32; ++b) sm.seqlens.push_back(40 + (b * 37) % 150);
    add(sm);
    if (quick && dt == DType::kF16) continue;  // bf16 kept: 2048 rows take the bf16 dot-product path
    // D = Dv = 80, an odd page size, Sq 16 causal with 128 heads (2048 rows at once).
    CaseSpec wide;
    wide.dtype = dt, wide.D = 80, wide.Dv = 80, wide.page_size = 7, wide.Sq = 16, wide.Hq = 128;
    wide.seqlens = {12, 150, 0};  // causal: some rows of the first entry see nothing
    wide.opt.causal = true;
    add(wide);
  }
  // Long context: 8,200 keys (not a multiple of 64), one entry, split automatically.
  CaseSpec lng;
  lng.D = 576, lng.Dv = 512, lng.page_size = 64, lng.Sq = 1, lng.Hq = 16, lng.seqlens = {8200};
  lng.dtype = DType::kBF16;
  if (!quick) add(lng);
  lng.f8_cache = true, lng.opt.kv_scale = 0.05;  // split partials of an f8e4m3 cache, each scaled
  if (!quick) add(lng);
  // Explicit split sizes, in-order pages.
  for (int64_t split : {1, 3, 64, 1000}) {
    CaseSpec c;
    c.seqlens = {3, 200, 64}, c.Sq = 2, c.shuffle = false;
    c.opt.causal = split % 2 == 1;
    c.opt.block_sizes = BlockSizes{split};
    add(c);
  }
  return add.take();
}

}  // namespace tessera::mla_decode::testing
