// attention API: every bad input gives a clear error before anything runs, and no output is
// touched; dispatch picks, refuses typos and names a backend's limit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "kernels/api_test_util.h"
#include "tessera/attention.h"
#include "tessera/error.h"

namespace tessera::attention {
namespace {

// Outputs are filled with this byte; "untouched" means every byte still holds it.
using api_test::sentinel;
using api_test::untouched;

Tensor filled(DType dt, const Shape& shape, float base) {
  Tensor t = Tensor::empty(dt, shape);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_f32(t.data(), dt, i, base + 0.01f * static_cast<float>(i % 13));
  return t;
}

// A valid small problem (B=1, Sq=3, Sk=5, Hq=2, Hkv=1, D=4, Dv=3) with sentinel-filled outputs;
// tests break one thing at a time.
struct Fixture {
  Tensor q = filled(DType::kF32, {1, 3, 2, 4}, -0.1f);
  Tensor k = filled(DType::kF32, {1, 5, 1, 4}, 0.05f);
  Tensor v = filled(DType::kF32, {1, 5, 1, 3}, 0.2f);
  Tensor slopes = filled(DType::kF32, {2}, 0.5f);
  Tensor seg_q = Tensor::zeros(DType::kI32, {1, 3});
  Tensor seg_k = Tensor::zeros(DType::kI32, {1, 5});
  Tensor saved_o = filled(DType::kF32, {1, 3, 2, 3}, 0.3f);
  Tensor saved_lse = filled(DType::kF32, {1, 2, 3}, 1.0f);
  Tensor grad_o = filled(DType::kF32, {1, 3, 2, 3}, -0.2f);
  Tensor o = sentinel(DType::kF32, {1, 3, 2, 3});
  Tensor lse = sentinel(DType::kF32, {1, 2, 3});
  Tensor dq = sentinel(DType::kF32, {1, 3, 2, 4});
  Tensor dk = sentinel(DType::kF32, {1, 5, 1, 4});
  Tensor dv = sentinel(DType::kF32, {1, 5, 1, 3});
  Tensor dbias = sentinel(DType::kF32, {1, 2, 3, 5});
  bool with_dbias = false;  // grads() asks for dbias
  Options opt;

