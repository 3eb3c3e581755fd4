// mla_decode cpu: the split-KV pipeline's own properties (the parity grid against the reference
// runs in AllKernels/Parity.CheckGrid/mla_decode_cpu_forward).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/random.h"
#include "scoped_env.h"
#include "kernels/mla_decode/cpu_stages.h"
#include "kernels/mla_decode/testing.h"
#include "kernels/registry.h"
#include "primitives/cpu_bf16_gemm.h"

namespace tessera::mla_decode {
namespace {

struct CpuRun {
  std::vector<float> o, lse;
};

CpuRun run_cpu(const testing::CaseSpec& s, const testing::CaseData& d, int64_t split_keys, int threads = 2) {
  CpuRun r{std::vector<float>(static_cast<size_t>(s.B() * s.Sq * s.Hq * s.Dv), NAN),
        std::vector<float>(static_cast<size_t>(s.B() * s.Sq * s.Hq), NAN)};
  Options opt = s.opt;
  opt.dv = s.Dv;
  opt.implementation = "cpu";
  opt.num_threads = threads;
  opt.block_sizes = BlockSizes{split_keys};
  EXPECT_EQ(forward(d.inputs(), {TensorView(r.o.data(), DType::kF32, {s.B(), s.Sq, s.Hq, s.Dv}),
                                 TensorView(r.lse.data(), DType::kF32, {s.B(), s.Sq, s.Hq})},
                    opt),
            "cpu");
  return r;
}

testing::CaseSpec split_case() {
  testing::CaseSpec s;
  s.seqlens = {300, 1, 0, 129};
  s.Sq = 3, s.Hq = 4, s.D = 40, s.Dv = 24, s.page_size = 10;
  s.opt.causal = true;
  return s;
}

// Splitting changes only the order of f32 sums: each split's partial is exact up to f32
// rounding of ~n terms and the combine reweights by exp(lse_s − lse) (relative ~1e-6), so the
// split and unsplit results agree to 1e-5 of their scale (values and o of order 1).
TEST(MlaDecodeCpu, SplitEqualsUnsplitForEverySplitCount) {
  const testing::CaseSpec s = split_case();
  const testing::CaseData d = testing::make_case(s);
  const CpuRun whole = run_cpu(s, d, 300);
  for (int64_t split : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{64}, int64_t{127}, int64_t{128}, int64_t{129}, int64_t{299},
                        int64_t{1000}, int64_t{0}, INT64_MAX}) {
    const CpuRun r = run_cpu(s, d, split);
    for (size_t i = 0; i < r.o.size(); ++i) ASSERT_NEAR(r.o[i], whole.o[i], 1e-5) << "split " << split << " o " << i;
    for (size_t i = 0; i < r.lse.size(); ++i) {
      if (std::isinf(whole.lse[i])) {
        ASSERT_EQ(r.lse[i], whole.lse[i]) << i;
        continue;
      }
      ASSERT_NEAR(r.lse[i], whole.lse[i], 1e-5) << "split " << split << " lse " << i;
    }
  }
}

// Each split and each row's combine is computed by one thread in a fixed order: bitwise the
// same for every thread count.
TEST(MlaDecodeCpu, DeterministicAcrossThreadCounts) {
  const testing::CaseSpec s = split_case();
  const testing::CaseData d = testing::make_case(s);
  const CpuRun one = run_cpu(s, d, 64, 1);
  for (int t : {2, 3, 8}) {
    const CpuRun r = run_cpu(s, d, 64, t);
    EXPECT_EQ(r.o, one.o) << t;
    EXPECT_EQ(r.lse, one.lse) << t;
  }
}

TEST(MlaDecodeCpu, AutomaticSplitsFeedTheThreads) {
  std::vector<int32_t> L = {8200};
  Problem p;
  p.B = 1, p.seqlens = L.data();
  const int64_t k = cpu::automatic_split_keys(p, 2);
  EXPECT_EQ(k % cpu::kChunk, 0);
  EXPECT_GE((8200 + k - 1) / k, 8);  // about 4 items per thread
  std::vector<int32_t> many(32, 4096);
  p.B = 32, p.seqlens = many.data();
  EXPECT_EQ(cpu::automatic_split_keys(p, 2), 4096);  // B alone feeds 2 threads: no split
  std::vector<int32_t> empty = {0};
  p.B = 1, p.seqlens = empty.data();
  EXPECT_GE(cpu::automatic_split_keys(p, 2), 1);
}

// Stage 2 alone against a float64 combine of the same partials, with a split that saw nothing
// (lse −inf, o garbage) and lse values far apart (shift needed).
TEST(MlaDecodeCpu, Stage2MatchesAFloat64Combine) {
  Problem p;
  p.B = 2, p.Sq = 2, p.Hq = 3, p.Dv = 5;
  std::vector<int32_t> L = {30, 10};
  p.seqlens = L.data();
  p.block_sizes = BlockSizes{10};  // 3 splits for entry 0, 1 for entry 1
  const cpu::Plan pl = cpu::plan(p, 2);
  ASSERT_EQ(pl.splits.size(), 4u);
  const int64_t R = p.rows();
  cpu::Partials part = cpu::Partials::allocate(4, R, p.Dv);
  for (int64_t i = 0; i < 4 * R * p.Dv; ++i) part.o[i] = static_cast<float>(random_unit(7, i) * 2 - 1);
  for (int64_t i = 0; i < 4 * R; ++i) part.lse[i] = static_cast<float>(random_unit(8, i) * 80 - 40);
  part.lse[1] = -std::numeric_limits<float>::infinity();  // entry 0, row 0, split 1 saw nothing
  part.o[static_cast<size_t>(R * p.Dv)] = NAN;             // ... and its o holds garbage
  std::vector<float> o(static_cast<size_t>(p.B * R * p.Dv)), lse(static_cast<size_t>(p.B * R));
  p.o = o.data(), p.lse = lse.data(), p.o_dtype = DType::kF32;
  cpu::stage2(p, pl, part, 2);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t first = pl.first[static_cast<size_t>(b)], nb = pl.first[static_cast<size_t>(b + 1)] - first;
      double m = -INFINITY, total = 0;
      for (int64_t s = 0; s < nb; ++s) m = std::max(m, double(part.lse[static_cast<size_t>(first * R + r * nb + s)]));
      for (int64_t s = 0; s < nb; ++s) total += std::exp(part.lse[static_cast<size_t>(first * R + r * nb + s)] - m);
      EXPECT_NEAR(lse[static_cast<size_t>(b * R + r)], m + std::log(total), 1e-5);
      for (int64_t d = 0; d < p.Dv; ++d) {
        double want = 0;
        for (int64_t s = 0; s < nb; ++s) {
          const double w = std::exp(part.lse[static_cast<size_t>(first * R + r * nb + s)] - m) / total;
          if (w > 0) want += w * part.o[static_cast<size_t>(((first + s) * R + r) * p.Dv + d)];
        }
        EXPECT_NEAR(o[static_cast<size_t>((b * R + r) * p.Dv + d)], want, 1e-6) << b << " " << r << " " << d;
      }
    }
}

