// mlstm cpu: the chunkwise form against the reference over the full check grid (the parity suite
// runs the quick one), thread counts, and determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/memory.h"
#include "harness/process.h"
#include "kernels/mlstm/testing.h"
#include "primitives/cpu_f32_gemm.h"
#include "tessera/mlstm.h"

namespace tessera {
namespace {

using mlstm::testing::CaseSpec;

void expect_parity(const CaseSpec& c, Pass pass) {
  const harness::ParityReport r = mlstm::testing::check_parity(c, "cpu", pass);
  ASSERT_TRUE(r.ran) << c.name() << ": " << r.error;
  for (const auto& f : r.fields) EXPECT_TRUE(f.dev.ok()) << c.name() << " " << pass_name(pass) << " " << f.field << ": " << f.dev.str();
}

TEST(MlstmCpu, FullGridForwardAndBackward) {
  for (const CaseSpec& c : mlstm::testing::check_grid(false)) {
    expect_parity(c, Pass::kForward);
    expect_parity(c, Pass::kBackward);
    expect_parity(c, Pass::kFused);  // forward_backward: the chunk states formed once (v0.4)
  }
}

// Chunk sizes that divide S and that do not, down to 1 (every step its own chunk) and past S.
TEST(MlstmCpu, ChunkSizes) {
  for (int64_t chunk : {1, 2, 3, 5, 8, 16, 40}) {
    CaseSpec c;
    c.S = 16, c.B = 2, c.DK = 6, c.DV = 10, c.resets = "random", c.initial_state = true;
    c.opt.chunk_size = chunk;
    c.seed = 40 + chunk;
    expect_parity(c, Pass::kFused);
  }
}

TEST(MlstmCpu, ThreadCounts) {
  for (int threads : {1, 2, 3, 7}) {
    CaseSpec c;
    c.B = 3, c.NH = 3, c.S = 19, c.resets = "inside";
    c.opt.chunk_size = 4, c.opt.num_threads = threads;
    expect_parity(c, Pass::kFused);
  }
}

// v0.4's two routes for the chunk products (cpu.cc use_kernel_gemm): TESSERA_MLSTM_CPU_GEMM=blas
// for a scope (else unset), the caller's value restored.
class GemmRoute {
 public:
  explicit GemmRoute(bool blas) {
    if (const char* v = std::getenv(kVar)) old_ = v;
    if (blas) ::setenv(kVar, "blas", 1);
    else ::unsetenv(kVar);
  }
  ~GemmRoute() {
    if (old_) ::setenv(kVar, old_->c_str(), 1);
    else ::unsetenv(kVar);
  }
  // The micro-kernel route runs: not blas, and a kernel on this CPU (AVX2 or AVX-512, not
  // turned off by TESSERA_CPU_F32_GEMM=0).
  static bool kernel_runs(bool blas) { return !blas && cpu_f32_gemm::isa() != cpu_f32_gemm::Isa::kPortable; }

