// Parity of the optimized CPU backend ("cpu") against the reference oracle over the shared grid
// (kernels/attention/testing.h: the same cases and dtype-justified tolerances the generic parity
// suite uses), rerun with tiny blocks (tails and mask edges in every tile) and 1-3 threads (the
// chunked backward), plus determinism, rows that see nothing, large logits and memory bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/memory.h"
#include "scoped_env.h"
#include "hwy/targets.h"
#include "kernels/attention/testing.h"
#include "primitives/cpu_bf16_gemm.h"
#include "tessera/attention.h"
#include "tessera/error.h"

namespace tessera::attention {
namespace {

namespace at = testing;

void expect_parity(const at::CaseSpec& spec, const std::string& label) {
  for (Pass pass : {Pass::kForward, Pass::kBackward, Pass::kFused}) {
    const at::ParityReport r = at::check_parity(spec, "cpu", pass);
    ASSERT_TRUE(r.ran) << label << " " << r.case_name << " " << pass_name(pass) << ": " << r.error;
    for (const auto& f : r.fields)
      EXPECT_TRUE(f.dev.ok()) << label << " " << r.case_name << " " << pass_name(pass) << " " << f.field << ": "
                              << f.dev.str();
  }
}

TEST(AttentionCpu, BuiltInCheckGrid) {
  for (const at::CaseSpec& c : at::check_grid()) expect_parity(c, "default blocks");
}

// The cpu backend's mask is the rule of primitives/philox.h (read back through o: testing.h),
// each dtype (bf16 on the dot route where the CPU has AVX512-BF16), with default tiles and with
// kv tiles of 7 keys (tiles that start off a Philox call's four keys) on 3 threads.
TEST(AttentionCpu, DropoutMaskIsThePhiloxRule) {
  const int32_t seed[2] = {123456789, -42};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (double p : {0.1, 0.5}) {
      const std::vector<uint8_t> want = at::dropout_mask_rule(2, 5, 37, 3, p, seed);
      EXPECT_EQ(at::dropout_mask_through_o("cpu", Device::cpu(), dt, 2, 5, 37, 3, 1, p, seed), want)
          << dtype_name(dt) << " p=" << p;
      EXPECT_EQ(at::dropout_mask_through_o("cpu", Device::cpu(), dt, 2, 5, 37, 3, 1, p, seed, BlockSizes{3, 7}, 3), want)
          << dtype_name(dt) << " p=" << p << " blocks q=3,kv=7";
    }
}

// Tiny odd blocks: several q and kv tiles per row range, tails, tiles that cross every mask
// edge; 1, 2 and 3 threads (3 > the number of (sequence, kv head) pairs in several cases, so the
// backward splits kv blocks into chunks and reduces their dq partials).
TEST(AttentionCpu, SmallBlocksAndThreadCounts) {
  int k = 0;
  for (at::CaseSpec c : at::check_grid(/*quick=*/true)) {
    c.opt.block_sizes = BlockSizes{5, 7};
    c.opt.num_threads = 1 + (k++ % 3);
    expect_parity(c, "blocks q=5,kv=7");
  }
}

// The backward without prepacked Q / dO (the path of sequences too long to prepack).
// (Prepacking exists on the Highway kernel's route only: TESSERA_ATTENTION_CPU_GEMM=hwy.)
TEST(AttentionCpu, BackwardWithoutPrepack) {
  setenv("TESSERA_ATTENTION_CPU_GEMM", "hwy", 1);
  setenv("TESSERA_ATTENTION_CPU_PREPACK", "0", 1);
  int k = 0;
  for (at::CaseSpec c : at::check_grid(/*quick=*/true)) {
    c.opt.block_sizes = BlockSizes{8, 16};
    c.opt.num_threads = 1 + (k++ % 2);
    expect_parity(c, "no prepack");
  }
  unsetenv("TESSERA_ATTENTION_CPU_PREPACK");
  unsetenv("TESSERA_ATTENTION_CPU_GEMM");
}

// The f32 products on the Highway micro-kernel (TESSERA_ATTENTION_CPU_GEMM=hwy; the default runs
// primitives/cpu_f32_gemm where the CPU has AVX-512F), with the backward's Q/dO prepacking.
TEST(AttentionCpu, HighwayMicroKernel) {
  setenv("TESSERA_ATTENTION_CPU_GEMM", "hwy", 1);
  int k = 0;
  for (at::CaseSpec c : at::check_grid(/*quick=*/true)) {
    c.opt.block_sizes = k % 2 ? BlockSizes{5, 7} : BlockSizes{32, 48};
    c.opt.num_threads = 1 + (k++ % 2);
    expect_parity(c, "hwy");
  }
  unsetenv("TESSERA_ATTENTION_CPU_GEMM");
}

// bf16 inputs run on the AVX512-BF16 dot product by default where the CPU has it (P and dS
// rounded to bf16: the grid's tolerances allow one bf16 rounding per product term, testing.cc);
// TESSERA_ATTENTION_CPU_BF16_DOT=0 (or the primitives' TESSERA_CPU_BF16_DOT=0) keeps the f32 route,
// which must pass the same grid. Odd blocks: odd K for the pairs of the dot product (q = 5 rows in
// dKᵀ += Qᵀ·dS), tails of every panel. Then the dot route must really have run: its f32 o differs
// from the f32 route's (P rounded to bf16); without AVX512-BF16 the route runs through the portable
// loops (TESSERA_CPU_BF16_DOT=portable).
std::vector<float> o_f32_of(const at::CaseSpec& c) {
  const at::CaseData d = at::make_case(c);
  Tensor o = Tensor::empty(DType::kF32, at::o_shape(c)), lse = Tensor::empty(DType::kF32, at::lse_shape(c));
  Options opt = c.opt;
  opt.implementation = "cpu";
  forward(d.inputs(), {o.view(), lse.view()}, opt);
  return std::vector<float>(o.data_as<float>(), o.data_as<float>() + o.numel());
}

TEST(AttentionCpu, Bf16DotRouteAndF32Route) {
  const tessera::testing::Bf16DotOn on;  // natively, or through the portable loops without AVX512-BF16
  for (const char* env : {"TESSERA_ATTENTION_CPU_BF16_DOT", ""}) {
    if (*env) setenv(env, "0", 1);
    int k = 0;
    for (at::CaseSpec c : at::check_grid(/*quick=*/true)) {
      if (c.dtype != DType::kBF16) continue;
      c.opt.block_sizes = k % 2 ? BlockSizes{5, 33} : BlockSizes{16, 48};
      c.opt.num_threads = 1 + (k++ % 2);
      expect_parity(c, std::string(*env ? env : "bf16 dot") + (*env ? "=0" : "") + " blocks " +
                           std::to_string(c.opt.block_sizes->q) + "x" + std::to_string(c.opt.block_sizes->kv));
    }
    if (*env) unsetenv(env);
  }
  at::CaseSpec c;
  c.dtype = DType::kBF16;
  const std::vector<float> dot = o_f32_of(c);
  setenv("TESSERA_ATTENTION_CPU_BF16_DOT", "0", 1);
  const std::vector<float> f32 = o_f32_of(c);
  unsetenv("TESSERA_ATTENTION_CPU_BF16_DOT");
  double worst = 0;
  for (size_t i = 0; i < dot.size(); ++i) worst = std::max(worst, double(std::abs(dot[i] - f32[i])));
  EXPECT_GT(worst, 0.0) << "the bf16 dot route did not run";
  EXPECT_LT(worst, 1e-2);  // |v| <= 1: P's bf16 rounding moves o by <= 2^-9 · max|v| (plus f32 sums)
}

// The SIMD kernels on narrower instruction sets than this machine's best (Highway dispatches at
// run time: AVX-512 here, AVX2 or SSE4 elsewhere; panel widths and tails differ).
TEST(AttentionCpu, NarrowerInstructionSets) {
  setenv("TESSERA_ATTENTION_CPU_GEMM", "hwy", 1);  // the Highway tile products too
  for (int64_t target : {int64_t{HWY_AVX2}, int64_t{HWY_SSE4}}) {
    if (!(hwy::SupportedTargets() & target)) continue;
    hwy::SetSupportedTargetsForTest(target);
    int k = 0;
    for (at::CaseSpec c : at::check_grid(/*quick=*/true)) {
      c.opt.block_sizes = BlockSizes{k % 2 ? 7 : 32, k % 2 ? 11 : 48};
      c.opt.num_threads = 1 + (k++ % 2);
      expect_parity(c, std::string("target ") + hwy::TargetName(target));
    }
    hwy::SetSupportedTargetsForTest(0);
  }
  unsetenv("TESSERA_ATTENTION_CPU_GEMM");
}

// One sequence and more threads than kv heads: chunked backward, every option, without and with
// dropout. MQA (3 query heads on 1 kv head) splits the heads; a single head (Hq = Hkv = 1) splits
// the kv blocks.
TEST(AttentionCpu, ChunkedBackwardEveryOption) {
  uint64_t seed = 500;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})  // f16: the f32 route's per-thread dq stored in f16
  for (int64_t hq : {3, 1}) {
    at::CaseSpec c;
    c.dtype = dt;
    c.B = 1;
    c.Sq = 45;
    c.Sk = 53;
    c.Hq = hq;
    c.Hkv = 1;
    c.D = 20;
    c.Dv = 12;
    c.opt.causal = true;
    c.opt.window_left = 30;
    c.opt.softcap = 4.0;
    c.alibi = 1;
    c.segments = 2;
    c.logit_scale = 3.0;
    c.opt.block_sizes = BlockSizes{8, 8};
    c.seed = seed++;
    for (double drop : {0.0, 0.3})
      for (int t : {2, 3, 5}) {
        c.opt.num_threads = t;
        c.opt.dropout_p = drop;
        expect_parity(c, "threads=" + std::to_string(t) + " dropout=" + std::to_string(drop));
      }
  }
  // Varlen (two sequences, one head each: 2 pairs on 4 threads) splits too: each sequence's kv
  // blocks, at its own offsets.
  for (DType dt : {DType::kF32, DType::kBF16}) {
    at::CaseSpec v;
    v.dtype = dt, v.Hq = 1, v.Hkv = 1, v.D = 20, v.Dv = 12;
    v.seqlens_q = {7, 30}, v.seqlens_k = {19, 41};
    v.opt.causal = true, v.opt.softcap = 4.0, v.opt.block_sizes = BlockSizes{8, 8}, v.opt.num_threads = 4;
    v.seed = seed++;
    expect_parity(v, "varlen threads=4");
    v.opt.dropout_p = 0.2;
    expect_parity(v, "varlen threads=4 dropout=0.2");
  }
}

