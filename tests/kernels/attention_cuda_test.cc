// attention: the cuda backend against the reference (host copies) on the built-in check grid,
// every pass; larger shapes past several tiles; determinism; streams; rows with no key on the
// device; the bias in every broadcast; error paths (head-dim limit, host memory labelled as device
// memory, block sizes).
// Compiled only when the CUDA backend is built; every GPU test skips cleanly without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

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

#define SKIP_WITHOUT_GPU() TESSERA_SKIP_UNLESS_AVAILABLE(infos(), "cuda")

// The cuda backend declares no case of these tests unsupported (head dims <= 256, any mask,
// varlen outside a graph capture): a refusal is a failure, printed with its reason.
void expect_parity(const at::CaseSpec& spec, Pass pass) {
  const at::ParityReport r = at::check_parity(spec, "cuda", pass, Device::cuda());
  TESSERA_SKIP_DECLARED_UNSUPPORTED(r.skipped, false, at::report_str(r));
  ASSERT_TRUE(r.ran) << at::report_str(r);
  EXPECT_TRUE(r.ok()) << at::report_str(r);
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  const auto* b = static_cast<const unsigned char*>(h.data());
  return {b, b + h.view().nbytes()};
}

}  // namespace

// Runs on every machine with the CUDA build: registered, and says why when it cannot run.
TEST(AttentionCuda, ListedWithAReasonWhenUnavailable) {
  const auto* info = find_info(infos(), "cuda");
  ASSERT_NE(info, nullptr) << "cuda is not in attention's registry";
  EXPECT_EQ(info->device, tessera::DeviceType::kCUDA);
  if (!info->available) EXPECT_FALSE(info->unavailable_reason.empty());
}

// Host inputs never reach the cuda backend: a named cuda call on host memory is refused
// (kUnsupported, the parity report's "skipped") with the reason, on any machine.
TEST(AttentionCuda, HostInputsAreRefused) {
  at::CaseSpec s;
  const at::ParityReport r = at::check_parity(s, "cuda", Pass::kForward, Device::cpu());
  EXPECT_FALSE(r.ran);
  EXPECT_TRUE(r.skipped) << r.error;
}

// ---- the built-in check grid, every pass ----

class AttentionCudaGrid : public ::testing::TestWithParam<std::tuple<int, Pass>> {};

TEST_P(AttentionCudaGrid, MatchesReference) {
  SKIP_WITHOUT_GPU();
  static const std::vector<at::CaseSpec> grid = at::check_grid(false);
  const auto [i, pass] = GetParam();
  expect_parity(grid[static_cast<size_t>(i)], pass);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, AttentionCudaGrid,
    ::testing::Combine(::testing::Range(0, static_cast<int>(at::check_grid(false).size())),
                       ::testing::Values(Pass::kForward, Pass::kBackward, Pass::kFused)),
    [](const auto& info) {
      return "case" + std::to_string(std::get<0>(info.param)) + "_" + tessera::pass_name(std::get<1>(info.param));
    });

// The cuda kernels' dropout mask is the rule of primitives/philox.h, the same bits as the CPU's
// (read back through o: testing.h), for each dtype; the seed is device memory.
TEST(AttentionCuda, DropoutMaskIsThePhiloxRule) {
  SKIP_WITHOUT_GPU();
  const int32_t seed[2] = {123456789, -42};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (double p : {0.1, 0.5})
      EXPECT_EQ(at::dropout_mask_through_o("cuda", Device::cuda(0), dt, 2, 5, 37, 3, 1, p, seed),
                at::dropout_mask_rule(2, 5, 37, 3, p, seed))
          << dtype_name(dt) << " p=" << p;
}

// ---- past many tiles: several q blocks (16 rows) and kv tiles / key blocks (32 keys) ----