  Fixture() {
    opt.implementation = "reference";
    opt.causal = true;
  }
  Inputs inputs() const {
    Inputs in{q, k, v};
    in.alibi_slopes = slopes.view();
    in.segment_ids_q = seg_q.view();
    in.segment_ids_k = seg_k.view();
    return in;
  }
  ForwardOutputs fout() const { return {o, lse}; }
  BackwardInputs saved() const { return {saved_o, saved_lse, grad_o}; }
  Gradients grads() const {
    Gradients g{dq, dk, dv};
    if (with_dbias) g.dbias = dbias.view();
    return g;
  }
  bool untouched() const {
    for (const Tensor* t : {&o, &lse, &dq, &dk, &dv, &dbias})
      if (!attention::untouched(*t)) return false;
    return true;
  }
};

// Runs forward, backward and fused (or a subset: bit 0 forward, 1 backward, 2 fused) with a
// mutation applied; each must throw `code` with a message containing `needle` and leave every
// output untouched.
void expect_rejected(const std::function<void(Fixture&, Inputs&)>& mutate, ErrorCode code,
                     const std::string& needle, int passes = 7) {
  for (int pass = 0; pass < 3; ++pass) {
    if (!(passes & (1 << pass))) continue;
    Fixture f;
    Inputs in = f.inputs();
    mutate(f, in);
    try {
      if (pass == 0) forward(in, f.fout(), f.opt);
      if (pass == 1) backward(in, f.saved(), f.grads(), f.opt);
      if (pass == 2) forward_backward(in, f.grad_o, f.fout(), f.grads(), f.opt);
      ADD_FAILURE() << "pass " << pass << ": expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "pass " << pass << ": message '" << e.what() << "' lacks '" << needle << "'";
    }
    EXPECT_TRUE(f.untouched()) << "pass " << pass << " (" << needle << ") wrote an output before failing";
  }
}

TEST(AttentionApi, ValidProblemRunsAllThreePasses) {
  Fixture f;
  forward(f.inputs(), f.fout(), f.opt);
  EXPECT_FALSE(untouched(f.o));
  backward(f.inputs(), f.saved(), f.grads(), f.opt);
  EXPECT_FALSE(untouched(f.dk));
  EXPECT_EQ(forward_backward(f.inputs(), f.grad_o, f.fout(), f.grads(), f.opt), "reference");
}

TEST(AttentionApi, DtypeAndShapeMismatches) {
  const auto I = ErrorCode::kInvalidArgument;
  expect_rejected([](Fixture& f, Inputs& in) { f.q = Tensor::zeros(DType::kI32, {1, 3, 2, 4}); in.q = f.q; }, I,
                  "q must be f32, bf16 or f16");
  expect_rejected([](Fixture& f, Inputs& in) { f.k = Tensor::zeros(DType::kBF16, {1, 5, 1, 4}); in.k = f.k; }, I,
                  "k must be f32 like q, got bf16");
  expect_rejected([](Fixture& f, Inputs& in) { f.q = Tensor::zeros(DType::kF32, {3, 2, 4}); in.q = f.q; }, I,
                  "q must be [B, Sq, Hq, D], got [3, 2, 4]");
  expect_rejected([](Fixture& f, Inputs& in) { f.k = Tensor::zeros(DType::kF32, {2, 5, 1, 4}); in.k = f.k; }, I,
                  "k must be [B=1, Sk, Hkv, D=4], got [2, 5, 1, 4]");
  expect_rejected([](Fixture& f, Inputs& in) { f.k = Tensor::zeros(DType::kF32, {1, 5, 1, 5}); in.k = f.k; }, I,
                  "k must be [B=1, Sk, Hkv, D=4], got [1, 5, 1, 5]");
  expect_rejected([](Fixture& f, Inputs& in) { f.v = Tensor::zeros(DType::kF32, {1, 4, 1, 3}); in.v = f.v; }, I,
                  "v must be [B=1, Sk=5, Hkv=1, Dv], got [1, 4, 1, 3]");
  expect_rejected(
      [](Fixture& f, Inputs& in) {
        f.k = Tensor::zeros(DType::kF32, {1, 5, 2, 4});
        f.v = Tensor::zeros(DType::kF32, {1, 5, 2, 3});
        f.q = Tensor::zeros(DType::kF32, {1, 3, 3, 4});
        in.q = f.q;
        in.k = f.k;
        in.v = f.v;
        in.alibi_slopes.reset();
      },
      I, "Hq=3 is not a multiple of Hkv=2");
  expect_rejected([](Fixture& f, Inputs& in) { in.q = TensorView(f.q.data(), DType::kF32, {1, 3, 2, 4}, {24, 1, 12, 3}); },
                  I, "q must be contiguous");
  expect_rejected([](Fixture&, Inputs& in) { in.k = TensorView{}; }, I, "q, k and v are required");
}

TEST(AttentionApi, OptionValues) {
  const auto I = ErrorCode::kInvalidArgument;
  expect_rejected([](Fixture& f, Inputs&) { f.opt.window_left = -2; }, I, "window_left must be >= 0 or -1");
  expect_rejected([](Fixture& f, Inputs&) { f.opt.window_right = -5; }, I, "window_right must be >= 0 or -1");
  expect_rejected([](Fixture& f, Inputs&) { f.opt.scale = std::nan(""); }, I, "scale must be finite in f32 and > 0");
  expect_rejected([](Fixture& f, Inputs&) { f.opt.scale = -1.0; }, I, "scale must be finite in f32 and > 0");
  expect_rejected([](Fixture& f, Inputs&) { f.opt.softcap = -1.0; }, I, "softcap must be 0 (off) or in [");
  // Finite doubles past FLT_MAX are inf in the f32 backends: they gave lse = inf (scale) and
  // o = 0, lse = -inf (softcap) before the check was shared with paged_attention's. A cap below
  // FLT_MIN is 0 or subnormal in f32: NaN / Inf gradients.
  expect_rejected([](Fixture& f, Inputs&) { f.opt.scale = 1e39; }, I, "scale must be finite in f32 and > 0");
  expect_rejected([](Fixture& f, Inputs&) { f.opt.softcap = 1e39; }, I, "softcap must be 0 (off) or in [");
  expect_rejected([](Fixture& f, Inputs&) { f.opt.softcap = 1e-39; }, I, "softcap must be 0 (off) or in [");
  expect_rejected([](Fixture& f, Inputs&) { f.opt.softcap = 1e-50; }, I, "softcap must be 0 (off) or in [");
}

// dropout_p in [0, 1) with an i32 [2] seed on the inputs' device; p > 0 without a seed is refused
// (a fixed default key would draw the same mask every step).
TEST(AttentionApi, DropoutValues) {
  const auto I = ErrorCode::kInvalidArgument;
  static Tensor seed = Tensor::zeros(DType::kI32, {2}), seed3 = Tensor::zeros(DType::kI32, {3});
  static Tensor seed64 = Tensor::zeros(DType::kI64, {2}), seedf = Tensor::zeros(DType::kF32, {2});
  for (double p : {-0.1, 1.0, 1.5, std::nan(""), double(INFINITY)})
    expect_rejected([p](Fixture& f, Inputs& in) { f.opt.dropout_p = p, in.dropout_seed = seed.view(); }, I,
                    "dropout_p must be in [0, 1), got ");
  expect_rejected([](Fixture& f, Inputs&) { f.opt.dropout_p = 0.1; }, I, "dropout_p > 0 needs dropout_seed (i32 [2]");
  expect_rejected([](Fixture& f, Inputs& in) { f.opt.dropout_p = 0.1, in.dropout_seed = seed3.view(); }, I,
                  "dropout_seed must be [2]");
  expect_rejected([](Fixture& f, Inputs& in) { f.opt.dropout_p = 0.1, in.dropout_seed = seed64.view(); }, I,
                  "dropout_seed");
  expect_rejected([](Fixture&, Inputs& in) { in.dropout_seed = seedf.view(); }, I, "dropout_seed");  // checked at p = 0 too
  // A seed that is an output: refused as any input an output overlaps.
  expect_rejected([](Fixture& f, Inputs& in) {
    f.opt.dropout_p = 0.5;
    in.dropout_seed = TensorView{f.lse.data(), DType::kI32, {2}, {1}, Device::cpu()};
  }, I, "dropout_seed", 1);
  // 2^32 keys: the mask's counters are 32-bit positions. Refused from the shapes (no data read).
  static Tensor seed_ok = Tensor::zeros(DType::kI32, {2});
  {
    Fixture f;
    Inputs in = f.inputs();
    in.segment_ids_q.reset(), in.segment_ids_k.reset(), in.alibi_slopes.reset();
    f.opt.causal = false;
    in.k = TensorView{f.k.data(), DType::kF32, {1, int64_t{1} << 32, 1, 4}, Device::cpu()};
    in.v = TensorView{f.v.data(), DType::kF32, {1, int64_t{1} << 32, 1, 3}, Device::cpu()};
    f.opt.dropout_p = 0.1;
    in.dropout_seed = seed_ok.view();
    try {
      forward(in, f.fout(), f.opt);
      ADD_FAILURE() << "2^32 keys with dropout ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dropout needs sequences shorter than 2^32"), std::string::npos) << e.what();
    }
  }
  Fixture f;
  Inputs in = f.inputs();
  f.opt.dropout_p = 0.999;
  in.dropout_seed = seed.view();
  EXPECT_NO_THROW(forward(in, f.fout(), f.opt));
}

