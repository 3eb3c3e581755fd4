// Gradients left out (include/tessera/linear_cross_entropy.h, Gradients): a frozen w's dw, a
// frozen x's dx, a frozen bias's dbias. The gradients that are asked for must be the same bits
// as those of the call that computes all three — on every host implementation (the cpu backends
// skip the work; the reference computes everything into scratch, the fallback cuda takes), every
// dtype and layout, both gradient passes, the token-block, thread, vocabulary-slice and
// ignored-token-compaction paths — and the generic call (CallArgs::skip) leaves them out of the
// outputs and refuses what a kernel cannot skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/trace.h"
#include "cpu_backend.h"
#include "kernels/api_test_util.h"
#include "kernels/registry.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy {
namespace {

using api_test::error_of;

::testing::AssertionResult has(const std::string& message, const std::string& part) {
  if (message.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << message << "' lacks '" << part << "'";
}

struct Case {
  int64_t B = 37, H = 24, V = 70;
  DType dt = DType::kF32;
  WLayout layout = WLayout::kVH;
  bool ignored = false;  // every 5th label ignore_index: the compaction path
};

struct Data {
  Tensor x, w, bias, labels;
  explicit Data(const Case& c) {
    x = random_uniform(c.dt, {c.B, c.H}, 1.0f, 11);
    w = random_uniform(c.dt, c.layout == WLayout::kVH ? Shape{c.V, c.H} : Shape{c.H, c.V}, 0.5f, 12);
    bias = random_uniform(c.dt, {c.V}, 0.5f, 13);
    labels = random_indices(DType::kI64, {c.B}, c.V, 14);
    if (c.ignored)
      for (int64_t t = 0; t < c.B; t += 5) labels.data_as<int64_t>()[t] = -100;
  }
};

struct Out {
  Tensor loss, dx, dw, dbias;
};

// One backward or fused call asking for the gradients in `want` ("dx", "dw", "dbias"); with_lse:
// a backward given the forward's lse (the backend then skips its own statistics pass).
Out run(const Case& c, const Data& d, Pass pass, const std::vector<std::string>& want, Options o,
        bool with_lse = false) {
  const auto wants = [&](const char* n) { return std::find(want.begin(), want.end(), n) != want.end(); };
  o.w_layout = c.layout;
  o.reduction = Reduction::kMean;
  const Inputs in{d.x.view(), d.w.view(), d.bias.view(), d.labels.view(), std::nullopt};
  Out r;
  Gradients g;
  if (wants("dx")) r.dx = Tensor::zeros(c.dt, d.x.shape()), g.dx = r.dx.view();
  if (wants("dw")) r.dw = Tensor::zeros(c.dt, d.w.shape()), g.dw = r.dw.view();
  if (wants("dbias")) r.dbias = Tensor::zeros(c.dt, {c.V}), g.dbias = r.dbias.view();
  Tensor one = Tensor::empty(DType::kF32, {});
  one.data_as<float>()[0] = 0.75f;
  if (pass == Pass::kBackward && with_lse) {
    Tensor loss = Tensor::empty(DType::kF32, {}), lse = Tensor::empty(DType::kF32, {c.B});
    forward(in, {loss.view(), lse.view(), std::nullopt}, o);
    backward(in, one.view(), lse.view(), g, o);
  } else if (pass == Pass::kBackward) {
    backward(in, one.view(), g, o);
  } else {
    r.loss = Tensor::empty(DType::kF32, {});
    Tensor lse = Tensor::empty(DType::kF32, {c.B});
    forward_backward(in, one.view(), {r.loss.view(), lse.view(), std::nullopt}, g, o);
  }
  return r;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.view().nbytes() == b.view().nbytes() && std::memcmp(a.data(), b.data(), a.view().nbytes()) == 0;
}

// |a − b| within `ulps` units of b's dtype at the scale of b's largest entry.
bool close(const Tensor& a, const Tensor& b, double ulps) {
  double m = 0.0;
  for (int64_t i = 0; i < b.numel(); ++i) m = std::max(m, std::abs(double(load_as_f32(b.data(), b.dtype(), i))));
  const double unit = b.dtype() == DType::kF32 ? 0x1p-23 : b.dtype() == DType::kBF16 ? 0x1p-7 : 0x1p-10;
  for (int64_t i = 0; i < b.numel(); ++i)
    if (std::abs(double(load_as_f32(a.data(), a.dtype(), i)) - double(load_as_f32(b.data(), b.dtype(), i))) >
        ulps * unit * m)
      return false;
  return true;
}

// Every subset of the three gradients against the call that asks for all of them: the same bits,
// but for `rounding_without_dw` (a memory budget that puts a 16-bit dw in vocabulary slices: without
// dw no slices are needed, so dx and dbias come from the unsliced route, within a few units of it).
void expect_subsets_match(const Case& c, const Options& o, const std::string& label, bool rounding_without_dw = false,
                          bool with_lse = false) {
  const Data d(c);
  for (Pass pass : {Pass::kBackward, Pass::kFused}) {
    if (with_lse && pass == Pass::kFused) continue;
    const Out all = run(c, d, pass, {"dx", "dw", "dbias"}, o, with_lse);
    const std::vector<std::vector<std::string>> subsets = {{"dx"}, {"dw"}, {"dbias"}, {"dx", "dbias"}, {"dw", "dbias"},
                                                           {"dx", "dw"}, {}};
    for (const auto& want : subsets) {
      const Out part = run(c, d, pass, want, o, with_lse);
      std::string what = label + " " + pass_name(pass) + " want";
      for (const auto& n : want) what += " " + n;
      const auto same = [&](const Tensor& a, const Tensor& b) {
        return rounding_without_dw && !part.dw.defined() ? close(a, b, 4.0) : same_bits(a, b);
      };
      if (part.dx.defined()) EXPECT_TRUE(same(part.dx, all.dx)) << what << ": dx";
      if (part.dw.defined()) EXPECT_TRUE(same_bits(part.dw, all.dw)) << what << ": dw";
      if (part.dbias.defined()) EXPECT_TRUE(same(part.dbias, all.dbias)) << what << ": dbias";
      if (pass == Pass::kFused) EXPECT_TRUE(same_bits(part.loss, all.loss)) << what << ": loss";
    }
    // The test would pass on all-zero gradients: they are not.
    float m = 0.0f;
    for (int64_t i = 0; i < all.dw.numel(); ++i) m = std::max(m, std::abs(load_as_f32(all.dw.data(), c.dt, i)));
    EXPECT_GT(m, 0.0f) << label;
  }
}

std::vector<const char*> host_implementations() {
  if (testing::kHaveCpuBackend) return {"reference", "cpu", "cpu_v2"};
  return {"reference"};
}

TEST(LceSkippedGradients, EveryImplementationDtypeAndLayout) {
  for (const char* impl : host_implementations())
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (WLayout layout : {WLayout::kVH, WLayout::kHV}) {
        Case c;
        c.dt = dt, c.layout = layout;
        Options o;
        o.implementation = impl;
        expect_subsets_match(c, o, std::string(impl) + " " + dtype_name(dt) + " " + w_layout_name(layout));
      }
}

// Small blocks (many token blocks: the dw accumulation's first block; vocab and hidden tails) at
// 1-3 threads: the backend uses one thread per 2^16 multiply-adds of a token block's logits, so
// V = 1100 at b = 8, H = 64 gives it three; ignored tokens compacted at 2.
TEST(LceSkippedGradients, CpuBlocksThreadsAndCompaction) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})  // f16: the packed f32 route with w widened (v0.17)
    for (WLayout layout : {WLayout::kVH, WLayout::kHV})
      for (int threads : {1, 2, 3}) {
        Case c;
        c.H = 64, c.V = 1100;
        c.dt = dt, c.layout = layout, c.ignored = threads == 2;
        Options o;
        o.implementation = "cpu";
        o.num_threads = threads;
        o.block_sizes = BlockSizes{8, 8, 16};
        expect_subsets_match(c, o, std::string("cpu ") + dtype_name(dt) + " " + w_layout_name(layout) + " threads " +
                                       std::to_string(threads));
      }
}