TEST(AttentionCuda, ManyTilesEveryHeadDimBucket) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 7000;
  // D buckets of the kernels: <= 32, <= 64, <= 128, <= 256 (dk/dv: 4 or 8 warps).
  for (const auto [D, Dv] : std::vector<std::pair<int64_t, int64_t>>{{8, 40}, {64, 64}, {96, 128}, {200, 256}}) {
    at::CaseSpec c;
    c.dtype = DType::kBF16;
    c.B = 2, c.Sq = 83, c.Sk = 101, c.Hq = 6, c.Hkv = 2, c.D = D, c.Dv = Dv;
    c.opt.causal = true;
    c.opt.window_left = 40;
    c.alibi = 2;
    c.seed = seed++;
    expect_parity(c, Pass::kFused);
    c.opt.causal = false, c.opt.window_left = -1, c.alibi = 0, c.segments = 3, c.dtype = DType::kF32;
    c.seed = seed++;
    expect_parity(c, Pass::kFused);
  }
}

// The bias in every broadcast pattern past several tiles, with −inf entries (whole rows masked
// by "B1Q1"-style row biases included through "BHQ1"), in bf16 and f32; dbias in the fused pass.
TEST(AttentionCuda, BiasEveryBroadcastPastManyTiles) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 7200;
  for (DType dt : {DType::kBF16, DType::kF32})
    for (const char* shape : {"BHQK", "1HQK", "B1QK", "BH1K", "11QK", "111K", "BHQ1", "1111"}) {
      at::CaseSpec c;
      c.dtype = dt;
      c.B = 2, c.Sq = 45, c.Sk = 70, c.Hq = 4, c.Hkv = 2, c.D = c.Dv = 64;
      c.bias = shape;
      c.bias_f32 = dt == DType::kBF16;
      c.bias_masks = true;
      c.opt.causal = true;
      c.opt.softcap = 5.0;
      c.seed = seed++;
      expect_parity(c, Pass::kFused);
    }
}

TEST(AttentionCuda, VarlenLongSequences) {
  SKIP_WITHOUT_GPU();
  at::CaseSpec c;
  c.dtype = DType::kF16;
  c.seqlens_q = {130, 0, 47, 200};
  c.seqlens_k = {130, 33, 61, 150};
  c.Hq = 4, c.Hkv = 1, c.D = c.Dv = 64;
  c.opt.causal = true;
  c.opt.softcap = 4.0;
  c.seed = 7100;
  expect_parity(c, Pass::kFused);
}

// ---- determinism: no atomics, so two runs agree bit for bit ----

TEST(AttentionCuda, BackwardIsDeterministic) {
  SKIP_WITHOUT_GPU();
  at::CaseSpec c;
  c.dtype = DType::kBF16;
  c.B = 1, c.Sq = c.Sk = 300, c.Hq = 8, c.Hkv = 2, c.D = c.Dv = 64;
  c.opt.causal = true;
  const at::CaseData d = at::make_case(c).to(Device::cuda());
  att::Options opt = c.opt;
  opt.implementation = "cuda";
  const att::Result a = att::compute_with_grad(d.inputs(), d.grad_o.view(), opt);
  const att::Result b = att::compute_with_grad(d.inputs(), d.grad_o.view(), opt);
  EXPECT_EQ(a.implementation, "cuda");
  EXPECT_EQ(bytes_of(a.o), bytes_of(b.o));
  EXPECT_EQ(bytes_of(a.lse), bytes_of(b.lse));
  EXPECT_EQ(bytes_of(a.dq), bytes_of(b.dq));
  EXPECT_EQ(bytes_of(a.dk), bytes_of(b.dk));
  EXPECT_EQ(bytes_of(a.dv), bytes_of(b.dv));
  // dbias of a T5 bias [1, Hq, S, S] (summed over B in one order per element)
  at::CaseSpec t = c;
  t.B = 2, t.Sq = t.Sk = 100, t.bias = "1HQK", t.bias_f32 = true;
  const at::CaseData td = at::make_case(t).to(Device::cuda());
  const att::Result x = att::compute_with_grad(td.inputs(), td.grad_o.view(), opt);
  const att::Result y = att::compute_with_grad(td.inputs(), td.grad_o.view(), opt);
  EXPECT_EQ(bytes_of(x.dbias), bytes_of(y.dbias));
}

// ---- a user stream gives the same results as the default stream ----