// Large logits: the online softmax must stay stable (no overflow, no NaN).
TEST(AttentionCpu, LargeLogits) {
  at::CaseSpec c;
  c.Sq = 33;
  c.Sk = 70;
  c.logit_scale = 60.0;
  c.opt.block_sizes = BlockSizes{16, 16};
  expect_parity(c, "logits~60");
  c.opt.causal = true;
  c.opt.softcap = 30.0;
  expect_parity(c, "logits~60 softcap");
}

struct CpuRun {
  Tensor o, lse, dq, dk, dv;
};
CpuRun run_cpu(const at::CaseSpec& s, const at::CaseData& d) {
  CpuRun r;
  Options opt = s.opt;
  opt.implementation = "cpu";
  r.o = Tensor::empty(s.dtype, at::o_shape(s));
  r.lse = Tensor::empty(DType::kF32, at::lse_shape(s));
  r.dq = Tensor::empty(s.dtype, d.q.shape());
  r.dk = Tensor::empty(s.dtype, d.k.shape());
  r.dv = Tensor::empty(s.dtype, d.v.shape());
  forward_backward(d.inputs(), d.grad_o, {r.o, r.lse}, {r.dq, r.dk, r.dv}, opt);
  return r;
}
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.view().nbytes() == b.view().nbytes() && std::memcmp(a.data(), b.data(), a.view().nbytes()) == 0;
}