// The bias's shape and dtype, dbias's presence, shape and memory, NaN / +inf under check_finite;
// −inf masks and takes no gradient.
TEST(AttentionApi, BiasValues) {
  const auto I = ErrorCode::kInvalidArgument;
  static Tensor full = Tensor::zeros(DType::kF32, {1, 2, 3, 5}), row = Tensor::zeros(DType::kF32, {1, 1, 1, 5});
  static Tensor wrong = Tensor::zeros(DType::kF32, {1, 2, 3, 4}), flat = Tensor::zeros(DType::kF32, {2, 3, 5});
  static Tensor ints = Tensor::zeros(DType::kI32, {1, 2, 3, 5}), bf = Tensor::zeros(DType::kBF16, {1, 2, 3, 5});
  for (const Tensor* t : {&wrong, &flat})
    expect_rejected([t](Fixture&, Inputs& in) { in.bias = t->view(); }, I,
                    "bias must be [B|1, Hq|1, Sq|1, Sk|1] = [1|1, 2|1, 3|1, 5|1], got ");
  for (const Tensor* t : {&ints, &bf})  // f32 or q's dtype (f32 here)
    expect_rejected([t](Fixture&, Inputs& in) { in.bias = t->view(); }, I, "bias must be f32 or q's dtype f32, got ");
  // dbias: only with a bias, in the bias's shape; never over another output.
  expect_rejected([](Fixture& f, Inputs&) { f.with_dbias = true; }, I, "dbias is the gradient of a bias", 6);
  expect_rejected([](Fixture& f, Inputs& in) { f.with_dbias = true, in.bias = row.view(); }, I, "dbias", 6);
  {  // dbias over dk: refused before anything runs
    Fixture f;
    Inputs in = f.inputs();
    in.bias = full.view();
    Gradients g{f.dq, f.dk, f.dv};
    g.dbias = TensorView{f.dk.data(), DType::kF32, {1, 2, 3, 5}, Device::cpu()};
    EXPECT_THROW(backward(in, f.saved(), g, f.opt), Error);
    EXPECT_TRUE(f.untouched());
  }
  // NaN and +inf refused under check_finite; −inf masks.
  static Tensor nan = Tensor::zeros(DType::kF32, {1, 1, 1, 5}), pinf = Tensor::zeros(DType::kF32, {1, 1, 1, 5});
  nan.data_as<float>()[2] = NAN, pinf.data_as<float>()[4] = INFINITY;
  for (const Tensor* t : {&nan, &pinf})
    expect_rejected([t](Fixture& f, Inputs& in) { f.opt.check_finite = true, in.bias = t->view(); }, I,
                    "bias contains NaN or +Inf");
  Fixture f;
  Inputs in = f.inputs();
  Tensor minf = Tensor::zeros(DType::kF32, {1, 1, 1, 5});
  minf.data_as<float>()[0] = -INFINITY;
  in.bias = minf.view();
  f.opt.check_finite = true;
  f.with_dbias = true;
  f.dbias = sentinel(DType::kF32, {1, 1, 1, 5});
  EXPECT_EQ(forward_backward(in, f.grad_o, f.fout(), f.grads(), f.opt), "reference");
  EXPECT_EQ(f.dbias.data_as<float>()[0], 0.0f);  // the masked key takes no gradient
  EXPECT_FALSE(attention::untouched(f.dbias));
}

