// grouped_matmul cpu backend: parity with the reference over the check grid and over block sizes
// that cut groups, K and N into tails; bitwise determinism across thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "scoped_env.h"
#include "kernels/grouped_matmul/testing.h"
#include "primitives/cpu_bf16_gemm.h"
#include "primitives/cpu_f32_gemm.h"
#include "tessera/grouped_matmul.h"

namespace tessera::grouped_matmul {
namespace {

using tessera::testing::ScopedEnv;  // tests/scoped_env.h

// Every pass by default. The route tests below check the fused pass alone: it runs the forward's
// gmm and the backward's products in the same backend calls as the two passes apart (api.cc
// forward_backward), so each route's products are checked once instead of twice (these were the
// suite's longest tests under ASan: 46 to 74 s).
void expect_parity(const testing::CaseSpec& s,
                   std::initializer_list<Pass> passes = {Pass::kForward, Pass::kBackward, Pass::kFused}) {
  for (Pass pass : passes) {
    const harness::ParityReport r = testing::check_parity(s, "cpu", pass);
    ASSERT_TRUE(r.ran) << s.name() << ": " << r.error;
    for (const auto& f : r.fields) EXPECT_TRUE(f.dev.ok()) << s.name() << " " << pass_name(pass) << " " << f.field << ": " << f.dev.str();
  }
}

TEST(GroupedMatmulCpu, CheckGrid) {
  for (const testing::CaseSpec& s : testing::check_grid(false)) expect_parity(s);
}

// K = 0: every product is an empty sum, the output zero (the chunked routes run no chunk at all,
// so the backend must write the zeros itself; outputs are NaN-filled before the call). N = 0: the
// backward's dlhs is a gmm with an empty sum too. Every dtype, both rhs layouts.
TEST(GroupedMatmulCpu, EmptySumsAreZero) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (bool t : {false, true})
      for (auto [K, N] : {std::pair<int64_t, int64_t>{0, 70}, {40, 0}}) {
        testing::CaseSpec s;
        s.label = "empty_sums";
        s.dtype = dt, s.transpose_rhs = t;
        s.M = 30, s.K = K, s.N = N, s.sizes = {10, 0, 15};
        expect_parity(s);
      }
}

// M = 0: an expert-parallel rank that received no token. The f32 micro-kernel route divided by M
// when splitting a group's rows (SIGFPE, the process gone: a reviewer's finding from Python);
// every dtype, both layouts, the micro-kernel and OpenBLAS routes; out and dlhs are empty, drhs
// is zero (NaN-filled before the call).
TEST(GroupedMatmulCpu, NoRowsAtAll) {
  for (const char* route : {"1", "0"}) {
    const ScopedEnv r("TESSERA_CPU_F32_GEMM", route);
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (bool t : {false, true}) {
        testing::CaseSpec s;
        s.label = std::string("no_rows_f32gemm=") + route;
        s.dtype = dt, s.transpose_rhs = t;
        s.M = 0, s.K = 40, s.N = 70, s.sizes = {0, 0};
        expect_parity(s);
      }
  }
}

// N = 11 is under one 64-column panel of the f32 micro-kernel route (AVX-512), which takes n in
// whole panels and ignores m: N = 139 gives it three panels, the last one of 11 columns.
TEST(GroupedMatmulCpu, BlockSizesThatLeaveTailsEverywhere) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (BlockSizes bs : {BlockSizes{1, 1}, BlockSizes{7, 5}, BlockSizes{64, 3}, BlockSizes{3, 64}, BlockSizes{8, 70}}) {
      for (bool t : {false, true}) {
        testing::CaseSpec s;
        s.label = "tails";
        s.dtype = dt;
        s.M = 41, s.K = 13, s.N = dt == DType::kF32 ? 139 : 11, s.sizes = {9, 0, 14, 1, 12};
        s.transpose_rhs = t;
        s.opt.block_sizes = bs;
        expect_parity(s);
      }
    }
  }
}