// Bitwise reproducible for a fixed thread count; forward (and backward without chunking) even
// across thread counts.
TEST(AttentionCpu, Deterministic) {
  at::CaseSpec s;
  s.B = 2;
  s.Sq = 61;
  s.Sk = 77;
  s.Hq = 4;
  s.Hkv = 2;
  s.D = 32;
  s.opt.causal = true;
  s.opt.window_left = 23;  // kv spans that start mid-sequence
  s.opt.block_sizes = BlockSizes{16, 16};
  const at::CaseData d = at::make_case(s);
  for (int t : {1, 3, 8}) {  // 8 > B·Hkv = 4: the backward splits each pair's 2 query heads
    s.opt.num_threads = t;
    const CpuRun a = run_cpu(s, d), b = run_cpu(s, d);
    for (auto [x, y] : {std::pair<const Tensor*, const Tensor*>{&a.o, &b.o}, {&a.lse, &b.lse}, {&a.dq, &b.dq}, {&a.dk, &b.dk}, {&a.dv, &b.dv}})
      EXPECT_TRUE(same_bits(*x, *y)) << "threads=" << t;
  }
  s.opt.num_threads = 1;
  const CpuRun one = run_cpu(s, d);
  s.opt.num_threads = 4;  // 4 = B·Hkv: no chunks
  const CpuRun four = run_cpu(s, d);
  for (auto [x, y] : {std::pair<const Tensor*, const Tensor*>{&one.o, &four.o}, {&one.lse, &four.lse}, {&one.dq, &four.dq}, {&one.dk, &four.dk}, {&one.dv, &four.dv}})
    EXPECT_TRUE(same_bits(*x, *y));
  // One head (Hq = Hkv = 1, B = 1) on 3 threads: the kv blocks split, dq reduced from f32
  // partials in chunk order — the same bits on every run.
  at::CaseSpec k = s;
  k.B = 1, k.Hq = 1, k.Hkv = 1, k.opt.num_threads = 3;
  const at::CaseData kd = at::make_case(k);
  const CpuRun a = run_cpu(k, kd), b = run_cpu(k, kd);
  for (auto [x, y] : {std::pair<const Tensor*, const Tensor*>{&a.dq, &b.dq}, {&a.dk, &b.dk}, {&a.dv, &b.dv}})
    EXPECT_TRUE(same_bits(*x, *y)) << "kv split";
}