// The varlen form has no bias; an empty call zero-fills dbias.
TEST(AttentionApi, BiasFormsAndEmptyCalls) {
  Tensor q = Tensor::zeros(DType::kF32, {3, 2, 4}), k = Tensor::zeros(DType::kF32, {5, 1, 4});
  Tensor v = Tensor::zeros(DType::kF32, {5, 1, 3}), cuq = Tensor::zeros(DType::kI32, {2}), cuk = Tensor::zeros(DType::kI32, {2});
  cuq.data_as<int32_t>()[1] = 3, cuk.data_as<int32_t>()[1] = 5;
  Tensor bias = Tensor::zeros(DType::kF32, {1, 2, 3, 5});
  Inputs in{q, k, v};
  in.cu_seqlens_q = cuq.view(), in.cu_seqlens_k = cuk.view(), in.bias = bias.view();
  try {
    compute(in);
    ADD_FAILURE() << "varlen with a bias ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bias is for the dense form"), std::string::npos) << e.what();
  }
  Tensor q0 = Tensor::zeros(DType::kF32, {1, 0, 2, 4}), k1 = Tensor::zeros(DType::kF32, {1, 5, 1, 4});
  Tensor v1 = Tensor::zeros(DType::kF32, {1, 5, 1, 3}), g0 = Tensor::zeros(DType::kF32, {1, 0, 2, 3});
  Tensor b1 = Tensor::zeros(DType::kF32, {1, 2, 1, 5});
  Inputs e{q0, k1, v1};
  e.bias = b1.view();
  Tensor dq = Tensor::empty(DType::kF32, {1, 0, 2, 4}), dk = sentinel(DType::kF32, {1, 5, 1, 4});
  Tensor dv = sentinel(DType::kF32, {1, 5, 1, 3}), db = sentinel(DType::kF32, {1, 2, 1, 5});
  Tensor o = Tensor::empty(DType::kF32, {1, 0, 2, 3}), lse = Tensor::empty(DType::kF32, {1, 2, 0});
  Gradients g{dq, dk, dv};
  g.dbias = db.view();
  EXPECT_EQ(forward_backward(e, g0, {o, lse}, g, {}), "(empty)");
  for (int64_t i = 0; i < db.numel(); ++i) EXPECT_EQ(db.data_as<float>()[i], 0.0f);
}

