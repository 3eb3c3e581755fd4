// The bench's BLAS-materialized attention baseline computes the same attention as the reference
// (it is only a timing yardstick, but a yardstick that computes something else would make every
// "x baseline" ratio meaningless).
#include <gtest/gtest.h>

#include <cmath>

#include "core/random.h"
#include "harness/blas.h"
#include "kernels/attention/baseline.h"
#include "tessera/attention.h"
#include "tessera/error.h"

namespace tessera::attention {
namespace {

double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(double(load_as_f32(a.data(), a.dtype(), i)) - load_as_f32(b.data(), b.dtype(), i)));
  return m;
}

TEST(AttentionBaseline, MaterializedMatchesTheReference) {
  if (!harness::blas::available()) GTEST_SKIP() << "no host BLAS";
  for (bool causal : {false, true}) {
    BaselineInputs in;
    in.B = 2, in.S = 37, in.H = 4, in.Hkv = 2, in.D = 16, in.causal = causal;
    const Tensor q = random_uniform(DType::kF32, {2, 37, 4, 16}, 1.f, 1);
    const Tensor k = random_uniform(DType::kF32, {2, 37, 2, 16}, 1.f, 2);
    const Tensor v = random_uniform(DType::kF32, {2, 37, 2, 16}, 1.f, 3);
    const Tensor d_o = random_uniform(DType::kF32, {2, 37, 4, 16}, 1.f, 4);
    in.q = &q, in.k = &k, in.v = &v, in.d_o = &d_o;
    MaterializedBaseline m = make_materialized_baseline(in, Pass::kFused);
    m.run();
    m.run();  // gradients are not accumulated across runs
    const std::vector<Tensor> got = m.results();
    Options opt;
    opt.implementation = "reference";
    opt.causal = causal;
    Inputs ins;
    ins.q = q, ins.k = k, ins.v = v;
    const Result want = compute_with_grad(ins, d_o.view(), opt);
    // f32 arithmetic on values of order 1 over 37 keys: differences ~1e-6; 1e-4 leaves room.
    EXPECT_LT(max_diff(got[0], want.o), 1e-4) << "o causal=" << causal;
    EXPECT_LT(max_diff(got[1], want.dq), 1e-4) << "dq causal=" << causal;
    EXPECT_LT(max_diff(got[2], want.dk), 1e-4) << "dk causal=" << causal;
    EXPECT_LT(max_diff(got[3], want.dv), 1e-4) << "dv causal=" << causal;
  }
}

TEST(AttentionBaseline, BackwardAloneIsNotOffered) {
  if (!harness::blas::available()) GTEST_SKIP() << "no host BLAS";
  const Tensor t = random_uniform(DType::kF32, {1, 4, 1, 8}, 1.f, 1);
  BaselineInputs in;
  in.B = 1, in.S = 4, in.H = 1, in.Hkv = 1, in.D = 8;
  in.q = in.k = in.v = in.d_o = &t;
  EXPECT_THROW(make_materialized_baseline(in, Pass::kBackward), Error);
}

}  // namespace
}  // namespace tessera::attention