// K past the f32 micro-kernel tgmm's output span (4096 rows of drhs a pass: kMaxSpan) and past
// its K chunks, both layouts, with a group offset (an expert-parallel shard) on the second run.
TEST(GroupedMatmulCpu, DeepKAndAGroupOffset) {
  for (bool t : {false, true})
    for (int64_t offset : {0, 1}) {
      testing::CaseSpec s;
      s.label = "deep_k";
      s.transpose_rhs = t;
      s.M = 24, s.K = 4100, s.N = 7, s.sizes = {5, 0, 11, 8};
      if (offset) s.offset = offset, s.local_groups = 2;
      expect_parity(s);
    }
}

// A group longer than the tgmm row block of bf16 inputs (1024 rows, accumulated in steps).
TEST(GroupedMatmulCpu, LongGroupsAccumulateOverRowBlocks) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (bool t : {false, true}) {
      testing::CaseSpec s;
      s.label = "long";
      s.dtype = dt;
      s.f32_outputs = true;
      s.transpose_rhs = t;
      s.M = 2600, s.K = 8, s.N = 6, s.sizes = {2500, 0, 50};
      expect_parity(s);
    }
  }
}

// bf16 runs on the AVX512-BF16 dot product where the CPU has it (elsewhere the test runs that
// route through the portable loops: TESSERA_CPU_BF16_DOT=portable); TESSERA_CPU_BF16_DOT=0 keeps the
// f32 route (converted operands, sgemm). Both against the reference, then against each other
// with f32 outputs, in both rhs layouts: the same exact products, f32 sums in another order, so
// they agree to a few f32 ulps of the sums and yet differ somewhere where the dot route ran.
std::vector<float> gmm_and_tgmm(const testing::CaseSpec& s) {
  const testing::CaseData d = testing::make_case(s);
  Tensor out = Tensor::empty(DType::kF32, {s.M, s.N});
  Tensor drhs = Tensor::empty(DType::kF32, d.rhs.shape());
  Options o = testing::options_of(s);
  o.implementation = "cpu";
  gmm(d.inputs(), out.view(), o);
  tgmm(d.lhs.view(), d.dout.view(), d.group_sizes.view(), drhs.view(), o);
  std::vector<float> v(out.data_as<float>(), out.data_as<float>() + out.numel());
  v.insert(v.end(), drhs.data_as<float>(), drhs.data_as<float>() + drhs.numel());
  return v;
}

TEST(GroupedMatmulCpu, Bf16DotAndF32RoutesAgree) {
  const ScopedEnv outer("TESSERA_CPU_BF16_DOT", nullptr);
  const bool native = cpu_bf16_gemm::native();  // else the dot route runs the portable loops
  testing::CaseSpec base;
  base.label = "routes";
  base.dtype = DType::kBF16;
  base.f32_outputs = true;
  base.M = 1300, base.K = 37, base.N = 45, base.sizes = {1100, 0, 13, 187};
  base.opt.block_sizes = BlockSizes{256, 32};
  // Groups of <= 128 rows run K in chunks of 256 and the columns in blocks of 256 (601 = 256 +
  // 256 + 89, odd: the last pair half empty; 300 = 256 + 44), the 129- and 250-row groups whole; f32 and bf16 outputs.
  testing::CaseSpec deep = base;
  deep.M = 530, deep.K = 601, deep.N = 300, deep.sizes = {5, 0, 128, 129, 1, 250};
  deep.opt.block_sizes.reset();
  testing::CaseSpec deep_bf16_out = deep;
  deep_bf16_out.f32_outputs = false;
  for (auto [s, t] : {std::pair{base, false}, {base, true}, {deep, false}, {deep, true}, {deep_bf16_out, false}}) {
    s.transpose_rhs = t;
    SCOPED_TRACE("K=" + std::to_string(s.K) + (t ? " transposed" : "") + (s.f32_outputs ? "" : " bf16 outputs"));
    std::vector<float> got[2];
    for (int dot : {1, 0}) {
      const ScopedEnv route("TESSERA_CPU_BF16_DOT", !dot ? "0" : native ? "1" : "portable");
      expect_parity(s, {Pass::kFused});
      got[dot] = gmm_and_tgmm(s);
    }
    double worst = 0;
    for (size_t i = 0; i < got[0].size(); ++i) {
      // |terms| <= 1: sums of up to 1100 of them, f32 order differences well under 1e-3; bf16
      // outputs may round the two sums to neighbouring bf16 values (2^-8 relative apart).
      ASSERT_NEAR(got[1][i], got[0][i], 1e-3 + (s.f32_outputs ? 0.0 : std::abs(got[0][i]) * 0x1p-7)) << i;
      worst = std::max(worst, double(std::abs(got[1][i] - got[0][i])));
    }
    EXPECT_GT(worst, 0.0) << "the dot route did not run" << (t ? " (transposed)" : "");
  }
}