// A window at least Sq + Sk long reaches every key: the same as -1 (unbounded), bit for bit. At
// INT64_MAX (sys.maxsize as "unbounded") i + w overflowed: o = 0, lse = -inf, zero gradients.
TEST(AttentionApi, AHugeWindowIsUnbounded) {
  for (bool causal : {false, true}) {
    Fixture unbounded, huge;
    unbounded.opt.causal = huge.opt.causal = causal;
    huge.opt.window_left = 3 + 5;  // exactly Sq + Sk: already every key
    huge.opt.window_right = std::numeric_limits<int64_t>::max();
    forward_backward(unbounded.inputs(), unbounded.grad_o, unbounded.fout(), unbounded.grads(), unbounded.opt);
    forward_backward(huge.inputs(), huge.grad_o, huge.fout(), huge.grads(), huge.opt);
    for (auto [a, b] : {std::pair{&unbounded.o, &huge.o}, {&unbounded.lse, &huge.lse}, {&unbounded.dq, &huge.dq},
                        {&unbounded.dk, &huge.dk}, {&unbounded.dv, &huge.dv}})
      for (int64_t i = 0; i < a->numel(); ++i) {
        ASSERT_TRUE(std::isfinite(a->data_as<float>()[i])) << "causal " << causal << " element " << i;
        ASSERT_EQ(a->data_as<float>()[i], b->data_as<float>()[i]) << "causal " << causal << " element " << i;
      }
  }
}

TEST(AttentionApi, AlibiAndSegmentIds) {
  const auto I = ErrorCode::kInvalidArgument;
  expect_rejected([](Fixture& f, Inputs& in) { f.slopes = Tensor::zeros(DType::kF32, {3}); in.alibi_slopes = f.slopes.view(); },
                  I, "alibi_slopes must be [Hq=2] or [B=1, Hq=2]");
  expect_rejected([](Fixture& f, Inputs& in) { f.slopes = Tensor::zeros(DType::kBF16, {2}); in.alibi_slopes = f.slopes.view(); },
                  I, "alibi_slopes must be f32");
  expect_rejected([](Fixture& f, Inputs& in) { f.seg_q = Tensor::zeros(DType::kI32, {1, 4}); in.segment_ids_q = f.seg_q.view(); },
                  I, "segment_ids_q must be [B=1, Sq=3], got [1, 4]");
  expect_rejected([](Fixture& f, Inputs& in) { f.seg_k = Tensor::zeros(DType::kI32, {5}); in.segment_ids_k = f.seg_k.view(); },
                  I, "segment_ids_k must be [B=1, Sk=5]");
  expect_rejected([](Fixture&, Inputs& in) { in.segment_ids_k.reset(); }, I, "must be given together");
  expect_rejected([](Fixture& f, Inputs& in) { f.seg_q = Tensor::zeros(DType::kI64, {1, 3}); in.segment_ids_q = f.seg_q.view(); },
                  I, "segment_ids_q must be i32, got i64");
}

