// An output that shares memory with an input, an upstream gradient or another output is refused
// before anything runs, in every kernel (mlstm, slstm and mla_decode have their own tests): a
// backend reads its inputs after it has written outputs (a dx over x, an o inside the KV cache
// that later rows read), and an autotune sweep writes the outputs before the call it keeps. The
// message names both tensors; nothing is written. Apart, the same buffers run.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tessera/attention.h"
#include "tessera/error.h"
#include "tessera/grouped_matmul.h"
#include "tessera/linear_cross_entropy.h"
#include "tessera/paged_attention.h"

namespace tessera {
namespace {

// f32 values 0.01·(i % 17) − 0.08, so nothing is NaN and the rows differ.
std::vector<float> filled(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.01f * float(i % 17) - 0.08f;
  return v;
}

TensorView f32(std::vector<float>& v, Shape s, size_t offset = 0) { return TensorView(v.data() + offset, DType::kF32, std::move(s)); }

// `call` throws kInvalidArgument naming `needle`, and every buffer in `watched` keeps its bytes.
void expect_refused(const std::function<void()>& call, const std::string& needle,
                    const std::vector<std::vector<float>*>& watched) {
  std::vector<std::vector<float>> before;
  for (auto* w : watched) before.push_back(*w);
  try {
    call();
    ADD_FAILURE() << "accepted; wanted '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  for (size_t i = 0; i < watched.size(); ++i)
    EXPECT_EQ(std::memcmp(before[i].data(), watched[i]->data(), before[i].size() * sizeof(float)), 0)
        << needle << ": buffer " << i << " was written";
}

TEST(OutputsApart, Attention) {
  // q, k, v [1, 4, 1, 8]; o like q.
  std::vector<float> q = filled(32), k = filled(32), v = filled(32), o(32, -7.f), lse(4, -7.f), g = filled(32);
  std::vector<float> dq(32, -7.f), dk(32, -7.f), dv(32, -7.f);
  const attention::Inputs in{f32(q, {1, 4, 1, 8}), f32(k, {1, 4, 1, 8}), f32(v, {1, 4, 1, 8})};
  attention::Options opt;
  opt.implementation = "reference";
  const auto fwd = [&](TensorView oo, TensorView ll) { attention::forward(in, {oo, ll}, opt); };
  expect_refused([&] { fwd(f32(q, {1, 4, 1, 8}), f32(lse, {1, 1, 4})); }, "o shares memory with q", {&q, &lse});
  expect_refused([&] { fwd(f32(o, {1, 4, 1, 8}), f32(o, {1, 1, 4}, 8)); }, "o shares memory with lse", {&o});
  fwd(f32(o, {1, 4, 1, 8}), f32(lse, {1, 1, 4}));
  const attention::BackwardInputs saved{f32(o, {1, 4, 1, 8}), f32(lse, {1, 1, 4}), f32(g, {1, 4, 1, 8})};
  expect_refused([&] { attention::backward(in, saved, {f32(g, {1, 4, 1, 8}), f32(dk, {1, 4, 1, 8}), f32(dv, {1, 4, 1, 8})}, opt); },
                 "dq shares memory with grad_o", {&g, &dk, &dv});
  expect_refused([&] { attention::backward(in, saved, {f32(dq, {1, 4, 1, 8}), f32(k, {1, 4, 1, 8}), f32(dv, {1, 4, 1, 8})}, opt); },
                 "dk shares memory with k", {&dq, &k, &dv});
  expect_refused([&] {
    attention::forward_backward(in, f32(g, {1, 4, 1, 8}), {f32(o, {1, 4, 1, 8}), f32(lse, {1, 1, 4})},
                                {f32(dq, {1, 4, 1, 8}), f32(o, {1, 4, 1, 8}), f32(dv, {1, 4, 1, 8})}, opt);
  }, "o shares memory with dk", {&dq, &dv});
  attention::backward(in, saved, {f32(dq, {1, 4, 1, 8}), f32(dk, {1, 4, 1, 8}), f32(dv, {1, 4, 1, 8})}, opt);
  EXPECT_NE(dq[0], -7.f);
}

TEST(OutputsApart, PagedAttention) {
  // One sequence, one decode row, two keys on one page of 2: q [1, 1, 8], caches [1, 2, 1, 8].
  std::vector<float> q = filled(8), kc = filled(16), vc = filled(16), o(8, -7.f), lse(1, -7.f);
  std::vector<int32_t> table = {0}, lens = {2}, cu = {0, 1};
  const paged_attention::Inputs in{f32(q, {1, 1, 8}), f32(kc, {1, 2, 1, 8}), f32(vc, {1, 2, 1, 8}),
                                   TensorView(table.data(), DType::kI32, {1, 1}),
                                   TensorView(lens.data(), DType::kI32, {1}), TensorView(cu.data(), DType::kI32, {2})};
  paged_attention::Options opt;
  opt.implementation = "reference";
  expect_refused([&] { paged_attention::forward(in, {f32(vc, {1, 1, 8}, 8), f32(lse, {1, 1})}, opt); },
                 "o shares memory with v_cache", {&vc, &lse});
  expect_refused([&] { paged_attention::forward(in, {f32(o, {1, 1, 8}), f32(o, {1, 1}, 3)}, opt); },
                 "o shares memory with lse", {&o});
  paged_attention::forward(in, {f32(o, {1, 1, 8}), f32(lse, {1, 1})}, opt);
  EXPECT_NE(o[0], -7.f);
}

TEST(OutputsApart, GroupedMatmul) {
  // lhs [4, 3] (in a buffer of 18, so a drhs-shaped view of it stays in bounds), rhs [2, 3, 3],
  // two groups of 2 rows: out [4, 3] could sit on lhs.
  std::vector<float> lhs = filled(18), rhs = filled(18), out(12, -7.f), dout = filled(12), dlhs(12, -7.f),
                     drhs(18, -7.f);
  std::vector<int32_t> sizes = {2, 2};
  const grouped_matmul::Inputs in{f32(lhs, {4, 3}), f32(rhs, {2, 3, 3}), TensorView(sizes.data(), DType::kI32, {2})};
  grouped_matmul::Options opt;
  opt.implementation = "reference";
  expect_refused([&] { grouped_matmul::gmm(in, f32(lhs, {4, 3}), opt); }, "out shares memory with lhs", {&lhs});
  expect_refused([&] { grouped_matmul::backward(in, f32(dout, {4, 3}), f32(dout, {4, 3}), f32(drhs, {2, 3, 3}), opt); },
                 "dlhs shares memory with dout", {&dout, &drhs});
  expect_refused([&] { grouped_matmul::tgmm(in.lhs, f32(dout, {4, 3}), in.group_sizes, f32(lhs, {2, 3, 3}), opt); },
                 "drhs shares memory with lhs", {&lhs});
  expect_refused([&] {
    grouped_matmul::forward_backward(in, f32(dout, {4, 3}), f32(out, {4, 3}), f32(out, {4, 3}), f32(drhs, {2, 3, 3}), opt);
  }, "out shares memory with dlhs", {&out, &drhs});
  grouped_matmul::backward(in, f32(dout, {4, 3}), f32(dlhs, {4, 3}), f32(drhs, {2, 3, 3}), opt);
  EXPECT_NE(dlhs[0], -7.f);
}

TEST(OutputsApart, LinearCrossEntropy) {
  // x [3, 4], w [4, 5] (hv), labels [3]; dx like x.
  std::vector<float> x = filled(12), w = filled(20), loss(1, -7.f), lse(3, -7.f), g = {1.f}, dx(12, -7.f),
                     dw(20, -7.f);
  std::vector<int64_t> labels = {0, 4, 2};
  const linear_cross_entropy::Inputs in{f32(x, {3, 4}), f32(w, {4, 5}), std::nullopt,
                                        TensorView(labels.data(), DType::kI64, {3}), std::nullopt};
  linear_cross_entropy::Options opt;
  opt.implementation = "reference";
  opt.w_layout = linear_cross_entropy::WLayout::kHV;
  expect_refused([&] { linear_cross_entropy::forward(in, {f32(lse, {}, 1), f32(lse, {3}), std::nullopt}, opt); },
                 "loss shares memory with lse", {&lse});
  expect_refused([&] { linear_cross_entropy::backward(in, f32(g, {}), {f32(x, {3, 4}), f32(dw, {4, 5}), std::nullopt}, opt); },
                 "dx shares memory with x", {&x, &dw});
  expect_refused([&] { linear_cross_entropy::backward(in, f32(g, {}), {f32(dx, {3, 4}), f32(w, {4, 5}), std::nullopt}, opt); },
                 "dw shares memory with w", {&dx, &w});
  expect_refused([&] {
    linear_cross_entropy::forward_backward(in, f32(g, {}), {f32(loss, {}), f32(dx, {3}), std::nullopt},
                                           {f32(dx, {3, 4}), f32(dw, {4, 5}), std::nullopt}, opt);
  }, "lse shares memory with dx", {&loss, &dx, &dw});
  linear_cross_entropy::forward_backward(in, f32(g, {}), {f32(loss, {}), f32(lse, {3}), std::nullopt},
                                         {f32(dx, {3, 4}), f32(dw, {4, 5}), std::nullopt}, opt);
  EXPECT_NE(dx[0], -7.f);
}

}  // namespace
}  // namespace tessera