// Three threads where the third has no vocabulary (V = 20 splits in ranges of 16), and a backward
// given the forward's lse (no statistics pass of its own).
TEST(LceSkippedGradients, CpuThreadWithoutVocabularyAndGivenLse) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  for (WLayout layout : {WLayout::kVH, WLayout::kHV}) {
    Case c;
    c.B = 64, c.H = 160, c.V = 20, c.layout = layout;
    Options o;
    o.implementation = "cpu";
    o.num_threads = 3;
    expect_subsets_match(c, o, std::string("cpu 3 threads V=20 ") + w_layout_name(layout));
    Case l;
    l.layout = layout, l.dt = DType::kBF16;
    expect_subsets_match(l, o, std::string("cpu given lse ") + w_layout_name(layout), false, true);
  }
}

// A 16-bit dw under a memory budget runs in vocabulary slices (cpu_vocab_slices.h), which sum dx
// over the slices: without dx they must still give dw; without dw no slices are needed.
TEST(LceSkippedGradients, CpuVocabularySlices) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  for (WLayout layout : {WLayout::kVH, WLayout::kHV}) {
    Case c;
    c.dt = DType::kBF16, c.layout = layout, c.V = 200;
    Options o;
    o.implementation = "cpu";
    o.memory_budget = 1;
    expect_subsets_match(c, o, std::string("cpu slices ") + w_layout_name(layout), true);
  }
}