// The varlen form: q [T, H, D] with cu_seqlens.
TEST(AttentionApi, VarlenValidation) {
  const auto I = ErrorCode::kInvalidArgument;
  auto varlen = [](Fixture& f, Inputs& in, std::vector<int32_t> cq, std::vector<int32_t> ck) {
    static Tensor q, k, v, cuq, cuk, o, lse, dq, dk, dv;  // kept alive for the call
    (void)f;
    q = Tensor::zeros(DType::kF32, {3, 2, 4});
    k = Tensor::zeros(DType::kF32, {5, 1, 4});
    v = Tensor::zeros(DType::kF32, {5, 1, 3});
    cuq = Tensor::empty(DType::kI32, {static_cast<int64_t>(cq.size())});
    cuk = Tensor::empty(DType::kI32, {static_cast<int64_t>(ck.size())});
    std::copy(cq.begin(), cq.end(), cuq.data_as<int32_t>());
    std::copy(ck.begin(), ck.end(), cuk.data_as<int32_t>());
    in = Inputs{q, k, v};
    in.cu_seqlens_q = cuq.view();
    in.cu_seqlens_k = cuk.view();
  };
  // Outputs are the dense fixture's, so each case below must fail on its inputs first.
  expect_rejected([&](Fixture& f, Inputs& in) { varlen(f, in, {1, 3}, {0, 5}); }, I, "cu_seqlens_q[0] must be 0", 1);
  expect_rejected([&](Fixture& f, Inputs& in) { varlen(f, in, {0, 3, 2, 3}, {0, 1, 2, 5}); }, I,
                  "cu_seqlens_q must be non-decreasing", 1);
  expect_rejected([&](Fixture& f, Inputs& in) { varlen(f, in, {0, 2}, {0, 5}); }, I,
                  "cu_seqlens_q[N=1] = 2 must equal the rows of q (3)", 1);
  expect_rejected([&](Fixture& f, Inputs& in) { varlen(f, in, {0, 3}, {0, 1, 5}); }, I, "cu_seqlens_k must be [N+1=2], got [3]", 1);
  expect_rejected([&](Fixture& f, Inputs& in) { varlen(f, in, {}, {}); }, I, "cu_seqlens_q must be [N+1] with N >= 0", 1);
  expect_rejected([&](Fixture& f, Inputs& in) {
    varlen(f, in, {0, 3}, {0, 5});
    in.cu_seqlens_k.reset();
  }, I, "cu_seqlens_q and cu_seqlens_k must be given together", 1);
  // The offsets are host memory whatever q's device (a device backend copies them); a view
  // labelled as device memory is refused before anything reads it (the pointer is never touched).
  expect_rejected([&](Fixture& f, Inputs& in) {
    varlen(f, in, {0, 3}, {0, 5});
    in.cu_seqlens_k->device = Device{DeviceType::kCUDA, 0};
  }, I, "cu_seqlens_k must be in host memory (also for device inputs), got cuda:0", 1);
  expect_rejected([&](Fixture& f, Inputs& in) {
    varlen(f, in, {0, 3}, {0, 5});
    in.segment_ids_q = f.seg_q.view();
    in.segment_ids_k = f.seg_k.view();
  }, I, "segment ids are for the dense form", 1);
  // Valid varlen inputs with dense-shaped outputs: the output check names the varlen shape.
  expect_rejected([&](Fixture& f, Inputs& in) { varlen(f, in, {0, 3}, {0, 5}); }, I, "o must have shape [3, 2, 3]", 1);
}

TEST(AttentionApi, OutputShapesAndDtypes) {
  const auto I = ErrorCode::kInvalidArgument;
  expect_rejected([](Fixture& f, Inputs&) { f.o = sentinel(DType::kF32, {1, 3, 2, 4}); }, I, "o must have shape [1, 3, 2, 3]", 5);
  expect_rejected([](Fixture& f, Inputs&) { f.lse = sentinel(DType::kF32, {1, 3, 2}); }, I, "lse must have shape [1, 2, 3]", 5);
  expect_rejected([](Fixture& f, Inputs&) { f.o = sentinel(DType::kBF16, {1, 3, 2, 3}); }, I, "o must be f32, got bf16", 5);
  expect_rejected([](Fixture& f, Inputs&) { f.dq = sentinel(DType::kF16, {1, 3, 2, 4}); }, I, "dq must be f32, got f16", 6);
  expect_rejected([](Fixture& f, Inputs&) { f.dk = sentinel(DType::kF32, {1, 5, 2, 4}); }, I, "dk must have shape [1, 5, 1, 4]", 6);
  expect_rejected([](Fixture& f, Inputs&) { f.dv = sentinel(DType::kF32, {1, 5, 1, 4}); }, I, "dv must have shape", 6);
  expect_rejected([](Fixture& f, Inputs&) { f.grad_o = Tensor::empty(DType::kF32, {1, 3, 2, 4}); }, I, "grad_o must have shape", 6);
  expect_rejected([](Fixture& f, Inputs&) { f.saved_lse = Tensor::empty(DType::kF16, {1, 2, 3}); }, I, "lse must be f32", 2);
  expect_rejected([](Fixture& f, Inputs&) { f.saved_o = Tensor::empty(DType::kF32, {1, 3, 2}); }, I, "o must have shape", 2);
}