// f32 runs on the packed AVX-512 micro-kernel (cpu_f32_gemm) where the CPU has AVX-512F;
// TESSERA_CPU_F32_GEMM=0 keeps OpenBLAS. Both routes against the reference (every pass, the
// grid's tolerance: f32 sums of ≤ 2,500 terms in [-1, 1], see testing.cc) on shapes that leave
// tails everywhere: odd K and N (past the 64-column panel and its 16-lane vectors), groups of
// 0, 1 and 5 rows (under the 6-row register block), a group longer than the 1,024-row tgmm
// block (accumulated over row blocks), block sizes that cut N below a panel (n = 5) and past
// one (n = 65), and a single group on 3 threads (rows cut into parts for the threads).
std::vector<testing::CaseSpec> f32_route_cases() {
  std::vector<testing::CaseSpec> out;
  for (bool t : {false, true}) {
    testing::CaseSpec s;
    s.label = "f32routes";
    s.transpose_rhs = t;
    s.M = 209, s.K = 67, s.N = 131, s.sizes = {70, 0, 1, 5, 13, 0, 113};  // Σ = 202: 7 rows past the sum
    for (std::optional<BlockSizes> bs : {std::optional<BlockSizes>{}, {BlockSizes{7, 5}}, {BlockSizes{64, 65}}}) {
      s.opt.block_sizes = bs;
      out.push_back(s);
    }
    testing::CaseSpec one = s;
    one.opt.block_sizes.reset();
    one.opt.num_threads = 3;
    one.sizes = {190};
    out.push_back(one);
    testing::CaseSpec long_group = s;
    long_group.opt.block_sizes.reset();
    long_group.M = 2600, long_group.K = 9, long_group.N = 70, long_group.sizes = {2500, 0, 99};
    out.push_back(long_group);
    // Groups of <= 128 rows run K in chunks of 256 (601 = 256 + 256 + 89), the output summing
    // them; the 129-row group and the 250-row one (cut into row parts on 3 threads) take K whole.
    testing::CaseSpec deep = s;
    deep.opt.block_sizes.reset();
    deep.M = 520, deep.K = 601, deep.N = 131, deep.sizes = {5, 0, 128, 129, 1, 250};  // Σ = 513
    out.push_back(deep);
    deep.opt.num_threads = 3;
    out.push_back(deep);
  }
  return out;
}

TEST(GroupedMatmulCpu, F32KernelAndBlasRoutes) {
  bool kernel_runs = false;
  {
    const ScopedEnv on("TESSERA_CPU_F32_GEMM", "1");
    kernel_runs = cpu_f32_gemm::available();
  }
  double worst_all = 0;
  for (const testing::CaseSpec& s : f32_route_cases()) {
    std::vector<float> got[2];
    for (int kernel : {1, 0}) {
      const ScopedEnv route("TESSERA_CPU_F32_GEMM", kernel ? "1" : "0");
      SCOPED_TRACE(std::string(kernel ? "kernel " : "blas ") + s.name());
      expect_parity(s, {Pass::kFused});
      got[kernel] = gmm_and_tgmm(s);
    }
    double worst = 0;
    for (size_t i = 0; i < got[0].size(); ++i) {
      // |terms| ≤ 1, sums of ≤ 2,500 of them in another order: f32 differences well under 1e-3.
      ASSERT_NEAR(got[1][i], got[0][i], 1e-3) << s.name() << " " << i;
      worst = std::max(worst, double(std::abs(got[1][i] - got[0][i])));
    }
    worst_all = std::max(worst_all, worst);
  }
  // The micro-kernel sums in k order with one rounding per FMA; OpenBLAS's Zen kernel often does
  // too (some cases agree bit for bit), but not everywhere: some element differs where the
  // kernel route ran.
  if (kernel_runs) EXPECT_GT(worst_all, 0.0) << "the kernel route did not run";
}