// The check grid's cases on cpu (also run by the generic parity suite): the quick grid here.
TEST(MlaDecodeCpu, QuickGridMatchesReference) {
  for (const testing::CaseSpec& c : testing::check_grid(true)) {
    const harness::ParityReport r = testing::check_parity(c, "cpu");
    EXPECT_TRUE(r.ok()) << c.name() << ": " << r.error << (r.fields.empty() ? "" : r.fields[0].dev.str())
                        << (r.fields.size() < 2 ? "" : " lse " + r.fields[1].dev.str());
  }
}

}  // namespace
}  // namespace tessera::mla_decode

namespace tessera::mla_decode {

const kernels::KernelSpec& spec();  // spec.cc

namespace {

// The bench cost model (`tessera bench --predict`): 2·pairs·(D + Dv) useful FLOPs, the cache
// read once; causal counts only the visible pairs. And the spec declares the two stages.
TEST(MlaDecodeBench, CostCountsVisiblePairsAndCacheBytes) {
  const kernels::KernelSpec& k = spec();
  EXPECT_EQ(k.stages, (std::vector<harness::Stage>{"mla_decode.split_kv", "mla_decode.combine"}));
  harness::OptionValues o;
  for (const auto& spec_opt : k.bench.options) o.set(spec_opt.name, spec_opt.default_value);
  harness::GridShape shape;
  shape.dims = {{"B", 2}, {"Sq", 4}, {"Hq", 16}, {"T", 100}};
  auto p = k.bench.make_cost_model(shape, DType::kBF16, o);
  const harness::Cost c = p->cost(Pass::kForward, "cpu");
  const double pairs = 2.0 * 4 * 16 * 100;
  EXPECT_DOUBLE_EQ(c.flops_useful, 2.0 * pairs * (576 + 512));
  EXPECT_DOUBLE_EQ(c.transcendentals, pairs);
  EXPECT_GE(c.bytes, 2.0 * 100 * 576 * 2);  // the bf16 cache, once
  o.set("causal", "true");
  p = k.bench.make_cost_model(shape, DType::kBF16, o);
  EXPECT_DOUBLE_EQ(p->cost(Pass::kForward, "cpu").transcendentals, 2.0 * 16 * (97 + 98 + 99 + 100));
}

}  // namespace
}  // namespace tessera::mla_decode

