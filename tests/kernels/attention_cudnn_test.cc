// attention: the cudnn backend (cuDNN's fused flash attention) against the reference (host
// copies): every pass over the options it takes (causal, bottom-right with Sq < Sk, windows, GQA,
// unequal head dims, both dtypes); outputs in f32 (run by cuda through the backend's fallback);
// what it refuses goes to cuda in the default order and is named when asked for; a user stream.
// Compiled with the CUDA backend; every GPU test skips without a device or without cuDNN.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/log.h"
#include "kernels/attention/testing.h"
#include "kernels/cuda_test_util.h"
#include "tessera/attention.h"
#include "tessera/error.h"

namespace att = tessera::attention;
namespace at = tessera::attention::testing;
using tessera::Device;
using tessera::DType;
using tessera::Pass;
using tessera::Tensor;

namespace {

const std::vector<att::ImplementationInfo>& infos() {
  static const std::vector<att::ImplementationInfo> all = att::implementations();
  return all;
}

#define SKIP_WITHOUT_CUDNN() TESSERA_SKIP_UNLESS_AVAILABLE(infos(), "cudnn")

void expect_parity(const at::CaseSpec& spec, Pass pass) {
  const at::ParityReport r = at::check_parity(spec, "cudnn", pass, Device::cuda());
  ASSERT_TRUE(r.ran) << at::report_str(r);
  EXPECT_TRUE(r.ok()) << at::report_str(r);
}

at::CaseSpec base(DType dtype, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv) {
  at::CaseSpec c;
  c.dtype = dtype;
  c.B = 2, c.Sq = Sq, c.Sk = Sk, c.Hq = Hq, c.Hkv = Hkv, c.D = D, c.Dv = Dv;
  return c;
}

// The options cuDNN takes: each case runs every pass against the reference.
std::vector<at::CaseSpec> supported_cases() {
  std::vector<at::CaseSpec> v;
  v.push_back(base(DType::kBF16, 128, 128, 4, 4, 64, 64));  // no mask
  at::CaseSpec c = base(DType::kBF16, 200, 200, 8, 2, 128, 128);  // causal, GQA 4:1, ragged tile
  c.opt.causal = true;
  v.push_back(c);
  c = base(DType::kF16, 77, 190, 4, 1, 64, 64);  // bottom-right causal (Sq < Sk), MQA
  c.opt.causal = true;
  v.push_back(c);
  c = base(DType::kBF16, 150, 150, 4, 2, 64, 64);  // sliding window (left only)
  c.opt.window_left = 31;
  v.push_back(c);
  c = base(DType::kBF16, 96, 160, 2, 2, 128, 128);  // causal + window, bottom-right
  c.opt.causal = true, c.opt.window_left = 40;
  v.push_back(c);
  c = base(DType::kF16, 100, 100, 2, 2, 64, 64);  // window on both sides, no causal
  c.opt.window_left = 8, c.opt.window_right = 5;
  v.push_back(c);
  c = base(DType::kBF16, 64, 96, 4, 2, 128, 64);  // D != Dv, explicit scale
  c.opt.scale = 0.05;
  v.push_back(c);
  c = base(DType::kF16, 1, 300, 8, 8, 128, 128);  // decode: one row, causal (no mask nodes)
  c.opt.causal = true;
  v.push_back(c);
  for (size_t i = 0; i < v.size(); ++i) v[i].seed = 9000 + i;
  return v;
}

class AttentionCudnnCases : public ::testing::TestWithParam<std::tuple<int, Pass>> {};

TEST_P(AttentionCudnnCases, MatchesReference) {
  SKIP_WITHOUT_CUDNN();
  static const std::vector<at::CaseSpec> cases = supported_cases();
  const auto [i, pass] = GetParam();
  expect_parity(cases[static_cast<size_t>(i)], pass);
}

INSTANTIATE_TEST_SUITE_P(
    Supported, AttentionCudnnCases,
    ::testing::Combine(::testing::Range(0, static_cast<int>(supported_cases().size())),
                       ::testing::Values(Pass::kForward, Pass::kBackward, Pass::kFused)),
    [](const auto& info) {
      return "case" + std::to_string(std::get<0>(info.param)) + "_" + tessera::pass_name(std::get<1>(info.param));
    });

// Runs on every machine with the CUDA build: listed, and says why when it cannot run.
TEST(AttentionCudnn, ListedWithAReasonWhenUnavailable) {
  const auto* info = find_info(infos(), "cudnn");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->device, tessera::DeviceType::kCUDA);
  if (!info->available) EXPECT_FALSE(info->unavailable_reason.empty());
}