// The bias in every broadcast pattern (all 16), in every dtype, on 8×8 tiles (tails at 21 rows and 27
// keys) and 1 or 3 threads, with the causal mask, a window, −inf entries and GQA: parity of o,
// lse and every gradient, dbias included.
TEST(AttentionCpu, BiasEveryBroadcastTilesAndThreads) {
  uint64_t seed = 700;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (const char* shape : {"BHQK", "1HQK", "B1QK", "BH1K", "11QK", "111K", "BHQ1", "1111", "BH11", "B111", "1H11",
                              "1H1K", "1HQ1", "B1Q1", "B11K", "11Q1"}) {
      at::CaseSpec c;
      c.dtype = dt, c.B = 2, c.Sq = 21, c.Sk = 27, c.Hq = 4, c.Hkv = 2, c.D = 12, c.Dv = 8;
      c.bias = shape;
      c.bias_f32 = dt == DType::kBF16;
      c.bias_masks = true;
      c.opt.causal = true;
      c.opt.window_left = 15;
      c.opt.block_sizes = BlockSizes{8, 8};
      c.seed = seed++;
      for (int t : {1, 3}) {
        c.opt.num_threads = t;
        expect_parity(c, "threads=" + std::to_string(t));
      }
    }
}

// A bias that is not broadcast, without a soft cap, has its dbias written by the backward itself
// as each dS tile is computed (direct_dbias), also from the chunked items: a single sequence with
// 3 query heads on one kv head splits the heads, a single head splits the kv blocks; every dtype,
// with dropout and a window, on 2, 3 and 5 threads.
TEST(AttentionCpu, BiasGradientWrittenByTheChunkedBackward) {
  uint64_t seed = 800;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t hq : {3, 1}) {
      at::CaseSpec c;
      c.dtype = dt, c.B = 1, c.Sq = 45, c.Sk = 53, c.Hq = hq, c.Hkv = 1, c.D = 20, c.Dv = 12;
      c.bias = "1HQK";  // B = 1: not broadcast
      c.bias_masks = true;
      c.opt.causal = true, c.opt.window_left = 30, c.opt.dropout_p = 0.2;
      c.opt.block_sizes = BlockSizes{8, 8};
      c.seed = seed++;
      for (int t : {2, 3, 5}) {
        c.opt.num_threads = t;
        expect_parity(c, "threads=" + std::to_string(t));
      }
    }
}