TEST(AttentionCuda, RunsOnTheGivenStream) {
  SKIP_WITHOUT_GPU();
  at::CaseSpec c;
  c.B = 1, c.Sq = 50, c.Sk = 70, c.Hq = 2, c.Hkv = 2, c.D = c.Dv = 32;
  const at::CaseData d = at::make_case(c).to(Device::cuda());
  att::Options opt;
  opt.implementation = "cuda";
  const att::Result want = att::compute(d.inputs(), opt);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  opt.stream = stream;
  const att::Result got = att::compute(d.inputs(), opt);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(bytes_of(got.o), bytes_of(want.o));
  EXPECT_EQ(bytes_of(got.lse), bytes_of(want.lse));
  cudaStreamDestroy(stream);
}

// ---- varlen offsets are host memory (issue #30, 6) ----

namespace {

at::CaseSpec small_varlen() {
  at::CaseSpec c;
  c.dtype = DType::kBF16;
  c.seqlens_q = {5, 40, 9};
  c.seqlens_k = {7, 33, 3};
  c.Hq = 2, c.Hkv = 1, c.D = c.Dv = 32;
  c.seed = 7200;
  return c;
}

}  // namespace

// Under a capture the graph would replay a copy of stale offsets: refused before anything is
// queued on the stream, with the reason, and the capture stays valid.
TEST(AttentionCuda, VarlenOnACapturingStreamIsRefused) {
  SKIP_WITHOUT_GPU();
  const at::CaseSpec c = small_varlen();
  const at::CaseData d = at::make_case(c).to(Device::cuda());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  att::Options opt = c.opt;
  opt.implementation = "cuda";
  opt.stream = stream;
  (void)att::compute(d.inputs(), opt);  // outside the capture: runs
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  std::string what;
  tessera::ErrorCode code = tessera::ErrorCode::kInternal;
  try {
    (void)att::compute(d.inputs(), opt);
  } catch (const tessera::Error& e) {
    what = e.what();
    code = e.code();
  }
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "the call invalidated the capture";
  size_t nodes = 0;
  if (graph) {
    EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
    cudaGraphDestroy(graph);
  }
  EXPECT_EQ(code, tessera::ErrorCode::kUnsupported) << what;
  EXPECT_NE(what.find("CUDA graph"), std::string::npos) << what;
  EXPECT_NE(what.find("cu_seqlens"), std::string::npos) << what;
  EXPECT_EQ(nodes, 0u) << "work was queued before the refusal";
  cudaStreamDestroy(stream);
}

// Offsets in the caller's pinned memory may be overwritten as soon as the call returns, while
// the stream is still busy with earlier work: the backend copied them into its own staging
// buffer first (a cudaMemcpyAsync straight from pinned memory would read the new values).
TEST(AttentionCuda, VarlenOffsetsMayChangeOnceTheCallReturns) {
  SKIP_WITHOUT_GPU();
  const at::CaseSpec c = small_varlen();
  const at::CaseData d = at::make_case(c).to(Device::cuda());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  att::Options opt = c.opt;
  opt.implementation = "cuda";
  opt.stream = stream;
  const att::Result want = att::compute(d.inputs(), opt);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  const int64_t n = d.cu_q.numel();
  int32_t* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 2 * n * sizeof(int32_t), cudaHostAllocDefault), cudaSuccess);
  std::memcpy(pinned, d.cu_q.data(), n * sizeof(int32_t));
  std::memcpy(pinned + n, d.cu_k.data(), n * sizeof(int32_t));
  att::Inputs in = d.inputs();
  in.cu_seqlens_q = tessera::TensorView(pinned, DType::kI32, {n});
  in.cu_seqlens_k = tessera::TensorView(pinned + n, DType::kI32, {n});
  // Keep the stream busy (~a few ms of device copies) so that the call's own copy is queued
  // behind them when the host overwrites the offsets.
  const Tensor a = Tensor::zeros(DType::kF32, {int64_t{64} << 20}, Device::cuda());
  const Tensor b = Tensor::zeros(DType::kF32, {int64_t{64} << 20}, Device::cuda());
  for (int i = 0; i < 8; ++i)
    ASSERT_EQ(cudaMemcpyAsync(b.data(), a.data(), a.view().nbytes(), cudaMemcpyDeviceToDevice, stream), cudaSuccess);
  const att::Result got = att::compute(in, opt);
  for (int64_t i = 0; i < 2 * n; ++i) pinned[i] = 0;  // the caller reuses its buffer
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(bytes_of(got.o), bytes_of(want.o));
  EXPECT_EQ(bytes_of(got.lse), bytes_of(want.lse));
  cudaFreeHost(pinned);
  cudaStreamDestroy(stream);
}