// o, grad_o and gradients in f32: cuDNN writes the inputs' dtype, so the backend hands the call to
// cuda, and the results still match the reference.
TEST(AttentionCudnn, F32OutputsStillMatch) {
  SKIP_WITHOUT_CUDNN();
  at::CaseSpec c = base(DType::kBF16, 64, 64, 2, 2, 64, 64);
  c.opt.causal = true, c.o_f32 = true, c.f32_grads = true, c.seed = 9100;
  expect_parity(c, Pass::kFused);
}

// What cuDNN does not take goes to cuda in the default order; named, it is refused with the reason.
TEST(AttentionCudnn, UnsupportedOptionsFallBackToCuda) {
  SKIP_WITHOUT_CUDNN();
  struct Case {
    const char* what;
    at::CaseSpec spec;
  };
  std::vector<Case> cases;
  at::CaseSpec c = base(DType::kF32, 32, 32, 2, 2, 64, 64);
  cases.push_back({"f16 or bf16", c});
  c = base(DType::kBF16, 32, 32, 2, 2, 64, 64);
  c.opt.softcap = 20.0;
  cases.push_back({"softcap", c});
  c = base(DType::kBF16, 32, 32, 2, 2, 64, 64);
  c.alibi = 1;
  cases.push_back({"ALiBi", c});
  c = base(DType::kBF16, 32, 32, 2, 2, 36, 36);
  cases.push_back({"multiples of 8", c});
  c = base(DType::kBF16, 0, 0, 2, 2, 64, 64);
  c.seqlens_q = {20, 33}, c.seqlens_k = {25, 40};
  cases.push_back({"varlen", c});
  for (const Case& k : cases) {
    const at::CaseData d = at::make_case(k.spec).to(Device::cuda());
    att::Options opt = k.spec.opt;
    const att::Result r = att::compute(d.inputs(), opt);
    EXPECT_EQ(r.implementation, "cuda") << k.what;
    opt.implementation = "cudnn";
    try {
      (void)att::compute(d.inputs(), opt);
      ADD_FAILURE() << k.what << ": cudnn took it";
    } catch (const tessera::Error& e) {
      EXPECT_EQ(e.code(), tessera::ErrorCode::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(k.what), std::string::npos) << e.what();
    }
  }
}

// The default order picks cudnn for what it takes.
TEST(AttentionCudnn, DefaultOrderPicksCudnn) {
  SKIP_WITHOUT_CUDNN();
  at::CaseSpec c = base(DType::kBF16, 128, 128, 4, 2, 128, 128);
  c.opt.causal = true;
  const at::CaseData d = at::make_case(c).to(Device::cuda());
  const att::Result r = att::compute_with_grad(d.inputs(), d.grad_o.view(), c.opt);
  EXPECT_EQ(r.implementation, "cudnn");
}

TEST(AttentionCudnn, RunsOnTheGivenStream) {
  SKIP_WITHOUT_CUDNN();
  at::CaseSpec c = base(DType::kBF16, 128, 128, 2, 2, 64, 64);
  const at::CaseData d = at::make_case(c).to(Device::cuda());
  att::Options opt;
  opt.implementation = "cudnn";
  const att::Result want = att::compute(d.inputs(), opt);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  opt.stream = stream;
  const att::Result got = att::compute(d.inputs(), opt);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const Tensor a = want.o.to(Device::cpu()), b = got.o.to(Device::cpu());
  ASSERT_EQ(a.view().nbytes(), b.view().nbytes());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.view().nbytes()), 0);
  cudaStreamDestroy(stream);
}

