// paged_attention: the reference against values worked out by hand (one kv head of head dim 1,
// keys on shuffled pages of one slot, a NaN page nobody references).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/paged_attention.h"

namespace tessera {
namespace {

using paged_attention::Options;

// Position 0: k = 1, v = 2 (page 1); position 1: k = 0, v = 4 (page 0); page 2 is NaN.
struct Hand {
  std::vector<float> k{0.0f, 1.0f, NAN}, v{4.0f, 2.0f, NAN};
  std::vector<int32_t> pt{1, 0}, kv{2}, cu;
  std::vector<float> q, sinks;
  int64_t Hq = 1;
  // rows: the query rows (q_len); q holds rows × Hq values.
  std::pair<std::vector<float>, std::vector<float>> run(Options opt, bool with_sinks = false) {
    const int64_t T = static_cast<int64_t>(q.size()) / Hq;
    cu = {0, static_cast<int32_t>(T)};
    std::vector<float> o(static_cast<size_t>(T * Hq), -9.0f), lse(static_cast<size_t>(T * Hq), -9.0f);
    paged_attention::Inputs in{TensorView(q.data(), DType::kF32, {T, Hq, 1}),
                               TensorView(k.data(), DType::kF32, {3, 1, 1, 1}),
                               TensorView(v.data(), DType::kF32, {3, 1, 1, 1}),
                               TensorView(pt.data(), DType::kI32, {1, 2}),
                               TensorView(kv.data(), DType::kI32, {1}),
                               TensorView(cu.data(), DType::kI32, {2}),
                               {}};
    if (with_sinks) in.sinks = TensorView(sinks.data(), DType::kF32, {Hq});
    opt.implementation = "reference";
    opt.scale = 1.0;
    paged_attention::forward(in, {TensorView(o.data(), DType::kF32, {T, Hq, 1}), TensorView(lse.data(), DType::kF32, {T, Hq})},
                             opt);
    return {o, lse};
  }
};

const double e = std::exp(1.0);

TEST(PagedAttentionReference, DecodeRowSeesBothKeys) {
  Hand h;
  h.q = {1.0f};  // logits 1 (v = 2) and 0 (v = 4)
  auto [o, lse] = h.run(Options{});
  EXPECT_NEAR(o[0], (2 * e + 4) / (e + 1), 1e-6);
  EXPECT_NEAR(lse[0], std::log(e + 1), 1e-6);
  Options c;
  c.causal = true;  // the decode row is at position 1: it sees both
  auto [oc, lc] = h.run(c);
  EXPECT_EQ(oc[0], o[0]);
}

// An f8e4m3 cache: Hand's keys and values as raw codes times k_scale 1/4 and v_scale 4 (k raw 4
// and 0, v raw 0.5 and 1; the NaN page 0x7f). Every host implementation, q in f32 and bf16.
TEST(PagedAttentionReference, F8CacheIsDequantizedByItsScales) {
  std::vector<uint8_t> k{0x00, 0x48, 0x7f}, v{0x38, 0x30, 0x7f};  // 0, 4, NaN; 1, 0.5, NaN
  std::vector<int32_t> pt{1, 0}, kv{2}, cu{0, 1};
  const float q1 = 1.0f;
  const uint16_t q1_bf16 = f32_to_bf16(1.0f);
  for (const char* impl : {"reference", "cpu"})
    for (bool bf16 : {false, true}) {
      const auto run = [&](double k_scale, double v_scale) {
        float o = -9.0f, lse = -9.0f;
        const paged_attention::Inputs in{
            bf16 ? TensorView(const_cast<uint16_t*>(&q1_bf16), DType::kBF16, {1, 1, 1})
                 : TensorView(const_cast<float*>(&q1), DType::kF32, {1, 1, 1}),
            TensorView(k.data(), DType::kF8E4M3, {3, 1, 1, 1}), TensorView(v.data(), DType::kF8E4M3, {3, 1, 1, 1}),
            TensorView(pt.data(), DType::kI32, {1, 2}), TensorView(kv.data(), DType::kI32, {1}),
            TensorView(cu.data(), DType::kI32, {2}), {}};
        Options opt;
        opt.implementation = impl, opt.scale = 1.0, opt.k_scale = k_scale, opt.v_scale = v_scale;
        paged_attention::forward(in, {TensorView(&o, DType::kF32, {1, 1, 1}), TensorView(&lse, DType::kF32, {1, 1})}, opt);
        return std::pair<double, double>{o, lse};
      };
      const auto [o, lse] = run(0.25, 4.0);  // logits 1 (v 2) and 0 (v 4)
      EXPECT_NEAR(o, (2 * e + 4) / (e + 1), 1e-6) << impl << " bf16 " << bf16;
      EXPECT_NEAR(lse, std::log(e + 1), 1e-6) << impl;
      const auto [o1, lse1] = run(1.0, 1.0);  // raw: logits 4 (v 0.5) and 0 (v 1)
      const double e4 = std::exp(4.0);
      EXPECT_NEAR(o1, (0.5 * e4 + 1) / (e4 + 1), 1e-6) << impl;
      EXPECT_NEAR(lse1, std::log(e4 + 1), 1e-6) << impl;
    }
}

TEST(PagedAttentionReference, SinkIsAnExtraLogitWithoutValue) {
  Hand h;
  h.q = {1.0f};
  h.sinks = {0.0f};
  auto [o, lse] = h.run(Options{}, true);
  EXPECT_NEAR(o[0], (2 * e + 4) / (e + 2), 1e-6);  // = 2
  EXPECT_NEAR(lse[0], std::log(e + 2), 1e-6);
  h.sinks = {-std::numeric_limits<float>::infinity()};  // takes nothing
  auto [o2, l2] = h.run(Options{}, true);
  EXPECT_NEAR(o2[0], (2 * e + 4) / (e + 1), 1e-6);
  EXPECT_NEAR(l2[0], std::log(e + 1), 1e-6);
}

TEST(PagedAttentionReference, CausalPrefillAndWindow) {
  Hand h;
  h.q = {1.0f, 1.0f};  // q_len 2 = kv_len: positions 0 and 1
  Options c;
  c.causal = true;
  auto [o, lse] = h.run(c);
  EXPECT_NEAR(o[0], 2.0, 1e-6);  // position 0 sees key 0 only
  EXPECT_NEAR(lse[0], 1.0, 1e-6);
  EXPECT_NEAR(o[1], (2 * e + 4) / (e + 1), 1e-6);
  c.window = 0;  // each sees only its own position
  auto [ow, lw] = h.run(c);
  EXPECT_NEAR(ow[0], 2.0, 1e-6);
  EXPECT_NEAR(ow[1], 4.0, 1e-6);
  EXPECT_NEAR(lw[1], 0.0, 1e-6);
  Options nc;
  nc.window = 0;  // without causal the window bounds only the left: row 0 sees both keys
  auto [on, ln] = h.run(nc);
  EXPECT_NEAR(on[0], (2 * e + 4) / (e + 1), 1e-6);
  EXPECT_NEAR(on[1], 4.0, 1e-6);
}

TEST(PagedAttentionReference, SoftcapAndGqa) {
  Hand h;
  h.q = {2.0f, -1.0f};  // one row, two query heads on the one kv head
  h.Hq = 2;
  Options c;
  c.softcap = 0.5;
  auto [o, lse] = h.run(c);
  const double x0 = 0.5 * std::tanh(2.0 / 0.5), x1 = 0.5 * std::tanh(-1.0 / 0.5);  // key 1's logit is 0
  EXPECT_NEAR(o[0], (2 * std::exp(x0) + 4) / (std::exp(x0) + 1), 1e-6);
  EXPECT_NEAR(lse[0], std::log(std::exp(x0) + 1), 1e-6);
  EXPECT_NEAR(o[1], (2 * std::exp(x1) + 4) / (std::exp(x1) + 1), 1e-6);
  EXPECT_NEAR(lse[1], std::log(std::exp(x1) + 1), 1e-6);
}

}  // namespace
}  // namespace tessera