 private:
  static constexpr const char* kVar = "TESSERA_MLSTM_CPU_GEMM";
  std::optional<std::string> old_;
};

// Threads sharing a head (chunks round-robin, the state chain handed between them): one head of
// 18 chunks (teams of 2, 3, 7 threads), and three heads of 9 chunks (one team of 2 taking the
// heads in turn; one thread per head; three teams of 2). Every hand-over runs, and the results
// are the same bits for every thread count: each chunk is computed the same way whichever
// thread takes it, and the chain runs in one order. On the micro-kernel route (AVX2 or AVX-512)
// only: on OpenBLAS (TESSERA_MLSTM_CPU_GEMM=blas; found on an AVX2 Zen 3, 2026-11-26) the
// forward's split of a head's value columns rounds a column block as sgemm's edge kernels do,
// so there the results agree to 1e-5. Both routes run.
// On the kernel route also with TESSERA_CPU_F32_GEMM=avx2: on an AVX-512 CPU the AVX2 kernel and
// mlstm's AVX2 element loops then run, and must give the AVX-512 bits (the same FMA chains).
TEST(MlstmCpu, ThreadsShareAHead) {
  const char* outer = std::getenv("TESSERA_CPU_F32_GEMM");
  const std::optional<std::string> saved = outer ? std::optional<std::string>(outer) : std::nullopt;
  for (bool blas : {false, true})
  for (const auto& [NH, chunk] : {std::pair<int64_t, int64_t>{1, 4}, {3, 8}}) {
    const GemmRoute route(blas);
    std::vector<float> first;
    for (const char* isa : {"", "avx2"}) {
    if (*isa && blas) continue;
    if (*isa) ::setenv("TESSERA_CPU_F32_GEMM", isa, 1);
    else if (saved) ::setenv("TESSERA_CPU_F32_GEMM", saved->c_str(), 1);
    else ::unsetenv("TESSERA_CPU_F32_GEMM");
    for (int threads : {1, 2, 3, 7}) {
      CaseSpec c;
      c.B = 1, c.NH = NH, c.S = 70, c.DK = 6, c.DV = 10, c.resets = "random", c.initial_state = true;
      c.opt.chunk_size = chunk, c.opt.num_threads = threads;
      c.seed = 77;
      expect_parity(c, Pass::kFused);
      const mlstm::testing::CaseData d = mlstm::testing::make_case(c);
      auto out = [](const Tensor& like) { return Tensor::empty(DType::kF32, like.shape()); };
      Tensor h = out(d.v), dq = out(d.q), dk = out(d.k), dv = out(d.v), di = out(d.i), df = out(d.f), dc0 = out(d.c0),
             dn0 = out(d.n0);
      mlstm::Options opt = c.opt;
      opt.implementation = "cpu";
      mlstm::forward(d.inputs(), h.view(), {}, opt);
      mlstm::backward(d.inputs(), d.dh.view(),
                      {dq.view(), dk.view(), dv.view(), di.view(), df.view(), dc0.view(), dn0.view()}, opt,
                      d.dc_last.view(), d.dn_last.view());
      std::vector<float> all;
      for (const Tensor* t : {&h, &dq, &dk, &dv, &di, &df, &dc0, &dn0})
        all.insert(all.end(), t->data_as<float>(), t->data_as<float>() + t->numel());
      if (first.empty()) first = all;
      if (GemmRoute::kernel_runs(blas)) {
        EXPECT_EQ(all, first) << "NH " << NH << ", " << threads << " threads, isa '" << isa << "'";
      } else {  // OpenBLAS: a column block of a product need not round as the whole does
        ASSERT_EQ(all.size(), first.size());
        for (size_t i = 0; i < all.size(); ++i)
          ASSERT_NEAR(all[i], first[i], 1e-5 * (1.0 + std::fabs(first[i])))
              << (blas ? "blas" : "kernel") << " NH " << NH << ", " << threads << " threads, value " << i;
      }
    }
    }
    if (saved) ::setenv("TESSERA_CPU_F32_GEMM", saved->c_str(), 1);
    else ::unsetenv("TESSERA_CPU_F32_GEMM");
  }
}

// Without the last states (no c_last out, no dc_last / dn_last in: what most calls and the bench
// do) the cpu backend skips the last chunk's state product and the zero state's products; the
// causal L×L products run in row blocks of 8 (cpu.cc kTriBlock). Chunks and tails that blocks of
// 8 do not divide (a tail of 9 = 8 + 1 after chunks of 40; 7 steps in one chunk; chunk 20: 8 + 8
// + 4, tail 10), one chunk (S < chunk), 16 blocks (chunk 128, tail 72), resets at, inside and
// across chunk boundaries, with and without an initial state, every dtype: forward and backward
// against the reference, with and without the last states.
TEST(MlstmCpu, WithoutLastStatesAndCausalBlocks) {
  struct Shape {
    int64_t S, chunk;
    const char* resets;
  };
  const Shape shapes[] = {{129, 40, "chunk"}, {200, 128, "inside"}, {7, 0, "none"}, {64, 64, "pair"},
                          {33, 16, "every"},  {50, 20, "random"}};
  uint64_t seed = 500;
  for (const Shape& sh : shapes)
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (bool init : {false, true})
        for (bool last : {false, true}) {
          CaseSpec c;
          c.B = 2, c.NH = 1, c.S = sh.S, c.DK = 12, c.DV = 20, c.dtype = dt, c.resets = sh.resets;
          c.initial_state = init, c.last_states = last;
          c.opt.chunk_size = sh.chunk;
          c.seed = ++seed;
          expect_parity(c, Pass::kFused);
        }
}

// The same without the last states on threads that share a head (the backward's sweep skips the
// last chunk's state but still orders the chain): parity, and the same bits for every thread count.
TEST(MlstmCpu, WithoutLastStatesThreadsShareAHead) {
  std::vector<float> first;
  for (int threads : {1, 2, 3, 7}) {
    CaseSpec c;
    c.B = 1, c.NH = 1, c.S = 70, c.DK = 6, c.DV = 10, c.resets = "random", c.last_states = false;
    c.opt.chunk_size = 4, c.opt.num_threads = threads;
    c.seed = 78;
    expect_parity(c, Pass::kFused);
    const mlstm::testing::CaseData d = mlstm::testing::make_case(c);
    auto out = [](const Tensor& like) { return Tensor::empty(DType::kF32, like.shape()); };
    Tensor h = out(d.v), dq = out(d.q), dk = out(d.k), dv = out(d.v), di = out(d.i), df = out(d.f);
    mlstm::Options opt = c.opt;
    opt.implementation = "cpu";
    mlstm::forward(d.inputs(), h.view(), {}, opt);
    mlstm::backward(d.inputs(), d.dh.view(), {dq.view(), dk.view(), dv.view(), di.view(), df.view(), {}, {}}, opt);
    std::vector<float> all;
    for (const Tensor* t : {&h, &dq, &dk, &dv, &di, &df})
      all.insert(all.end(), t->data_as<float>(), t->data_as<float>() + t->numel());
    if (first.empty()) first = all;
    EXPECT_EQ(all, first) << threads << " threads";
  }
}

// v0.4's one-call pass (forward_backward): the backward's sweep forms each C_j and the chunk's h
// comes from it at once. On teams sharing a head (2, 3, 7 threads on one head of 18 chunks) the
// member that computes chunk j's h reads C_j while the others move on, and the reverse writes dC_j
// over C_j (a team barrier orders them): parity, and the same bits for every thread count (with and
// without the last states in and out).
TEST(MlstmCpu, FusedPassOnTeamsSharingAHead) {
  for (bool last : {true, false}) {
    std::vector<float> first;
    for (int threads : {1, 2, 3, 7}) {
      CaseSpec c;
      c.B = 1, c.NH = 1, c.S = 70, c.DK = 6, c.DV = 10, c.resets = "random", c.initial_state = true, c.last_states = last;
      c.opt.chunk_size = 4, c.opt.num_threads = threads;
      c.seed = 79;
      expect_parity(c, Pass::kFused);
      const mlstm::testing::CaseData d = mlstm::testing::make_case(c);
      auto out = [](const Tensor& like) { return Tensor::empty(DType::kF32, like.shape()); };
      Tensor h = out(d.v), dq = out(d.q), dk = out(d.k), dv = out(d.v), di = out(d.i), df = out(d.f), dc0 = out(d.c0),
             dn0 = out(d.n0), cl = out(d.c0), nl = out(d.n0), ml = out(d.m0);
      mlstm::Options opt = c.opt;
      opt.implementation = "cpu";
      const mlstm::LastStates ls = last ? mlstm::LastStates{cl.view(), nl.view(), ml.view()} : mlstm::LastStates{};
      mlstm::forward_backward(d.inputs(), h.view(), ls, d.dh.view(),
                              {dq.view(), dk.view(), dv.view(), di.view(), df.view(), dc0.view(), dn0.view()}, opt,
                              last ? d.dc_last.view() : TensorView{}, last ? d.dn_last.view() : TensorView{});
      std::vector<float> all;
      for (const Tensor* t : {&h, &dq, &dk, &dv, &di, &df, &dc0, &dn0, &cl, &nl, &ml})
        if (last || (t != &cl && t != &nl && t != &ml)) all.insert(all.end(), t->data_as<float>(), t->data_as<float>() + t->numel());
      if (first.empty()) first = all;
      EXPECT_EQ(all, first) << threads << " threads, last states " << last;
    }
  }
}

// The two calls' route inside forward_backward (TESSERA_MLSTM_CPU_FUSED=0, v0.3's, kept for timing)
// against the reference.
TEST(MlstmCpu, FusedPassAsTwoCalls) {
  ::setenv("TESSERA_MLSTM_CPU_FUSED", "0", 1);
  for (bool init : {false, true}) {
    CaseSpec c;
    c.B = 2, c.NH = 2, c.S = 70, c.DK = 12, c.DV = 20, c.resets = "inside", c.initial_state = init;
    c.opt.chunk_size = 16;
    expect_parity(c, Pass::kFused);
  }
  ::unsetenv("TESSERA_MLSTM_CPU_FUSED");
}

// The fused pass keeps each chunk's forward quantities for the reverse (cpu.cc HeadBufs::saved,
// S·(2L + 5) floats a team) only while they fit kSavedBudget (256 MiB); past it the reverse forms
// them again. At S = 36,864 and chunks of 1,024 they are 303 MiB: the call's peak RSS grew by
// that much before (the budget was not counted); it grows by the thread buffers (12 MiB a
// thread) and the states now, and gives the bits of the forward and backward calls.
TEST(MlstmCpu, FusedPassSavedDataStaysWithinItsBudget) {
  CaseSpec c;
  c.B = 1, c.NH = 1, c.S = 36864, c.DK = 8, c.DV = 8;
  c.opt.chunk_size = 1024, c.opt.num_threads = 2;
  c.opt.implementation = "cpu";
  const mlstm::testing::CaseData d = mlstm::testing::make_case(c);
  auto run = [&] {
    auto out = [](const Tensor& like) { return Tensor::zeros(DType::kF32, like.shape()); };
    std::vector<Tensor> t{out(d.v), out(d.q), out(d.k), out(d.v), out(d.i), out(d.f)};
    mlstm::forward_backward(d.inputs(), t[0].view(), {}, d.dh.view(), {t[1].view(), t[2].view(), t[3].view(), t[4].view(), t[5].view()}, c.opt);
    return t;
  };
  std::vector<Tensor> got;
  {
    std::vector<Tensor> warm = run();  // the outputs' pages and the tensors' allocator warmed
  }
  if (!harness::reset_peak_rss()) GTEST_SKIP() << "the peak RSS cannot be reset here";
  const size_t before = harness::rss_bytes().value_or(0);
  ::setenv("TESSERA_MLSTM_CPU_KEEP_SCRATCH", "0", 1);  // a fresh block: the call's own size
  got = run();
  const size_t peak = harness::peak_rss_bytes().value_or(0);
  ::setenv("TESSERA_MLSTM_CPU_FUSED", "0", 1);
  const std::vector<Tensor> want = run();
  ::unsetenv("TESSERA_MLSTM_CPU_FUSED");
  ::unsetenv("TESSERA_MLSTM_CPU_KEEP_SCRATCH");
  ASSERT_GT(peak, before);
  EXPECT_LT(peak - before, size_t(128) << 20) << "peak RSS grew by " << ((peak - before) >> 20) << " MiB";
  const char* names[] = {"h", "dq", "dk", "dv", "di", "df"};
  for (size_t n = 0; n < got.size(); ++n) {
    const float *g = got[n].data_as<float>(), *w = want[n].data_as<float>();
    bool nonzero = false;
    for (int64_t e = 0; e < got[n].numel(); ++e) nonzero |= w[e] != 0.f;
    EXPECT_TRUE(nonzero) << names[n];
    EXPECT_TRUE(std::equal(g, g + got[n].numel(), w)) << names[n] << " differs from the two calls'";
  }
}

// v0.5: a call's scratch is one block, kept for the next call of the same size (cpu.cc
// ScratchLease). The next call finds the last call's values in it: the same inputs give the same
// bits on a reused block (twice), after a call of another shape in between, and with
// TESSERA_MLSTM_CPU_KEEP_SCRATCH=0 (a fresh block per call); the kept block is not counted by the
// memory counters once the call returns (the bench's extra memory stays the call's own).
TEST(MlstmCpu, ScratchKeptBetweenCalls) {
  auto run = [](const CaseSpec& c) {
    const mlstm::testing::CaseData d = mlstm::testing::make_case(c);
    auto out = [](const Tensor& like) { return Tensor::empty(DType::kF32, like.shape()); };
    Tensor h = out(d.v), dq = out(d.q), dk = out(d.k), dv = out(d.v), di = out(d.i), df = out(d.f);
    mlstm::Options opt = c.opt;
    opt.implementation = "cpu";
    const size_t before = memory::current_bytes(memory::Space::kHost);
    mlstm::forward_backward(d.inputs(), h.view(), {}, d.dh.view(), {dq.view(), dk.view(), dv.view(), di.view(), df.view()}, opt);
    EXPECT_EQ(memory::current_bytes(memory::Space::kHost), before) << "scratch still counted after the call";
    std::vector<float> all;
    for (const Tensor* t : {&h, &dq, &dk, &dv, &di, &df}) all.insert(all.end(), t->data_as<float>(), t->data_as<float>() + t->numel());
    return all;
  };
  CaseSpec a, b;
  a.B = 1, a.NH = 3, a.S = 90, a.DK = 24, a.DV = 40, a.resets = "inside", a.seed = 5;
  a.opt.chunk_size = 16, a.opt.num_threads = 2;
  b = a, b.seed = 6;  // the same shape (the same block, reused) with other values in it
  const std::vector<float> first = run(a);
  EXPECT_EQ(run(a), first);
  EXPECT_NE(run(b), first);
  EXPECT_EQ(run(a), first);  // on the block b left its values in
  b.S = 33, b.DV = 16;       // another shape in between (a block of its own)
  run(b);
  EXPECT_EQ(run(a), first);
  ::setenv("TESSERA_MLSTM_CPU_KEEP_SCRATCH", "0", 1);
  EXPECT_EQ(run(a), first);
  ::unsetenv("TESSERA_MLSTM_CPU_KEEP_SCRATCH");
}

// v0.4's two routes for the chunk products (cpu.cc use_kernel_gemm): the kernel-owned micro-kernel
// (primitives/cpu_f32_gemm, the default where the CPU has AVX-512 or AVX2) and OpenBLAS for every product
// (TESSERA_MLSTM_CPU_GEMM=blas, v0.3's route). Head dims past the micro-kernel's 64-column panels
// and 6-row blocks with tails (DK = 70, DV = 130), chunks of 64 and 40 with a tail, the forward's
// split of one head's value columns over 2 and 3 threads (parts of 65 and 43 columns), resets,
// initial and last states or none, f32 and bf16: parity against the reference on both routes, and
// on the kernel route the same bits for 1 and 2 threads.

TEST(MlstmCpu, KernelGemmAndBlasRoutes) {
  uint64_t seed = 900;
  for (bool blas : {false, true}) {
    const GemmRoute route(blas);
    for (const auto& [S, chunk] : {std::pair<int64_t, int64_t>{150, 64}, {101, 40}})
      for (bool init : {false, true}) {
        std::vector<float> first;
        for (int threads : {1, 2, 3}) {
          CaseSpec c;
          c.B = 1, c.NH = 1, c.S = S, c.DK = 70, c.DV = 130, c.resets = init ? "inside" : "random";
          c.dtype = threads == 3 ? DType::kBF16 : DType::kF32;
          c.initial_state = init, c.last_states = init;
          c.opt.chunk_size = chunk, c.opt.num_threads = threads;
          c.seed = ++seed;
          SCOPED_TRACE(std::string(blas ? "blas" : "kernel") + " S " + std::to_string(S) + " threads " + std::to_string(threads));
          expect_parity(c, Pass::kFused);
          // bf16 inputs: other values. The bits on the blas route: OpenBLAS rounds a part of the
          // columns (65 of 130) differently from all of them, so only the kernel route keeps them.
          // Without the micro-kernel (no AVX2 or AVX-512F, or TESSERA_CPU_F32_GEMM=0 in the
          // environment) the "kernel" route is the blas route: parity above, no bits.
          if (threads == 3 || !GemmRoute::kernel_runs(blas)) continue;
          c.seed = 7;  // the same inputs on 1 and 2 threads
          const mlstm::testing::CaseData d = mlstm::testing::make_case(c);
          auto out = [](const Tensor& like) { return Tensor::empty(DType::kF32, like.shape()); };
          Tensor h = out(d.v), dq = out(d.q), dk = out(d.k), dv = out(d.v), di = out(d.i), df = out(d.f);
          Tensor dc0 = init ? out(d.c0) : Tensor::empty(DType::kF32, {1}), dn0 = init ? out(d.n0) : Tensor::empty(DType::kF32, {1});
          mlstm::Options opt = c.opt;
          opt.implementation = "cpu";
          mlstm::forward(d.inputs(), h.view(), {}, opt);
          mlstm::backward(d.inputs(), d.dh.view(),
                          {dq.view(), dk.view(), dv.view(), di.view(), df.view(), init ? dc0.view() : TensorView{},
                           init ? dn0.view() : TensorView{}},
                          opt);
          std::vector<float> all;
          for (const Tensor* t : {&h, &dq, &dk, &dv, &di, &df, &dc0, &dn0})
            if (init || (t != &dc0 && t != &dn0)) all.insert(all.end(), t->data_as<float>(), t->data_as<float>() + t->numel());
          if (first.empty()) first = all;
          EXPECT_EQ(all, first);
        }
      }
  }
}

// eps = 0 with m past ~103 (exp(−m) underflows in f32) and a zero query (q̂ᵀn = 0): h is 0/floor
// = 0 on both implementations, never 0/0 = NaN.
TEST(MlstmCpu, ZeroQueryWithHugeStabilizerStaysFinite) {
  const int64_t S = 3, D = 4;
  Tensor q = Tensor::empty(DType::kF32, {1, 1, S, D}), k = Tensor::empty(DType::kF32, {1, 1, S, D}),
         v = Tensor::empty(DType::kF32, {1, 1, S, D}), ig = Tensor::empty(DType::kF32, {1, 1, S}),
         fg = Tensor::empty(DType::kF32, {1, 1, S});
  for (int64_t j = 0; j < S * D; ++j) {
    q.data_as<float>()[j] = j < D ? 1.0f : 0.0f;  // steps 1 and 2: a zero query
    k.data_as<float>()[j] = 0.5f, v.data_as<float>()[j] = 1.0f;
  }
  for (int64_t t = 0; t < S; ++t) ig.data_as<float>()[t] = t == 0 ? 120.0f : -50.0f, fg.data_as<float>()[t] = 60.0f;
  const mlstm::Inputs in{q.view(), k.view(), v.view(), ig.view(), fg.view()};
  for (const char* impl : {"reference", "cpu"}) {
    mlstm::Options opt;
    opt.eps = 0.0, opt.implementation = impl;
    Tensor h = Tensor::empty(DType::kF32, {1, 1, S, D});
    mlstm::forward(in, h.view(), {}, opt);
    for (int64_t j = 0; j < S * D; ++j) EXPECT_TRUE(std::isfinite(h.data_as<float>()[j])) << impl << " h[" << j << "]";
    for (int64_t j = D; j < S * D; ++j) EXPECT_EQ(h.data_as<float>()[j], 0.0f) << impl << " h[" << j << "]";
  }
}

}  // namespace
}  // namespace tessera