// The generic call: skip leaves the outputs out and is refused where the kernel cannot skip.
TEST(LceSkippedGradients, CallArgsSkipLeavesOutputsOut) {
  const kernels::KernelSpec& k = kernels::get("linear_cross_entropy");
  const Case c;
  const Data d(c);
  Tensor one = Tensor::empty(DType::kF32, {});
  one.data_as<float>()[0] = 1.0f;
  kernels::CallArgs a;
  a.pass = Pass::kBackward;
  a.tensors = {{"x", d.x.view()}, {"w", d.w.view()}, {"labels", d.labels.view()}, {"grad_loss", one.view()}};
  a.options = harness::defaults_of(k.call.options);
  a.skip = {"dw"};
  const std::vector<kernels::OutputDesc> descs = kernels::outputs_of(k.call, a, k.name);
  ASSERT_EQ(descs.size(), 1u);
  EXPECT_EQ(descs[0].name, "dx");
  Tensor dx = Tensor::zeros(c.dt, d.x.shape());
  k.call.call(a, {dx.view()});
  float m = 0.0f;
  for (int64_t i = 0; i < dx.numel(); ++i) m = std::max(m, std::abs(dx.data_as<float>()[i]));
  EXPECT_GT(m, 0.0f);
  // Two outputs for one wanted: the count error names the pass.
  Tensor extra = Tensor::zeros(c.dt, d.w.shape());
  EXPECT_TRUE(has(error_of([&] { k.call.call(a, {dx.view(), extra.view()}); }), "backward writes 1 outputs, got 2"));
  const auto outputs = [&] { kernels::outputs_of(k.call, a, k.name); };
  a.skip = {"lse"};
  EXPECT_EQ(error_of(outputs), "linear_cross_entropy: cannot skip 'lse' (skippable: dx, dw, dbias)");
  a.pass = Pass::kForward;
  a.skip = {"dw"};
  EXPECT_TRUE(has(error_of(outputs), "forward computes no gradient to skip"));
  a.pass = Pass::kBackward;
  a.skip = {"dq"};
  const kernels::KernelSpec& att = kernels::get("attention");
  EXPECT_EQ(error_of([&] { kernels::check_skip(att.call, a, att.name); }),
            "attention: cannot skip 'dq' (skippable: dbias)");
  const kernels::KernelSpec& ml = kernels::get("mlstm");
  EXPECT_EQ(error_of([&] { kernels::check_skip(ml.call, a, ml.name); }), "mlstm: cannot skip 'dq' (skippable: none)");
}

// The C++ API: dbias without a bias is still refused; a call asking for no gradient at all runs
// the forward alone (fused: the forward's bits, and no phase B — the trace has no gradient
// scope) or nothing (backward).
TEST(LceSkippedGradients, ApiEdges) {
  const Case c;
  const Data d(c);
  Tensor one = Tensor::empty(DType::kF32, {});
  one.data_as<float>()[0] = 1.0f;
  const Inputs nobias{d.x.view(), d.w.view(), std::nullopt, d.labels.view(), std::nullopt};
  Tensor db = Tensor::zeros(DType::kF32, {c.V});
  Gradients g;
  g.dbias = db.view();
  EXPECT_TRUE(has(error_of([&] { backward(nobias, one.view(), g, Options{}); }), "dbias is given but there is no bias"));
  for (const char* impl : host_implementations()) {
    Options o;
    o.implementation = impl;
    trace::start();
    const Out none = run(c, d, Pass::kFused, {}, o);
    trace::stop();
    for (const char* scope : {"lce.phase_b1", "lce.phase_b2", "lce.gemm.dw", "lce.gemm.dx"})
      EXPECT_EQ(trace::span(scope).events, 0u) << impl << " " << scope;
    if (std::string(impl) == "cpu") EXPECT_GT(trace::span("lce.call").events, 0u);  // it did trace
    Tensor loss = Tensor::empty(DType::kF32, {}), lse = Tensor::empty(DType::kF32, {c.B});
    o.w_layout = c.layout;
    o.reduction = Reduction::kMean;
    const Inputs in{d.x.view(), d.w.view(), d.bias.view(), d.labels.view(), std::nullopt};
    forward(in, {loss.view(), lse.view(), std::nullopt}, o);
    EXPECT_TRUE(same_bits(none.loss, loss)) << impl;
    trace::start();
    EXPECT_EQ(backward(in, one.view(), Gradients{}, o), "(no gradient asked for)") << impl;
    trace::stop();
    EXPECT_EQ(trace::event_count(), 0u) << impl;
  }
}

}  // namespace
}  // namespace tessera::linear_cross_entropy