// A bf16 / f16 bias is converted 256 keys at a time: kv tiles of 512 over 600 keys take two
// chunks and a tail, on both dbias paths (not broadcast: direct; broadcast over B: the pass).
TEST(AttentionCpu, HalfBiasOnWideKvTiles) {
  uint64_t seed = 900;
  for (DType dt : {DType::kBF16, DType::kF16})
    for (const char* shape : {"BHQK", "1HQK"}) {
      at::CaseSpec c;
      c.dtype = dt, c.B = 2, c.Sq = 9, c.Sk = 600, c.Hq = 2, c.Hkv = 1, c.D = 16, c.Dv = 16;
      c.bias = shape;
      c.bias_masks = true;
      c.opt.block_sizes = BlockSizes{16, 512};
      c.seed = seed++;
      expect_parity(c, "kv=512");
    }
}

// dbias sums over its broadcast dims in one order whatever the thread count (its tiles and their
// slices of (sequence, head) pairs depend on the shape only; slices are added in order): the same
// bits on 1, 2, 3 and 5 threads — "1111" and "11Q1" cut their 12 pairs into slices.
TEST(AttentionCpu, BiasGradientIsTheSameOnEveryThreadCount) {
  for (const char* shape : {"1HQK", "11QK", "B11K", "1111", "11Q1", "BHQK"}) {  // BHQK: written directly
    at::CaseSpec s;
    s.B = 3, s.Sq = 37, s.Sk = 41, s.Hq = 4, s.Hkv = 2, s.D = 16;
    s.bias = shape;
    s.opt.causal = true;
    s.opt.block_sizes = BlockSizes{16, 16};
    const at::CaseData d = at::make_case(s);
    Tensor first;
    for (int t : {1, 2, 3, 5}) {
      Options opt = s.opt;
      opt.implementation = "cpu";
      opt.num_threads = t;
      Result r = compute_with_grad(d.inputs(), d.grad_o, opt);
      ASSERT_TRUE(r.dbias.defined());
      if (!first.defined()) first = r.dbias;
      EXPECT_TRUE(same_bits(first, r.dbias)) << shape << " threads=" << t;
    }
  }
}

// Rows that see nothing (causal Sq > Sk, a window that misses, a lonely segment): o = 0,
// lse = −inf, finite gradients.
TEST(AttentionCpu, RowsThatSeeNothing) {
  at::CaseSpec s;
  s.Sq = 40;
  s.Sk = 9;
  s.opt.causal = true;
  s.opt.block_sizes = BlockSizes{8, 4};
  s.dtype = DType::kBF16;
  const at::CaseData d = at::make_case(s);
  const CpuRun r = run_cpu(s, d);
  for (const Tensor* t : {&r.o, &r.dq, &r.dk, &r.dv})
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_TRUE(std::isfinite(load_as_f32(t->data(), t->dtype(), i)));
  for (int64_t h = 0; h < s.Hq; ++h) {
    EXPECT_EQ(r.lse.data_as<float>()[h * s.Sq + 30], -INFINITY);
    EXPECT_TRUE(std::isfinite(r.lse.data_as<float>()[h * s.Sq + 31]));
    EXPECT_EQ(load_as_f32(r.o.data(), r.o.dtype(), (0 * s.Hq + h) * s.Dv), 0.0f);
  }
}