// f16 (and bf16 without the dot product) converted into the f32 micro-kernel's panels where it
// runs, or into buffers for OpenBLAS (TESSERA_CPU_F32_GEMM=0): the f32 route's shapes in f16, with
// f16 outputs on every other case; both routes against the reference and each other.
TEST(GroupedMatmulCpu, HalfInputsOnPanelsAndBlasRoutes) {
  bool kernel_runs = false;
  {
    const ScopedEnv on("TESSERA_CPU_F32_GEMM", "1");
    kernel_runs = cpu_f32_gemm::available();
  }
  double worst_all = 0;
  bool f32_out = false;
  for (testing::CaseSpec s : f32_route_cases()) {
    s.dtype = DType::kF16;
    s.f32_outputs = f32_out = !f32_out;
    std::vector<float> got[2];
    for (int kernel : {1, 0}) {
      const ScopedEnv route("TESSERA_CPU_F32_GEMM", kernel ? "1" : "0");
      SCOPED_TRACE(std::string(kernel ? "panels " : "blas ") + s.name() + (s.f32_outputs ? " f32 out" : " f16 out"));
      expect_parity(s, {Pass::kFused});
      got[kernel] = gmm_and_tgmm(s);
    }
    for (size_t i = 0; i < got[0].size(); ++i) {
      // f32 sums in another order (well under 1e-3), then maybe rounded to neighbouring f16 values.
      ASSERT_NEAR(got[1][i], got[0][i], 1e-3 + (s.f32_outputs ? 0.0 : std::abs(got[0][i]) * 0x1p-10)) << s.name() << " " << i;
      worst_all = std::max(worst_all, double(std::abs(got[1][i] - got[0][i])));
    }
  }
  if (kernel_runs) EXPECT_GT(worst_all, 0.0) << "the panels route did not run";
}

TEST(GroupedMatmulCpu, BitwiseTheSameForAnyThreadCount) {
  // f32: on the micro-kernel, rows cut into parts by thread count; with K = 600 the groups of
  // <= 128 rows run K in chunks (decided per group, not per part: the 250 rows split by threads too).
  for (auto [dt, K] : {std::pair{DType::kBF16, int64_t{40}}, {DType::kF32, int64_t{40}}, {DType::kF32, int64_t{600}}}) {
    testing::CaseSpec s;
    s.M = 600, s.K = K, s.N = 70, s.sizes = {120, 0, 3, 90, 60, 250};
    s.dtype = dt;
    s.opt.block_sizes = BlockSizes{32, 16};
    const testing::CaseData d = testing::make_case(s);
    Options o = testing::options_of(s);
    o.implementation = "cpu";
    Result base;
    for (int threads : {1, 2, 3, 8}) {
      o.num_threads = threads;
      const Result r = compute_with_grad(d.inputs(), d.dout.view(), o);
      ASSERT_EQ(r.implementation, "cpu");
      if (threads == 1) {
        base = r;
        continue;
      }
      for (auto [a, b] : {std::pair{&r.out, &base.out}, {&r.dlhs, &base.dlhs}, {&r.drhs, &base.drhs}})
        EXPECT_EQ(std::memcmp(a->data(), b->data(), a->view().nbytes()), 0)
            << dtype_name(dt) << " K=" << K << " " << threads << " threads";
    }
  }
}

TEST(GroupedMatmulCpu, IsTheDefaultOnTheHost) {
  testing::CaseSpec s;
  const testing::CaseData d = testing::make_case(s);
  const Result r = compute(d.inputs(), testing::options_of(s));
  EXPECT_EQ(r.implementation, "cpu");
}

}  // namespace
}  // namespace tessera::grouped_matmul
