// attention, cudnn backend, without a GPU: the exact cuDNN frontend graphs the backend builds
// (cudnn_graphs.h), checked against the installed cuDNN for an H100 described by its device
// properties (cuDNN's deviceless mode, cuDNN >= 9.8): the frontend's validation and cuDNN's
// operation-graph finalization must accept every option the backend claims (cudnn_plan.h) and
// refuse what it declares unsupported for cuDNN's reasons. Where a CUDA device and driver are
// present, the full plan build must succeed too (without a driver cuDNN's fused-attention engines
// stop at "libcuda == nullptr": they are compiled at run time). Built only with cuDNN.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention/cudnn_graphs.h"
#include "kernels/attention/cudnn_plan.h"

namespace fe = cudnn_frontend;
namespace cp = tessera::attention::cudnn_plan;
namespace cg = tessera::attention::cudnn_graphs;
using tessera::DType;

namespace {

// An H100 SXM (132 SMs, compute capability 9.0) in cuDNN's device-properties JSON.
const char* kH100 = R"({"deviceVer":900,"driverVer":13000,"cudaDeviceId":0,"multiProcessorCount":132,
"warpSize":32,"regsPerBlock":65536,"maxSharedMemoryPerBlock":49152,"maxSharedMemoryPerBlockOptin":232448,
"reservedSharedMemoryPerBlock":1024,"maxRegistersPerSM":65536,"maxCtasPerSM":32,"maxThreadsPerBlock":1024,
"maxThreadsPerSM":2048,"pciDeviceId":0,"isTccDriver":0,"supportCoopLaunch":1,"totalGlobalMem":85520809984,
"smClockRateKHz":1980000,"memClockRateKHz":2619000,"l2CacheSize":52428800,"maxGridSize":[2147483647,65535,65535],
"maxBlockSize":[1024,1024,64],"deviceName":"NVIDIA H100 80GB HBM3"})";

std::shared_ptr<fe::DeviceProperties> h100() {
  auto props = std::make_shared<fe::DeviceProperties>();
  const std::string js = kH100;
  fe::error_t e = props->deserialize(std::vector<uint8_t>(js.begin(), js.end()));
  if (e.is_bad()) return nullptr;
  return props;
}

cp::PlanKey key(cp::Pass pass, DType dtype, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv,
                int64_t left = -1, int64_t right = -1) {
  cp::PlanKey k;
  k.pass = pass, k.dtype = dtype;
  k.B = 2, k.Sq = Sq, k.Sk = Sk, k.Hq = Hq, k.Hkv = Hkv, k.D = D, k.Dv = Dv;
  const float scale = 0.088f;
  std::memcpy(&k.scale_bits, &scale, sizeof scale);
  k.left = left, k.right = right;
  return k;
}

std::shared_ptr<fe::graph::Graph> graph(const cp::PlanKey& k) {
  return k.pass == cp::Pass::kForward ? cg::forward_graph(k, 90) : cg::backward_graph(k, true, 90);
}

// "" when the frontend validates the graph and cuDNN finalizes its operation graph for the H100.
std::string lower(const cp::PlanKey& k, const std::shared_ptr<fe::DeviceProperties>& props) {
  auto g = graph(k);
  g->set_device_properties(props);
  fe::error_t e = g->validate();
  if (e.is_bad()) return "validate: " + e.get_message();
  e = g->build_operation_graph();
  if (e.is_bad()) return "build_operation_graph: " + e.get_message();
  return {};
}

bool have_device() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}

// The options the backend hands to cuDNN (the device tests' cases, both passes).
std::vector<cp::PlanKey> supported() {
  std::vector<cp::PlanKey> v;
  for (cp::Pass pass : {cp::Pass::kForward, cp::Pass::kBackward}) {
    v.push_back(key(pass, DType::kBF16, 128, 128, 4, 4, 64, 64));               // no mask
    v.push_back(key(pass, DType::kBF16, 200, 200, 8, 2, 128, 128, -1, 0));      // causal, GQA
    v.push_back(key(pass, DType::kF16, 77, 190, 4, 1, 64, 64, -1, 0));          // bottom-right, MQA
    v.push_back(key(pass, DType::kBF16, 150, 150, 4, 2, 64, 64, 32, -1));       // left window
    v.push_back(key(pass, DType::kBF16, 96, 160, 2, 2, 128, 128, 41, 0));       // causal + window
    v.push_back(key(pass, DType::kF16, 100, 100, 2, 2, 64, 64, 9, 5));          // two-sided window
    v.push_back(key(pass, DType::kBF16, 64, 96, 4, 2, 128, 64));                // D != Dv
    v.push_back(key(pass, DType::kBF16, 64, 64, 4, 4, 192, 128));               // D != Dv past 128
    v.push_back(key(pass, DType::kBF16, 4096, 4096, 16, 16, 128, 128, -1, 0));  // the anchor shape
    v.push_back(key(pass, DType::kBF16, 512, 512, 8, 8, 256, 256, -1, 0));      // D = 256
  }
  return v;
}

}  // namespace

TEST(AttentionCudnnGraph, EverySupportedOptionLowersForAnH100) {
  const auto props = h100();
  ASSERT_NE(props, nullptr) << "cuDNN did not take the H100 device properties (needs cuDNN >= 9.8)";
  for (const cp::PlanKey& k : supported()) EXPECT_EQ(lower(k, props), "") << k.str();
}

// What cudnn_plan.h declares unsupported for cuDNN's own reasons is refused by cuDNN too (so the
// rules are not stricter than needed, and not looser).
TEST(AttentionCudnnGraph, CudnnRefusesWhatThePlanRefuses) {
  const auto props = h100();
  ASSERT_NE(props, nullptr);
  for (cp::Pass pass : {cp::Pass::kForward, cp::Pass::kBackward}) {
    // Bottom-right causal with more query rows than keys.
    EXPECT_NE(lower(key(pass, DType::kBF16, 200, 100, 4, 4, 64, 64, -1, 0), props), "");
    // Not a multiple of 8.
    EXPECT_NE(lower(key(pass, DType::kBF16, 128, 128, 4, 4, 60, 60), props), "");
  }
  // Head dims past 256: the backward is refused by validation (the forward is left to cuDNN's
  // engines, which the plan build asks; cudnn_plan.h refuses both).
  EXPECT_NE(lower(key(cp::Pass::kBackward, DType::kBF16, 128, 128, 4, 4, 264, 264), props), "");
  // And the same problems without the mask / with legal dims are accepted (the refusals above
  // are about those very features).
  EXPECT_EQ(lower(key(cp::Pass::kForward, DType::kBF16, 200, 100, 4, 4, 64, 64), props), "");
  EXPECT_EQ(lower(key(cp::Pass::kForward, DType::kBF16, 128, 128, 4, 4, 128, 64), props), "");
}

// With a device and driver: every supported graph gets an execution plan from heuristics mode A.
TEST(AttentionCudnnGraph, PlansBuildOnTheDevice) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device: cuDNN's runtime-compiled engines need the driver";
  cudnnHandle_t h = nullptr;
  ASSERT_EQ(cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
  for (const cp::PlanKey& k : supported()) {
    auto g = k.pass == cp::Pass::kForward ? cg::forward_graph(k) : cg::backward_graph(k, true);
    std::string why;
    for (auto e : {g->validate(), g->build_operation_graph(h), g->create_execution_plans({fe::HeurMode_t::A}),
                   g->check_support(h), g->build_plans(h)}) {
      if (e.is_bad()) {
        why = e.get_message();
        break;
      }
    }
    EXPECT_EQ(why, "") << k.str();
  }
  cudnnDestroy(h);
}
