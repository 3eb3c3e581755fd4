// grouped_matmul: the check grid and parity against the reference.
#include "kernels/grouped_matmul/testing.h"

#include <cmath>
#include <numeric>
#include <sstream>

#include "core/random.h"
#include "tessera/error.h"

namespace tessera::grouped_matmul::testing {
namespace {

using harness::to_doubles;

struct Outputs {
  Tensor out, dlhs, drhs;
};

Outputs to_device(const Outputs& o, Device dev) { return {o.out.to(dev), o.dlhs.to(dev), o.drhs.to(dev)}; }

Outputs make_outputs(const CaseSpec& s, const CaseData& d) {
  const DType t = s.f32_outputs ? DType::kF32 : s.dtype;
  // NaN-filled: an output element an implementation forgets to write is caught.
  return {harness::nan_filled(t, {s.M, s.N}), harness::nan_filled(t, d.lhs.shape()), harness::nan_filled(t, d.rhs.shape())};
}

void run_one(const CaseSpec& s, const CaseData& d, const std::string& impl, Pass pass, Outputs& o) {
  Options opt = options_of(s);
  opt.implementation = impl;
  if (impl == "reference") opt.block_sizes.reset();
  switch (pass) {
    case Pass::kForward: gmm(d.inputs(), o.out.view(), opt); break;
    case Pass::kBackward: backward(d.inputs(), d.dout.view(), o.dlhs.view(), o.drhs.view(), opt); break;
    case Pass::kFused:
      forward_backward(d.inputs(), d.dout.view(), o.out.view(), o.dlhs.view(), o.drhs.view(), opt);
      break;
  }
}

}  // namespace

int64_t CaseSpec::G_local() const {
  return local_groups >= 0 ? local_groups : static_cast<int64_t>(sizes.size()) - offset.value_or(0);
}

std::string CaseSpec::name() const {
  std::ostringstream s;
  s << label << "_M" << M << "K" << K << "N" << N << "G" << sizes.size() << "_" << dtype_name(dtype);
  if (transpose_rhs) s << "_T";
  if (offset) s << "_off" << *offset << "x" << G_local();
  if (f32_outputs) s << "_f32out";
  if (opt.block_sizes) s << "_bs" << opt.block_sizes->m << "x" << opt.block_sizes->n;
  return s.str();
}

Options options_of(const CaseSpec& s) {
  Options o = s.opt;
  o.transpose_rhs = s.transpose_rhs;
  o.group_offset = s.offset;
  return o;
}

CaseData make_case(const CaseSpec& s) {
  CaseData d;
  const int64_t G = s.G_local();
  d.lhs = random_uniform(s.dtype, {s.M, s.K}, 1.0f, s.seed * 4 + 1);
  d.rhs = random_uniform(s.dtype, s.transpose_rhs ? Shape{G, s.N, s.K} : Shape{G, s.K, s.N}, 1.0f, s.seed * 4 + 2);
  d.dout = random_uniform(s.dtype, {s.M, s.N}, 1.0f, s.seed * 4 + 3);
  d.group_sizes = Tensor::empty(s.sizes_dtype, {static_cast<int64_t>(s.sizes.size())});
  for (size_t g = 0; g < s.sizes.size(); ++g) {
    if (s.sizes_dtype == DType::kI32)
      d.group_sizes.data_as<int32_t>()[g] = static_cast<int32_t>(s.sizes[g]);
    else
      d.group_sizes.data_as<int64_t>()[g] = s.sizes[g];
  }
  return d;
}

// Every implementation sees the same (already rounded) inputs and accumulates in f32, the
// reference in double, so the differences come from (a) f32 sums of K (gmm) or group-row (tgmm)
// products of values in [-1, 1]: relative to the output's scale ~ sqrt(n)·2^-24, < 2e-6 for the
// n ≤ 2000 of the grid, and (b) rounding the stored output to its dtype, which both sides do, so
// stored values may differ by one unit 2u (u = 2^-8 bf16, 2^-11 f16, 0 f32). Hence an absolute
// part of 2e-5 times the output's largest magnitude (10x over (a)) and a relative part of
// 2e-5 + 2u. Any wrong term (a row in the wrong group, a missing row, a wrong matrix) moves
// values by ~1/sqrt(n) of the scale, 100x past it; rows that must be zero must be exactly zero
// wherever the whole output is zero, and within 2e-5 of the scale otherwise.
harness::Tolerance tolerance(const CaseSpec& s) {
  const DType stored = s.f32_outputs ? DType::kF32 : s.dtype;
  const double u = stored == DType::kBF16 ? std::ldexp(1.0, -8) : stored == DType::kF16 ? std::ldexp(1.0, -11) : 0.0;
  return {2e-5 + 2.0 * u, 2e-5};
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
    } else {  // inputs and outputs on the device, group sizes on the host; results copied back
      const CaseData dd{d.lhs.to(dev), d.rhs.to(dev), d.group_sizes, d.dout.to(dev)};
      Outputs on = to_device(got, dev);
      run_one(s, dd, impl, pass, on);
      got = to_device(on, Device{});
    }
    r.ran = true;
  } catch (const Error& e) {
    r.error = e.what();
    r.skipped = e.code() == ErrorCode::kUnsupported;
    return r;
  }
  const harness::Tolerance tol = tolerance(s);
  if (pass != Pass::kBackward) r.fields.push_back({"out", harness::compare(to_doubles(got.out), to_doubles(want.out), tol)});
  if (pass != Pass::kForward) {
    r.fields.push_back({"dlhs", harness::compare(to_doubles(got.dlhs), to_doubles(want.dlhs), tol)});
    r.fields.push_back({"drhs", harness::compare(to_doubles(got.drhs), to_doubles(want.drhs), tol)});
  }
  return r;
}