// ---- no keys at all: the backend answers (device lse cannot be memset to −inf) ----

TEST(AttentionCuda, NoKeysGivesZeroAndMinusInfinity) {
  SKIP_WITHOUT_GPU();
  const Device g = Device::cuda();
  const Tensor q = Tensor::zeros(DType::kBF16, {2, 5, 2, 16}, g);
  const Tensor k = Tensor::zeros(DType::kBF16, {2, 0, 1, 16}, g);
  const Tensor v = Tensor::zeros(DType::kBF16, {2, 0, 1, 8}, g);
  const Tensor d_o = Tensor::zeros(DType::kBF16, {2, 5, 2, 8}, g);
  att::Options opt;
  opt.implementation = "cuda";
  const att::Result r = att::compute_with_grad(att::Inputs{q, k, v}, d_o, opt);
  const Tensor o = r.o.to(Device::cpu()), lse = r.lse.to(Device::cpu()), dq = r.dq.to(Device::cpu());
  for (int64_t i = 0; i < o.numel(); ++i) EXPECT_EQ(tessera::load_as_f32(o.data(), o.dtype(), i), 0.0f);
  for (int64_t i = 0; i < lse.numel(); ++i) EXPECT_EQ(lse.data_as<float>()[i], -INFINITY);
  for (int64_t i = 0; i < dq.numel(); ++i) EXPECT_EQ(tessera::load_as_f32(dq.data(), dq.dtype(), i), 0.0f);
}

// ---- errors ----

TEST(AttentionCuda, HeadDimOverTheLimitIsNamed) {
  SKIP_WITHOUT_GPU();
  const Device g = Device::cuda();
  const Tensor q = Tensor::zeros(DType::kF16, {1, 3, 1, 264}, g);
  const Tensor k = Tensor::zeros(DType::kF16, {1, 4, 1, 264}, g);
  const Tensor v = Tensor::zeros(DType::kF16, {1, 4, 1, 16}, g);
  att::Options opt;
  opt.implementation = "cuda";
  try {
    (void)att::compute(att::Inputs{q, k, v}, opt);
    FAIL() << "D=264 ran on cuda";
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.code(), tessera::ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("D <= 256 and Dv <= 256, got D=264"), std::string::npos) << e.what();
  }
}

TEST(AttentionCuda, HostMemoryLabelledAsDeviceIsRefused) {
  SKIP_WITHOUT_GPU();
  const Device g = Device::cuda();
  const Tensor q = Tensor::zeros(DType::kF32, {1, 3, 1, 8}, g), k = Tensor::zeros(DType::kF32, {1, 4, 1, 8}, g);
  Tensor host_v = Tensor::zeros(DType::kF32, {1, 4, 1, 8});  // pageable host memory
  tessera::TensorView v = host_v.view();
  v.device = g;
  att::Options opt;
  opt.implementation = "cuda";
  try {
    (void)att::compute(att::Inputs{q, k, v}, opt);
    FAIL() << "host memory labelled cuda:0 was accepted";
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.code(), tessera::ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("v is labelled cuda:0 but its memory is not accessible"), std::string::npos)
        << e.what();
  }
}

TEST(AttentionCuda, BlockSizesAreValidated) {
  SKIP_WITHOUT_GPU();
  EXPECT_NO_THROW(att::validate_block_sizes("cuda", att::BlockSizes{16, 32}));
  try {
    att::validate_block_sizes("cuda", att::BlockSizes{64, 64});
    FAIL() << "q=64,kv=64 accepted";
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.code(), tessera::ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("fixed tiles q=16"), std::string::npos) << e.what();
  }
}