namespace tessera::mla_decode {
namespace {

// bf16 inputs: the dot-product path and the f32 sgemm path (TESSERA_CPU_BF16_DOT=0). The scores
// are the same exact products summed in another order, and l sums the f32 weights on both, so
// lse agrees to f32 rounding (1e-5). o differs by the rounding of P to bf16 for P·V: each weight
// moves by at most 2^-8 of itself (nearest even, 8 significant bits), so
// |Δo| = |Σ_j p_j δ_j v_j| / l ≤ 2^-8 · max|v| = 2^-8 here (values in [-1, 1]); f32 sums add
// ~1e-6.
// A bf16 cache, and an f8e4m3 one (widened to bf16 chunk by chunk on the dot route, to f32 on the other).
TEST(MlaDecodeCpu, Bf16DotPathEqualsTheF32Path) {
  for (bool f8 : {false, true}) {
  const tessera::testing::Bf16DotOn on;  // natively, or through the portable loops without AVX512-BF16
  testing::CaseSpec s;
  s.seqlens = {300, 1, 0, 129};
  s.Sq = 3, s.Hq = 32, s.D = 41, s.Dv = 24, s.page_size = 10, s.dtype = DType::kBF16;  // odd D, Dv < 32
  s.opt.causal = true;
  s.f8_cache = f8, s.opt.kv_scale = f8 ? 1.0 / 16 : 1.0;
  const testing::CaseData d = testing::make_case(s);
  const CpuRun dot = run_cpu(s, d, 64);
  CpuRun f32;
  {
    const tessera::testing::ScopedEnv off("TESSERA_CPU_BF16_DOT", "0");
    f32 = run_cpu(s, d, 64);
  }
  double worst = 0;
  for (size_t i = 0; i < dot.o.size(); ++i) {
    ASSERT_NEAR(dot.o[i], f32.o[i], std::ldexp(1.0, -8) + 1e-5) << i;
    worst = std::max(worst, double(std::abs(dot.o[i] - f32.o[i])));
  }
  EXPECT_GT(worst, 0.0);  // the paths really differ: the dot products ran
  for (size_t i = 0; i < dot.lse.size(); ++i)
    if (!std::isinf(f32.lse[i])) ASSERT_NEAR(dot.lse[i], f32.lse[i], 1e-5) << i;
  }
}

// Inf in a cache entry j < L_b that the last query of a causal multi-token decode sees and the
// others do not: only the rows that see it go non-finite, as in the reference (cpu multiplied
// the other rows' 0 weights by Inf in P·V: NaN), and those rows are NaN (cpu wrote o = 0, lse =
// −inf, "saw nothing", where a +Inf score made the softmax sum NaN). f32, and bf16 on the dot route (natively, or the
// portable loops); a chunk of 128 keys wholly visible to every row before the straddling one.
TEST(MlaDecodeCpu, InfInAKeyARowDoesNotSeeStaysOutOfThatRow) {
  const tessera::testing::Bf16DotOn on;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t bad_dim : {0, 30}) {  // inside Dv (reaches o), past it (scores only)
      testing::CaseSpec s;
      s.seqlens = {150, 7};
      s.Sq = 3, s.Hq = 4, s.D = 40, s.Dv = 24, s.page_size = 10, s.dtype = dt;
      s.opt.causal = true;
      testing::CaseData d = testing::make_case(s);
      Problem where;
      where.page_table = static_cast<const int32_t*>(d.page_table.data());
      where.page_size = s.page_size, where.max_pages = d.page_table.shape()[1], where.D = s.D;
      store_from_f32(d.kv.data(), dt, where.entry(0, 149) + bad_dim, INFINITY);  // seen by query 2 only
      const CpuRun got = run_cpu(s, d, 1024);
      std::vector<float> want(got.o.size()), want_lse(got.lse.size());
      Options opt = s.opt;
      opt.dv = s.Dv, opt.implementation = "reference";
      forward(d.inputs(), {TensorView(want.data(), DType::kF32, {s.B(), s.Sq, s.Hq, s.Dv}),
                           TensorView(want_lse.data(), DType::kF32, {s.B(), s.Sq, s.Hq})},
              opt);
      int64_t bad = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(std::isfinite(got.o[i]), std::isfinite(want[i]))
            << dtype_name(dt) << " dim " << bad_dim << " element " << i << ": cpu " << got.o[i] << ", reference " << want[i];
        if (!std::isfinite(want[i])) {
          ++bad;
          continue;
        }
        EXPECT_NEAR(got.o[i], want[i], dt == DType::kF32 ? 2e-5 : 1e-2) << i;  // bf16: P rounded to bf16
      }
      for (size_t i = 0; i < want_lse.size(); ++i) {  // NaN where the row sees the Inf (not "saw nothing")
        ASSERT_EQ(std::isnan(got.lse[i]), std::isnan(want_lse[i])) << i << ": cpu " << got.lse[i] << ", reference " << want_lse[i];
        if (!std::isnan(want_lse[i])) EXPECT_NEAR(got.lse[i], want_lse[i], 1e-4) << i;
      }
      EXPECT_GT(bad, 0) << "query 2 sees the Inf";
      EXPECT_LT(bad, int64_t(want.size()) / 2) << "queries 0 and 1 and sequence 1 do not";
    }
}

}  // namespace
}  // namespace tessera::mla_decode