std::vector<CaseSpec> check_grid(bool quick) {
  harness::SeededGrid<CaseSpec> add(100);
  const std::vector<DType> dtypes = harness::check_dtypes(quick);
  for (DType dt : dtypes) {
    CaseSpec base;
    base.dtype = dt;
    CaseSpec c = base;
    c.label = "even", c.M = 32, c.sizes = {8, 8, 8, 8};
    add(c);
    c = base, c.label = "ragged_empty_tail", c.M = 37, c.K = 19, c.N = 23, c.sizes = {5, 0, 17, 1, 0, 9};
    add(c);  // Σ = 32 < 37: rows past the sum are zero
    c.label = "ragged_T", c.transpose_rhs = true, c.sizes_dtype = DType::kI64;
    add(c);
    c = base, c.label = "all_empty", c.sizes = {0, 0, 0};
    add(c);
    c = base, c.label = "one_group", c.M = 40, c.K = 33, c.N = 17, c.sizes = {40}, c.f32_outputs = true;
    add(c);
    c = base, c.label = "offset", c.M = 30, c.sizes = {4, 7, 0, 6, 5, 8}, c.offset = 2, c.local_groups = 3;
    add(c);  // rows of groups 0, 1, 5 are another shard's: zero
    c.label = "offset_T", c.transpose_rhs = true, c.offset = 0, c.local_groups = 2;
    add(c);
    // Tail tiles: blocks that do not divide the group rows, K or N.
    c = base, c.label = "tails", c.M = 70, c.K = 45, c.N = 51, c.sizes = {33, 2, 0, 29}, c.opt.block_sizes = BlockSizes{16, 16};
    add(c);
  }
  // Many tiny groups (skewed routing): 64 experts over 1000 rows, some empty.
  CaseSpec t;
  t.label = "tiny_groups", t.M = 1000, t.K = 24, t.N = 20;
  t.sizes.assign(64, 0);
  for (int g = 0; g < 64; ++g) t.sizes[static_cast<size_t>(g)] = (g % 5 == 3) ? 0 : (g * 7) % 29 + 1;
  add(t);
  return add.take();
}

}  // namespace tessera::grouped_matmul::testing
