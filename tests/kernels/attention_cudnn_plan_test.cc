// attention, cudnn backend: the host arithmetic of cudnn_plan.h (no GPU, no cuDNN needed) — which
// problems go to cuDNN and the reason for the others, the [B, S, H, D] descriptors, the diagonal
// band against the contract's mask rule (Problem::allowed) on every (i, j), the plan key — and the
// registry: cudnn is declared ahead of cuda.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "kernels/attention/cudnn_plan.h"
#include "kernels/attention/impl.h"

namespace att = tessera::attention;
namespace cp = tessera::attention::cudnn_plan;
using tessera::DType;

namespace {

alignas(16) const unsigned char kBuf[64] = {};

att::Problem dense(int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv) {
  att::Problem p;
  p.N = B, p.Sq = Sq, p.Sk = Sk, p.total_q = B * Sq, p.total_k = B * Sk;
  p.Hq = Hq, p.Hkv = Hkv, p.D = D, p.Dv = Dv;
  p.dtype = DType::kBF16;
  p.device = tessera::Device::cuda();
  p.q = p.k = p.v = kBuf;
  p.scale = 0.125;
  return p;
}

// Where cuDNN keeps key j of row i under a band (the rule documented in cudnn_plan.h, the one
// cuDNN's frontend builds: j + left > i + off and j <= i + off + right, off = Sk - Sq).
bool band_keeps(const cp::Band& b, int64_t Sq, int64_t Sk, int64_t i, int64_t j) {
  const int64_t c = i + Sk - Sq;
  if (b.left && !(j + *b.left > c)) return false;
  if (b.right && !(j <= c + *b.right)) return false;
  return true;
}

}  // namespace

TEST(AttentionCudnnPlan, DenseBf16CausalGqaIsSupported) {
  att::Problem p = dense(2, 128, 256, 8, 2, 128, 128);
  p.causal = true;
  EXPECT_EQ(cp::unsupported_reason(p), "");
  p.dtype = DType::kF16;
  EXPECT_EQ(cp::unsupported_reason(p), "");
  p.D = p.Dv = 256;  // head dims up to 256
  EXPECT_EQ(cp::unsupported_reason(p), "");
}

TEST(AttentionCudnnPlan, EachUnsupportedOptionSaysWhy) {
  const auto reason = [](auto&& edit) {
    att::Problem p = dense(1, 64, 64, 4, 4, 64, 64);
    edit(p);
    return cp::unsupported_reason(p);
  };
  const int32_t cu[2] = {0, 64};
  const float slopes[4] = {};
  const int32_t seg[64] = {};
  EXPECT_NE(reason([](att::Problem& p) { p.dtype = DType::kF32; }).find("f16 or bf16"), std::string::npos);
  EXPECT_NE(reason([&](att::Problem& p) { p.varlen = true, p.cu_q = p.cu_k = cu; }).find("varlen"), std::string::npos);
  EXPECT_NE(reason([&](att::Problem& p) { p.alibi = slopes; }).find("ALiBi"), std::string::npos);
  EXPECT_NE(reason([&](att::Problem& p) { p.seg_q = p.seg_k = seg; }).find("segment"), std::string::npos);
  EXPECT_NE(reason([](att::Problem& p) { p.softcap = 30.0; }).find("softcap"), std::string::npos);
  EXPECT_NE(reason([&](att::Problem& p) { p.dropout_p = 0.1, p.dropout_seed = seg; }).find("dropout"), std::string::npos);
  EXPECT_NE(reason([&](att::Problem& p) { p.bias = seg; }).find("bias"), std::string::npos);
  EXPECT_NE(reason([](att::Problem& p) { p.D = p.Dv = 60; }).find("multiples of 8"), std::string::npos);
  EXPECT_NE(reason([](att::Problem& p) { p.D = p.Dv = 264; }).find("up to 256"), std::string::npos);
  EXPECT_NE(reason([](att::Problem& p) { p.D = 256, p.Dv = 264; }).find("up to 256"), std::string::npos);
  EXPECT_EQ(reason([](att::Problem& p) { p.D = 192, p.Dv = 128; }), "");
  EXPECT_NE(reason([](att::Problem& p) { p.Sq = 100, p.causal = true; }).find("Sq <= Sk"), std::string::npos);
  EXPECT_NE(reason([](att::Problem& p) { p.q = kBuf + 2; }).find("16-byte aligned"), std::string::npos);
  // Sq > Sk with no mask at all is fine (every row sees every key).
  EXPECT_EQ(reason([](att::Problem& p) { p.Sq = 100; }), "");
}