TEST(AttentionApi, NonFiniteInputsWhenChecked) {
  const auto I = ErrorCode::kInvalidArgument;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  expect_rejected([&](Fixture& f, Inputs&) { f.opt.check_finite = true; f.q.data_as<float>()[3] = nan; }, I, "q contains NaN or Inf");
  expect_rejected([&](Fixture& f, Inputs&) { f.opt.check_finite = true; f.k.data_as<float>()[0] = inf; }, I, "k contains NaN or Inf");
  expect_rejected([&](Fixture& f, Inputs&) { f.opt.check_finite = true; f.v.data_as<float>()[2] = -inf; }, I, "v contains NaN or Inf");
  expect_rejected([&](Fixture& f, Inputs&) { f.opt.check_finite = true; f.slopes.data_as<float>()[1] = nan; }, I, "alibi_slopes contain");
  expect_rejected([&](Fixture& f, Inputs&) { f.opt.check_finite = true; f.grad_o.data_as<float>()[1] = nan; }, I, "grad_o contains", 6);
  expect_rejected([&](Fixture& f, Inputs&) { f.opt.check_finite = true; f.saved_o.data_as<float>()[1] = inf; }, I, "o contains", 2);
  expect_rejected([&](Fixture& f, Inputs&) { f.opt.check_finite = true; f.saved_lse.data_as<float>()[1] = nan; }, I, "lse contains NaN", 2);
  // −inf in a saved lse is a row that saw nothing: accepted.
  Fixture f;
  f.opt.check_finite = true;
  f.saved_lse.data_as<float>()[0] = -inf;
  backward(f.inputs(), f.saved(), f.grads(), f.opt);
  // Unchecked by default: NaN in q runs (the garbage is the caller's).
  Fixture g;
  g.q.data_as<float>()[0] = nan;
  EXPECT_NO_THROW(forward(g.inputs(), g.fout(), g.opt));
}

TEST(AttentionApi, DispatchAndBackendLimits) {
  expect_rejected([](Fixture& f, Inputs&) { f.opt.implementation = "cpux"; }, ErrorCode::kNotFound, "cpux");
  EXPECT_THROW(validate_block_sizes("nope", BlockSizes{}), Error);
#ifdef TESSERA_HAVE_CPU_BACKEND
  // D over the cpu backend's limit: named, before anything runs.
  expect_rejected(
      [](Fixture& f, Inputs& in) {
        f.opt.implementation = "cpu";
        f.q = Tensor::zeros(DType::kF32, {1, 3, 2, 300});
        f.k = Tensor::zeros(DType::kF32, {1, 5, 1, 300});
        f.dq = sentinel(DType::kF32, {1, 3, 2, 300});
        f.dk = sentinel(DType::kF32, {1, 5, 1, 300});
        in.q = f.q;
        in.k = f.k;
      },
      ErrorCode::kUnsupported, "D <= 256");
  // Block sizes that break a cpu constraint are named.
  try {
    validate_block_sizes("cpu", BlockSizes{0, 64});
    ADD_FAILURE() << "q = 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q (query block)"), std::string::npos) << e.what();
  }
  expect_rejected([](Fixture& f, Inputs&) { f.opt.implementation = "cpu"; f.opt.block_sizes = BlockSizes{16, 0}; },
                  ErrorCode::kInvalidArgument, "kv (key block)");
  // Default order: the cpu backend for host inputs; the reference when the cpu cannot run it.
  Fixture f;
  f.opt.implementation = "";
  EXPECT_EQ(forward(f.inputs(), f.fout(), f.opt), "cpu");
#endif
  bool found = false;
  for (const auto& info : implementations()) found |= info.name == "reference" && info.available;
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace tessera::attention