// Options::deterministic = false builds the backward on cuDNN's non-deterministic engine (the
// plan's debug line says so), still within the oracle's tolerance; true keeps the deterministic
// one. A shape no other test uses, so that both plans are built here.
TEST(AttentionCudnn, DeterministicOffTakesTheOtherEngine) {
  SKIP_WITHOUT_CUDNN();
  const tessera::log::Level old = tessera::log::level();
  std::string logs;
  tessera::log::set_level(tessera::log::Level::kDebug);
  tessera::log::set_capture(&logs);
  at::CaseSpec c = base(DType::kBF16, 176, 176, 4, 2, 64, 64);
  c.opt.causal = true;
  c.opt.deterministic = false;
  expect_parity(c, Pass::kBackward);
  const bool nondet = logs.find("Sq=176 Sk=176 Hq=4 Hkv=2 D=64 Dv=64") != std::string::npos &&
                      logs.find("(non-deterministic)") != std::string::npos;
  logs.clear();
  c.opt.deterministic = true;
  expect_parity(c, Pass::kBackward);
  tessera::log::set_capture(nullptr);
  tessera::log::set_level(old);
  EXPECT_TRUE(nondet) << "no non-deterministic backward plan built";
  EXPECT_NE(logs.find("deterministic built"), std::string::npos) << logs;
  EXPECT_EQ(logs.find("(non-deterministic)"), std::string::npos) << logs;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.view().nbytes() == y.view().nbytes() && std::memcmp(x.data(), y.data(), x.view().nbytes()) == 0;
}

// ANCHORS (FlashAttention #2244: a "deterministic" backward that was not): with the default
// Options::deterministic, every backward the cudnn implementation serves gives the same bits on a
// second call, and no non-deterministic cuDNN plan is built for it (where cuDNN has no
// deterministic engine for a shape, the backward runs on cuda instead). Every supported case, and
// a training-sized causal bf16 shape. What it cannot force: a shape for which cuDNN has no
// deterministic engine (none is known among these; the fallback fixed on 2026-11-28 took the
// non-deterministic one only there), and a race that happens to repeat its bits.
TEST(AttentionCudnn, DeterministicBackwardIsBitwiseRepeatable) {
  SKIP_WITHOUT_CUDNN();
  std::vector<at::CaseSpec> cases = supported_cases();
  at::CaseSpec big = base(DType::kBF16, 1024, 1024, 16, 16, 128, 128);
  big.B = 4, big.opt.causal = true, big.seed = 9100;
  cases.push_back(big);
  const tessera::log::Level old = tessera::log::level();
  std::string logs;
  tessera::log::set_level(tessera::log::Level::kDebug);
  tessera::log::set_capture(&logs);
  for (at::CaseSpec c : cases) {
    c.opt.implementation = "cudnn";
    ASSERT_TRUE(c.opt.deterministic);  // the default
    const at::CaseData d = at::make_case(c).to(Device::cuda());
    const att::Result a = att::compute_with_grad(d.inputs(), d.grad_o.view(), c.opt);
    const att::Result b = att::compute_with_grad(d.inputs(), d.grad_o.view(), c.opt);
    const std::string tag = "case seed " + std::to_string(c.seed);
    EXPECT_TRUE(same_bits(a.dq, b.dq)) << tag << ": dq";
    EXPECT_TRUE(same_bits(a.dk, b.dk)) << tag << ": dk";
    EXPECT_TRUE(same_bits(a.dv, b.dv)) << tag << ": dv";
  }
  tessera::log::set_capture(nullptr);
  tessera::log::set_level(old);
  EXPECT_EQ(logs.find("(non-deterministic)"), std::string::npos) << logs;
}

TEST(AttentionCudnn, OtherBlockSizesAreRefused) {
  SKIP_WITHOUT_CUDNN();
  EXPECT_THROW(att::validate_block_sizes("cudnn", att::BlockSizes{64, 64}), tessera::Error);
  EXPECT_NO_THROW(att::validate_block_sizes("cudnn", att::BlockSizes{128, 128}));
}

}  // namespace