TEST(AttentionCudnnPlan, OutputsMustBeInTheInputsDtype) {
  EXPECT_EQ(cp::unsupported_outputs(DType::kBF16, {DType::kBF16, DType::kBF16}), "");
  EXPECT_NE(cp::unsupported_outputs(DType::kBF16, {DType::kBF16, DType::kF32}).find("f32"), std::string::npos);
}

TEST(AttentionCudnnPlan, LayoutsOfBshdAndStats) {
  const cp::Layout q = cp::bshd(2, 5, 3, 8);  // element (b, s, h, d) at ((b·5 + s)·3 + h)·8 + d
  EXPECT_EQ(q.dim, (std::array<int64_t, 4>{2, 3, 5, 8}));
  EXPECT_EQ(q.stride, (std::array<int64_t, 4>{120, 8, 24, 1}));
  const cp::Layout l = cp::stats(2, 3, 5);  // lse (b, h, s) at (b·3 + h)·5 + s
  EXPECT_EQ(l.dim, (std::array<int64_t, 4>{2, 3, 5, 1}));
  EXPECT_EQ(l.stride, (std::array<int64_t, 4>{15, 5, 1, 1}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 5; ++s)
      for (int64_t h = 0; h < 3; ++h) {
        EXPECT_EQ(b * q.stride[0] + h * q.stride[1] + s * q.stride[2], ((b * 5 + s) * 3 + h) * 8);
        att::Problem p = dense(2, 5, 5, 3, 3, 8, 8);
        EXPECT_EQ(b * l.stride[0] + h * l.stride[1] + s * l.stride[2], p.lse_index(b, h, s));
      }
}

// The band keeps exactly the keys the contract allows, for causal, windows on either side and
// their mixes, with Sq == Sk and Sq < Sk (bottom-right), and bounds that are no-ops are dropped.
TEST(AttentionCudnnPlan, BandMatchesTheContractOnEveryKey) {
  struct Case {
    int64_t Sq, Sk;
    bool causal;
    int64_t wl, wr;
  };
  const std::vector<Case> cases = {
      {7, 7, true, -1, -1},  {5, 9, true, -1, -1}, {5, 9, false, 2, -1}, {5, 9, false, -1, 1}, {6, 9, false, 3, 2},
      {6, 9, true, 3, -1},   {6, 9, true, 0, 4},   {1, 9, true, -1, -1}, {4, 4, false, 0, 0},  {3, 9, false, 100, 100},
      {9, 9, false, -1, -1}, {2, 9, true, 8, -1},  {2, 9, true, 7, -1},
  };
  for (const Case& c : cases) {
    att::Problem p = dense(1, c.Sq, c.Sk, 1, 1, 8, 8);
    p.causal = c.causal, p.window_left = c.wl, p.window_right = c.wr;
    const cp::Band b = cp::band_of(p);
    for (int64_t i = 0; i < c.Sq; ++i)
      for (int64_t j = 0; j < c.Sk; ++j)
        EXPECT_EQ(band_keeps(b, c.Sq, c.Sk, i, j), p.allowed(0, i, j))
            << "Sq=" << c.Sq << " Sk=" << c.Sk << " causal=" << c.causal << " wl=" << c.wl << " wr=" << c.wr
            << " i=" << i << " j=" << j;
  }
}

TEST(AttentionCudnnPlan, BandBoundsAndDroppedNoOps) {
  att::Problem p = dense(1, 64, 64, 1, 1, 8, 8);
  p.causal = true, p.window_left = 10;
  cp::Band b = cp::band_of(p);
  ASSERT_TRUE(b.left && b.right);
  EXPECT_EQ(*b.left, 11);  // 10 keys left of the diagonal plus the diagonal
  EXPECT_EQ(*b.right, 0);
  p.causal = false, p.window_left = -1, p.window_right = 5;
  b = cp::band_of(p);
  EXPECT_FALSE(b.left);
  EXPECT_EQ(b.right.value_or(-1), 5);
  // Decode (one query row at the bottom): causal keeps every key, so no mask is built.
  p = dense(1, 1, 512, 1, 1, 8, 8);
  p.causal = true;
  b = cp::band_of(p);
  EXPECT_FALSE(b.left || b.right);
  // A window at least as wide as the keys is no mask either.
  p.causal = false, p.window_left = 512;
  EXPECT_FALSE(cp::band_of(p).left);
  p.window_left = 511;  // row 0 (diagonal at key 511) sees key 0: still no mask
  EXPECT_FALSE(cp::band_of(p).left);
  p.window_left = 510;
  EXPECT_EQ(cp::band_of(p).left.value_or(-1), 511);
}

TEST(AttentionCudnnPlan, PlanKeyDistinguishesWhatTheGraphDependsOn) {
  att::Problem p = dense(2, 128, 128, 8, 2, 64, 64);
  p.causal = true;
  const cp::PlanKey k = cp::plan_key(p, cp::Pass::kForward);
  EXPECT_EQ(k.B, 2);
  EXPECT_EQ(k.left, -1);
  EXPECT_EQ(k.right, 0);
  EXPECT_FLOAT_EQ(k.scale(), 0.125f);
  EXPECT_EQ(k, cp::plan_key(p, cp::Pass::kForward));
  EXPECT_NE(k.str().find("fwd cuda:0 bf16 B=2 Sq=128 Sk=128 Hq=8 Hkv=2 D=64 Dv=64"), std::string::npos) << k.str();

  std::vector<cp::PlanKey> keys{k};
  auto vary = [&](auto&& edit) {
    att::Problem q = p;
    edit(q);
    keys.push_back(cp::plan_key(q, cp::Pass::kForward));
  };
  keys.push_back(cp::plan_key(p, cp::Pass::kBackward));
  {  // the backward's engine choice is part of its plan; the forward has none
    att::Problem q = p;
    q.deterministic = false;
    keys.push_back(cp::plan_key(q, cp::Pass::kBackward));
    EXPECT_TRUE(cp::plan_key(p, cp::Pass::kBackward).deterministic);
    EXPECT_FALSE(keys.back().deterministic);
    EXPECT_EQ(cp::plan_key(q, cp::Pass::kForward), k);
  }
  vary([](att::Problem& q) { q.device = tessera::Device::cuda(1); });
  vary([](att::Problem& q) { q.dtype = DType::kF16; });
  vary([](att::Problem& q) { q.N = 3; });
  vary([](att::Problem& q) { q.Sq = 64; });
  vary([](att::Problem& q) { q.Sk = 256; });
  vary([](att::Problem& q) { q.Hq = 16; });
  vary([](att::Problem& q) { q.Hkv = 8; });
  vary([](att::Problem& q) { q.D = 128; });
  vary([](att::Problem& q) { q.Dv = 128; });
  vary([](att::Problem& q) { q.scale = 0.1; });
  vary([](att::Problem& q) { q.causal = false; });
  vary([](att::Problem& q) { q.window_left = 16; });
  std::unordered_set<size_t> hashes;
  for (size_t a = 0; a < keys.size(); ++a) {
    hashes.insert(cp::PlanKeyHash{}(keys[a]));
    for (size_t b = a + 1; b < keys.size(); ++b) EXPECT_FALSE(keys[a] == keys[b]) << a << " vs " << b;
  }
  EXPECT_EQ(hashes.size(), keys.size());
  // Pointers and streams are not part of a plan: the same shape reuses it.
  att::Problem other = p;
  other.q = other.k = other.v = kBuf + 16;
  other.stream = reinterpret_cast<void*>(0x10);
  EXPECT_EQ(cp::plan_key(other, cp::Pass::kForward), k);
}

// cudnn is declared (from the CUDA module) ahead of cuda, on every build.
TEST(AttentionCudnnPlan, RegisteredAheadOfCuda) {
  const std::vector<att::ImplementationInfo> infos = att::implementations();
  const auto at = [&](const std::string& n) {
    return std::find_if(infos.begin(), infos.end(), [&](const auto& i) { return i.name == n; }) - infos.begin();
  };
  ASSERT_LT(at("cudnn"), static_cast<ptrdiff_t>(infos.size()));
  ASSERT_LT(at("cuda"), static_cast<ptrdiff_t>(infos.size()));
  EXPECT_LT(at("cudnn"), at("cuda"));
  EXPECT_EQ(infos[static_cast<size_t>(at("cudnn"))].device, tessera::DeviceType::kCUDA);
}
