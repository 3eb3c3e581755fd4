// grouped_matmul API: every bad input gives a clear error before anything runs, and no output is
// touched; dispatch refuses typos; the generic tools see the kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "cpu_backend.h"
#include "kernels/api_test_util.h"
#include "kernels/registry.h"
#include "tessera/error.h"
#include "tessera/grouped_matmul.h"

namespace tessera::grouped_matmul {
namespace {

using api_test::sentinel;
using api_test::untouched;
Tensor filled(DType dt, const Shape& shape) {
  Tensor t = Tensor::empty(dt, shape);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_f32(t.data(), dt, i, 0.1f * static_cast<float>(i % 7) - 0.3f);
  return t;
}
Tensor sizes(DType dt, const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty(dt, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::kI32) t.data_as<int32_t>()[i] = static_cast<int32_t>(v[i]);
    else if (dt == DType::kI64) t.data_as<int64_t>()[i] = v[i];
    else store_from_f32(t.data(), dt, static_cast<int64_t>(i), static_cast<float>(v[i]));
  }
  return t;
}

// M=6, K=3, N=4, G=2 with sizes {2, 3}; outputs sentinel-filled.
struct Fixture {
  Tensor lhs = filled(DType::kF32, {6, 3});
  Tensor rhs = filled(DType::kF32, {2, 3, 4});
  Tensor gs = sizes(DType::kI32, {2, 3});
  Tensor dout = filled(DType::kF32, {6, 4});
  Tensor out = sentinel(DType::kF32, {6, 4});
  Tensor dlhs = sentinel(DType::kF32, {6, 3});
  Tensor drhs = sentinel(DType::kF32, {2, 3, 4});
  Options opt;
  Fixture() { opt.implementation = "reference"; }
  Inputs in() const { return {lhs.view(), rhs.view(), gs.view()}; }
  bool all_untouched() const { return untouched(out) && untouched(dlhs) && untouched(drhs); }
};

// Runs gmm and fused with the fixture as `change` leaves it; both must fail with kInvalidArgument
// mentioning `what`, touching nothing.
void expect_rejected(const std::function<void(Fixture&)>& change, const std::string& what) {
  Fixture f;
  change(f);
  for (int fused = 0; fused < 2; ++fused) {
    try {
      if (fused)
        forward_backward(f.in(), f.dout, f.out, f.dlhs, f.drhs, f.opt);
      else
        gmm(f.in(), f.out, f.opt);
      ADD_FAILURE() << "no error for: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << "'" << e.what() << "' lacks '" << what << "'";
    }
    EXPECT_TRUE(f.all_untouched()) << what;
  }
}

TEST(GroupedMatmulApi, BadInputsAreErrorsThatTouchNothing) {
  expect_rejected([](Fixture& f) { f.lhs = filled(DType::kI32, {6, 3}); }, "lhs must be f32, bf16 or f16");
  expect_rejected([](Fixture& f) { f.rhs = filled(DType::kBF16, {2, 3, 4}); }, "rhs must be f32 like lhs, got bf16");
  expect_rejected([](Fixture& f) { f.lhs = filled(DType::kF32, {6, 3, 1}); }, "lhs must be [M, K], got [6, 3, 1]");
  expect_rejected([](Fixture& f) { f.rhs = filled(DType::kF32, {2, 12}); }, "rhs must be [G, K=3, N], got [2, 12]");
  expect_rejected([](Fixture& f) { f.rhs = filled(DType::kF32, {2, 4, 4}); }, "rhs must be [G, K=3, N], got [2, 4, 4]");
  expect_rejected([](Fixture& f) { f.gs = sizes(DType::kF32, {2, 3}); }, "group_sizes must be int32 or int64");
  expect_rejected([](Fixture& f) { f.gs = Tensor::zeros(DType::kI32, {2, 1}); }, "group_sizes must be 1-D");
  expect_rejected([](Fixture& f) { f.gs = sizes(DType::kI64, {2, 3, 1}); }, "group_sizes has 3 entries");
  expect_rejected([](Fixture& f) { f.gs = sizes(DType::kI32, {-1, 3}); }, "is negative");
  expect_rejected([](Fixture& f) { f.gs = sizes(DType::kI64, {4, 3}); }, "sum past M=6");
  expect_rejected([](Fixture& f) { f.opt.group_offset = 2; f.gs = sizes(DType::kI32, {1, 1, 1}); }, "group_offset=2");
  expect_rejected([](Fixture& f) { f.opt.group_offset = -1; }, "group_offset=-1");
  expect_rejected([](Fixture& f) { f.out = sentinel(DType::kF32, {6, 5}); f.dlhs = sentinel(DType::kF32, {6, 3}); }, "out must be [M=6, N=4], got [6, 5]");
  expect_rejected([](Fixture& f) { f.out = sentinel(DType::kF16, {6, 4}); }, "out must be f32");
  expect_rejected([](Fixture& f) { f.lhs.data_as<float>()[5] = NAN; f.opt.check_finite = true; }, "lhs contains NaN");
  expect_rejected([](Fixture& f) { f.rhs.data_as<float>()[0] = INFINITY; f.opt.check_finite = true; }, "rhs contains NaN");
}

TEST(GroupedMatmulApi, BadGradientArgumentsAreErrorsThatTouchNothing) {
  auto fused = [](const std::function<void(Fixture&)>& change, const std::string& what) {
    Fixture f;
    change(f);
    try {
      forward_backward(f.in(), f.dout, f.out, f.dlhs, f.drhs, f.opt);
      ADD_FAILURE() << "no error for: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_TRUE(f.all_untouched()) << what;
  };
  fused([](Fixture& f) { f.dout = filled(DType::kF32, {6, 3}); }, "dout must be [M=6, N=4], got [6, 3]");
  fused([](Fixture& f) { f.dout = filled(DType::kF16, {6, 4}); }, "dout must be f32 like lhs, got f16");
  fused([](Fixture& f) { f.dlhs = sentinel(DType::kF32, {6, 4}); }, "dlhs must be [M=6, K=3], got [6, 4]");
  fused([](Fixture& f) { f.drhs = sentinel(DType::kF32, {2, 4, 3}); }, "drhs must be [G=2, K=3, N=4], got [2, 4, 3]");
  fused([](Fixture& f) { f.dout.data_as<float>()[0] = NAN; f.opt.check_finite = true; }, "dout contains NaN");
  // A transposed view is not contiguous.
  fused([](Fixture& f) { f.dout = filled(DType::kF32, {4, 6}).as_strided({6, 4}, {1, 6}); }, "dout must be contiguous");
}

// A gradient left out (an empty view; CallArgs::skip "dlhs" / "drhs") is not computed: the other
// is the both-gradients call's bits, on every host implementation, backward and fused.
TEST(GroupedMatmulApi, LeftOutGradientKeepsTheOthersBits) {
  for (const char* impl : {"reference", "cpu"}) {
    Fixture all;
    all.opt.implementation = impl;
    if (impl == std::string("cpu") && !::tessera::testing::kHaveCpuBackend) continue;
    all.opt.transpose_rhs = false;
    backward(all.in(), all.dout, all.dlhs, all.drhs, all.opt);
    for (int fused = 0; fused < 2; ++fused)
      for (int keep = 0; keep < 3; ++keep) {  // 0: dlhs only, 1: drhs only, 2: neither
        Fixture f;
        f.opt = all.opt;
        const TensorView dl = keep == 0 ? f.dlhs.view() : TensorView{}, dr = keep == 1 ? f.drhs.view() : TensorView{};
        if (fused)
          forward_backward(f.in(), f.dout, f.out, dl, dr, f.opt);
        else
          backward(f.in(), f.dout, dl, dr, f.opt);
        const auto same = [](const Tensor& a, const Tensor& b) {
          return std::memcmp(a.data(), b.data(), a.view().nbytes()) == 0;
        };
        EXPECT_EQ(same(f.dlhs, all.dlhs), keep == 0) << impl << " fused " << fused << " keep " << keep;
        EXPECT_EQ(same(f.drhs, all.drhs), keep == 1) << impl << " fused " << fused << " keep " << keep;
        EXPECT_EQ(untouched(f.dlhs), keep != 0);
        EXPECT_EQ(untouched(f.drhs), keep != 1);
      }
  }
}

TEST(GroupedMatmulApi, TgmmChecksItsOwnArguments) {
  Fixture f;
  Tensor drhs = sentinel(DType::kF32, {2, 3, 4});
  EXPECT_THROW(tgmm(f.lhs, filled(DType::kF32, {5, 4}), f.gs, drhs, f.opt), Error);
  EXPECT_THROW(tgmm(f.lhs, f.dout, sizes(DType::kI32, {2}), drhs, f.opt), Error);  // 1 entry for G=2
  EXPECT_THROW(tgmm(f.lhs, f.dout, f.gs, sentinel(DType::kF32, {2, 3}), f.opt), Error);
  EXPECT_TRUE(untouched(drhs));
  tgmm(f.lhs, f.dout, f.gs, drhs, f.opt);
  EXPECT_FALSE(untouched(drhs));
}

TEST(GroupedMatmulApi, DispatchRefusesUnknownNamesAndBadBlockSizes) {
  Fixture f;
  f.opt.implementation = "cpuu";
  try {
    gmm(f.in(), f.out, f.opt);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
  }
  EXPECT_TRUE(untouched(f.out));
  EXPECT_THROW(validate_block_sizes("nope", {}), Error);
  EXPECT_NO_THROW(validate_block_sizes("reference", {}));
}

TEST(GroupedMatmulApi, ComputeAllocatesInTheInputDtypeAndReportsTheImplementation) {
  Fixture f;
  const Result r = compute_with_grad(f.in(), f.dout, f.opt);
  EXPECT_EQ(r.out.shape(), (Shape{6, 4}));
  EXPECT_EQ(r.dlhs.shape(), (Shape{6, 3}));
  EXPECT_EQ(r.drhs.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(r.implementation, "reference");
  // Row 5 is past the sum (2 + 3): zero in out and dlhs.
  for (int64_t n = 0; n < 4; ++n) EXPECT_EQ(r.out.data_as<float>()[5 * 4 + n], 0.0f);
  for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(r.dlhs.data_as<float>()[5 * 3 + k], 0.0f);
}

TEST(GroupedMatmulApi, EmptyShapesAreFine) {
  Fixture f;
  // No rows at all; no groups at all; K = 0 (every product is an empty sum: zero).
  Tensor lhs0 = filled(DType::kF32, {0, 3}), out0 = Tensor::empty(DType::kF32, {0, 4});
  gmm({lhs0.view(), f.rhs.view(), sizes(DType::kI32, {0, 0}).view()}, out0, f.opt);
  Tensor rhs0 = filled(DType::kF32, {0, 3, 4}), out = sentinel(DType::kF32, {6, 4});
  gmm({f.lhs.view(), rhs0.view(), sizes(DType::kI32, {}).view()}, out, f.opt);
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(out.data_as<float>()[i], 0.0f);
  Tensor lhsk = filled(DType::kF32, {6, 0}), rhsk = filled(DType::kF32, {2, 0, 4});
  out = sentinel(DType::kF32, {6, 4});
  gmm({lhsk.view(), rhsk.view(), f.gs.view()}, out, f.opt);
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(out.data_as<float>()[i], 0.0f);
}

TEST(GroupedMatmulApi, TheGenericToolsSeeTheKernel) {
  const kernels::KernelSpec& k = kernels::get("grouped_matmul");
  EXPECT_EQ(k.dims, (std::vector<std::string>{"M", "K", "N", "G"}));
  EXPECT_FALSE(k.check_grid(true).empty());
  bool has_reference = false;
  for (const auto& info : implementations()) has_reference = has_reference || info.name == "reference";
  EXPECT_TRUE(has_reference);
}

}  // namespace
}  // namespace tessera::grouped_matmul
