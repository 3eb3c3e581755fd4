// What the public headers promise every caller, checked across kernels (a review of the C++ API
// as a downstream user, 2026-11-29): a required input left out is an Error naming it, never a
// segfault or a std::logic_error about an unbound dim; an unknown implementation name is refused
// also when there is nothing to compute (exec.h: "never a fallback"); a negative size is refused;
// a declared implementation that cannot load here is kUnsupported, not "unknown".
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "cpu_backend.h"
#include "tessera/attention.h"
#include "tessera/error.h"
#include "tessera/grouped_matmul.h"
#include "tessera/linear_cross_entropy.h"
#include "tessera/mla_decode.h"
#include "tessera/mlstm.h"
#include "tessera/paged_attention.h"
#include "tessera/slstm.h"

namespace tessera {
namespace {

// A zero-filled f32 buffer the views below point into (values do not matter: every call fails).
struct Buf {
  std::vector<float> v = std::vector<float>(4096, 0.0f);
  std::vector<int32_t> i = std::vector<int32_t>(64, 0);
  TensorView f(Shape s, size_t at = 0) { return TensorView(v.data() + at, DType::kF32, std::move(s)); }
  TensorView ints(Shape s, std::vector<int32_t> values) {
    std::copy(values.begin(), values.end(), i.begin() + used);
    TensorView t(i.data() + used, DType::kI32, std::move(s));
    used += values.size();
    return t;
  }
  size_t used = 0;
};

void expect_error(const std::function<void()>& call, ErrorCode code, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "accepted; wanted '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Each of these segfaulted (a null pointer reached a backend) or threw std::logic_error.
TEST(ApiContract, ARequiredInputLeftOutIsNamed) {
  Buf b;
  const auto bad = ErrorCode::kInvalidArgument;
  // mlstm: B = NH = 1, S = DK = DV = 2.
  const TensorView q = b.f({1, 1, 2, 2}), g = b.f({1, 1, 2}), h = b.f({1, 1, 2, 2}, 1024);
  expect_error([&] { mlstm::forward({q, {}, q, g, g}, h); }, bad, "k is required");
  expect_error([&] { mlstm::forward({q, q, q, g, {}}, h); }, bad, "f is required");
  expect_error([&] { mlstm::forward({{}, q, q, g, g}, h); }, bad, "q is required");
  // slstm: B = S = NH = 1, DH = 2.
  const TensorView wx = b.f({1, 1, 4, 1, 2}), r = b.f({4, 1, 2, 2}), bias = b.f({4, 1, 2});
  const slstm::Outputs so{b.f({1, 1, 1, 2}, 1024)};
  expect_error([&] { slstm::forward({wx, {}, bias}, so); }, bad, "r is required");
  expect_error([&] { slstm::forward({wx, r, {}}, so); }, bad, "b is required");
  expect_error([&] { slstm::forward({{}, r, bias}, so); }, bad, "wx is required");
  // paged_attention: one sequence of one token and one key, page size 1.
  const TensorView pq = b.f({1, 1, 2}), cache = b.f({1, 1, 1, 2}), table = b.ints({1, 1}, {0}),
                   lens = b.ints({1}, {1}), cu = b.ints({2}, {0, 1});
  const paged_attention::Outputs po{b.f({1, 1, 2}, 1024), b.f({1, 1}, 1100)};
  expect_error([&] { paged_attention::forward({pq, cache, cache, table, {}, cu}, po); }, bad, "kv_lens is required");
  expect_error([&] { paged_attention::forward({{}, cache, cache, table, lens, cu}, po); }, bad, "q is required");
  expect_error([&] { paged_attention::forward({pq, cache, cache, table, lens, {}}, po); }, bad, "cu_q_lens is required");
  // mla_decode: B = Sq = Hq = 1, D = 4, dv = 2.
  const TensorView mq = b.f({1, 1, 1, 4}), kv = b.f({1, 1, 1, 4});
  mla_decode::Options mo;
  mo.dv = 2;
  const mla_decode::Outputs mout{b.f({1, 1, 1, 2}, 1024), b.f({1, 1, 1}, 1100)};
  expect_error([&] { mla_decode::forward({mq, kv, table, {}}, mout, mo); }, bad, "cache_seqlens is required");
  expect_error([&] { mla_decode::forward({{}, kv, table, lens}, mout, mo); }, bad, "q is required");
  expect_error([&] { mla_decode::forward({mq, kv, {}, lens}, mout, mo); }, bad, "page_table is required");
  // grouped_matmul: M = K = N = 2, one group.
  const TensorView lhs = b.f({2, 2}), rhs = b.f({1, 2, 2}), sizes = b.ints({1}, {2}), out = b.f({2, 2}, 1024);
  expect_error([&] { grouped_matmul::gmm({{}, rhs, sizes}, out); }, bad, "lhs is required");
  expect_error([&] { grouped_matmul::gmm({lhs, rhs, {}}, out); }, bad, "group_sizes is required");
  expect_error([&] { grouped_matmul::tgmm(lhs, lhs, sizes, {}); }, bad, "drhs is required");
}

// exec.h: "A name that is not registered is an error, never a fallback" — the calls with nothing
// to compute returned "(empty)" before the names were looked at.
TEST(ApiContract, AnUnknownImplementationIsRefusedWhenNothingRuns) {
  Buf b;
  attention::Options ao;
  ao.implementation = "nope";
  expect_error([&] { attention::forward({b.f({1, 0, 1, 2}), b.f({1, 3, 1, 2}), b.f({1, 3, 1, 2})},
                                        {b.f({1, 0, 1, 2}, 1024), b.f({1, 1, 0}, 1100)}, ao); },
               ErrorCode::kNotFound, "unknown implementation 'nope'");
  linear_cross_entropy::Options lo;
  lo.implementation = "nope";
  Tensor labels = Tensor::empty(DType::kI64, {0});
  expect_error([&] { linear_cross_entropy::forward({b.f({0, 4}), b.f({5, 4}), std::nullopt, labels.view(), std::nullopt},
                                                   {b.f({}, 1024), b.f({0}, 1100), std::nullopt}, lo); },
               ErrorCode::kNotFound, "unknown implementation 'nope'");
  paged_attention::Options po;
  po.implementation = "nope";
  expect_error([&] { paged_attention::forward({b.f({0, 1, 2}), b.f({1, 1, 1, 2}), b.f({1, 1, 1, 2}), b.ints({1, 1}, {0}),
                                               b.ints({1}, {1}), b.ints({2}, {0, 0})},
                                              {b.f({0, 1, 2}, 1024), b.f({0, 1}, 1100)}, po); },
               ErrorCode::kNotFound, "unknown implementation 'nope'");
  mla_decode::Options mo;
  mo.implementation = "nope";
  mo.dv = 2;
  expect_error([&] { mla_decode::forward({b.f({0, 1, 1, 4}), b.f({1, 1, 1, 4}), b.ints({0, 1}, {}), b.ints({0}, {})},
                                         {b.f({0, 1, 1, 2}, 1024), b.f({0, 1, 1}, 1100)}, mo); },
               ErrorCode::kNotFound, "unknown implementation 'nope'");
}

// Block sizes a call gives are checked by the implementation that would run also when the call
// is empty (nothing runs): they passed on an empty batch and failed on the next (a review,
// 2026-11-29). For each implementation an empty call refuses exactly what a one-row call refuses
// (the reference ignores block sizes: both accept), and an empty call that refuses writes nothing.
bool refuses(const std::function<void()>& call) {
  try {
    call();
    return false;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("block sizes"), std::string::npos) << e.what();
    return true;
  }
}

TEST(ApiContract, BlockSizesAreCheckedWhenNothingRuns) {
  Buf b;
  Tensor labels1 = Tensor::zeros(DType::kI64, {1}), labels0 = Tensor::empty(DType::kI64, {0});
  int refused = 0;
  for (const char* impl : {"", "cpu", "reference"}) {
    if (std::string(impl) == "cpu" && !testing::kHaveCpuBackend) continue;
    SCOPED_TRACE(std::string("implementation '") + impl + "'");
    linear_cross_entropy::Options lo;
    lo.implementation = impl;
    lo.block_sizes = linear_cross_entropy::BlockSizes{0, 0, 0};
    const auto lce = [&](int64_t B, const Tensor& labels) {
      return [&, B] { linear_cross_entropy::forward({b.f({B, 4}), b.f({5, 4}), std::nullopt, labels.view(), std::nullopt},
                                                    {b.f({}, 1024), b.f({B}, 1100), std::nullopt}, lo); };
    };
    b.v[1024] = 7.0f;
    const bool lce_refused = refuses(lce(1, labels1));
    b.v[1024] = 7.0f;
    EXPECT_EQ(refuses(lce(0, labels0)), lce_refused);
    if (lce_refused) EXPECT_EQ(b.v[1024], 7.0f) << "the empty call wrote its loss before the error";
    attention::Options ao;
    ao.implementation = impl;
    ao.block_sizes = attention::BlockSizes{0, 0};
    const auto att = [&](int64_t Sq) {
      return [&, Sq] { attention::forward({b.f({1, Sq, 1, 2}), b.f({1, 3, 1, 2}), b.f({1, 3, 1, 2})},
                                          {b.f({1, Sq, 1, 2}, 1024), b.f({1, 1, Sq}, 1100)}, ao); };
    };
    const bool att_refused = refuses(att(1));
    EXPECT_EQ(refuses(att(0)), att_refused);
    refused += lce_refused + att_refused;
  }
  EXPECT_GE(refused, 2);  // the default implementation refuses block sizes of 0 in both kernels
}

TEST(ApiContract, ANegativeSizeIsRefused) {
  Buf b;
  Tensor labels = Tensor::empty(DType::kI64, {1});
  linear_cross_entropy::Options lo;
  lo.implementation = "reference";  // it ran on the reference; cpu blamed its block sizes
  expect_error([&] { linear_cross_entropy::forward({TensorView(b.v.data(), DType::kF32, {-1, 4}, {4, 1}), b.f({5, 4}),
                                                    std::nullopt, TensorView(labels.data(), DType::kI64, {-1}, {1}),
                                                    std::nullopt},
                                                   {b.f({}, 1024), b.f({1}, 1100), std::nullopt}, lo); },
               ErrorCode::kInvalidArgument, "x has a negative size");
  expect_error([&] { grouped_matmul::gmm({TensorView(b.v.data(), DType::kF32, {-2, 2}, {2, 1}), b.f({1, 2, 2}),
                                          b.ints({1}, {0})}, b.f({2, 2}, 1024)); },
               ErrorCode::kInvalidArgument, "lhs has a negative size");
}

// Declared (listed by implementations()) but unable to load here: why, not "unknown".
TEST(ApiContract, AnImplementationThatCannotLoadHereIsUnsupported) {
  bool cuda_listed = false, cuda_available = false;
  for (const ImplementationInfo& i : attention::implementations())
    if (i.name == "cuda") cuda_listed = true, cuda_available = i.available;
  if (!cuda_listed || cuda_available) GTEST_SKIP() << "the cuda implementation loads here (or is not declared)";
  expect_error([] { attention::validate_block_sizes("cuda", {}); }, ErrorCode::kUnsupported, "is not available here");
  expect_error([] { attention::validate_block_sizes("nope", {}); }, ErrorCode::kNotFound, "unknown implementation 'nope'");
}

}  // namespace
}  // namespace tessera