// Extra memory: per-thread tiles, never Sq × Sk. At Sq = Sk = 2048, D = 64, 2 threads, default
// blocks (q=128, kv=256) the scratch is a few MiB; Sq × Sk f32 would be 16 MiB per head.
TEST(AttentionCpu, ExtraMemoryIsPerThreadTiles) {
  at::CaseSpec s;
  s.B = 1;
  s.Sq = s.Sk = 2048;
  s.Hq = 2;
  s.Hkv = 1;
  s.D = s.Dv = 64;
  s.opt.causal = true;
  s.opt.num_threads = 2;
  const at::CaseData d = at::make_case(s);
  memory::reset_peak(memory::Space::kHost);
  const size_t before = memory::current_bytes(memory::Space::kHost);
  const CpuRun r = run_cpu(s, d);
  const size_t extra = memory::peak_bytes(memory::Space::kHost) - before;
  // Backward, per thread: S, dP (and P with a soft cap) q×kv tiles, dK and dV kv×D
  // accumulators, packed Kᵀ, Vᵀ, K (kv×D each) and Q, dO (q×D each), Δ (Sq·G floats), the
  // prepacked Q and dO of the group (Sq·G·(D + Dv) floats); with 2 threads > 1 (sequence, kv
  // head) pair, 2 chunked dq partials of Sq·G·D floats.
  const size_t f = sizeof(float), q = 128, kv = 256, D = 64, G = 2, S = 2048;
  const size_t per_thread =
      3 * q * kv * f + 2 * kv * D * f + 3 * kv * D * f + 2 * q * D * f + S * G * f + S * G * 2 * D * f;
  const size_t bound = 2 * per_thread + 2 * S * G * D * f + (64 << 10);
  EXPECT_LE(extra, bound) << "extra host memory " << extra << " bytes";
  EXPECT_LT(extra, S * S * f);  // one head's Sq × Sk f32 scores
}

// A non-finite key that a row sees (+Inf and −Inf across its dims: a NaN or infinite score)
// makes that row NaN, o and lse, as in the reference: the forward's `l > 0` test wrote o = 0,
// lse = −inf — "saw nothing" — for a NaN softmax sum, so a NaN in k looked like an empty row.
// Causal, Sq = Sk: the last key is seen by the last query alone; f32 and bf16, 1 and 2 threads.
TEST(AttentionCpu, NonFiniteKeyARowSeesMakesThatRowNaN) {
  for (const DType dt : {DType::kF32, DType::kBF16})
    for (const int threads : {1, 2}) {
      at::CaseSpec c;
      c.B = 1, c.Sq = c.Sk = 9, c.dtype = dt, c.o_f32 = true;
      c.opt.causal = true, c.opt.num_threads = threads;
      at::CaseData d = at::make_case(c);
      for (int64_t g = 0; g < c.Hkv; ++g)
        for (int64_t e = 0; e < c.D; e += 3)
          store_from_f32(d.k.data(), dt, ((c.Sk - 1) * c.Hkv + g) * c.D + e, e % 2 ? -INFINITY : INFINITY);
      std::vector<float> o[2], lse[2];
      for (int i = 0; i < 2; ++i) {
        Tensor ot = Tensor::empty(DType::kF32, at::o_shape(c)), lt = Tensor::empty(DType::kF32, at::lse_shape(c));
        Options opt = c.opt;
        opt.implementation = i ? "cpu" : "reference";
        forward(d.inputs(), {ot.view(), lt.view()}, opt);
        o[i].assign(ot.data_as<float>(), ot.data_as<float>() + ot.numel());
        lse[i].assign(lt.data_as<float>(), lt.data_as<float>() + lt.numel());
      }
      int64_t nan_rows = 0;
      for (size_t i = 0; i < lse[0].size(); ++i) {
        ASSERT_EQ(std::isnan(lse[1][i]), std::isnan(lse[0][i])) << dtype_name(dt) << " lse " << i << ": cpu " << lse[1][i] << ", reference " << lse[0][i];
        nan_rows += std::isnan(lse[0][i]);
        if (!std::isnan(lse[0][i])) EXPECT_NEAR(lse[1][i], lse[0][i], 1e-4) << i;
      }
      for (size_t i = 0; i < o[0].size(); ++i)
        ASSERT_EQ(std::isfinite(o[1][i]), std::isfinite(o[0][i])) << dtype_name(dt) << " o " << i << ": cpu " << o[1][i] << ", reference " << o[0][i];
      EXPECT_GT(nan_rows, 0) << "the last query sees the key";
      EXPECT_LE(nan_rows, c.Hq) << "it alone";
    }
}

}  // namespace
}  // namespace tessera::attention
