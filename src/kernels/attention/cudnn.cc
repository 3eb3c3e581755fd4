// attention: the cudnn backend — cuDNN's fused flash attention (SDPA forward and backward) through
// the cuDNN frontend's graph API (header-only, fetched by scripts/fetch_cudnn_frontend.sh; see
// CMakeLists.txt, TESSERA_CUDNN). Built into the CUDA module only when cuDNN and the frontend are
// found. Design, limits and what is verified: docs/kernels/attention.md, section "cudnn backend".
//
// The host arithmetic (what cuDNN takes, layouts, the diagonal band, the plan key) is in
// cudnn_plan.h and unit-tested on the CPU. Here: one cuDNN graph per PlanKey, built on first use
// (heuristics mode A, no autotuning) and cached; a cuDNN handle leased per call from a per-device
// pool; the workspace is stream-ordered scratch. What cuDNN cannot do for a call that supports()
// let through (outputs in another dtype, no backward plan) goes to the `cuda` implementation.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "core/env.h"
#include "primitives/cuda_available.h"
#include "core/log.h"
#include "kernels/attention/cuda_access.h"
#include "kernels/attention/cudnn_graphs.h"
#include "kernels/attention/cudnn_plan.h"
#include "kernels/attention/impl.h"
#include "tessera/error.h"

namespace tessera::attention {
namespace {

namespace fe = cudnn_frontend;
namespace cp = cudnn_plan;
using cudnn_graphs::backward_graph;
using cudnn_graphs::forward_graph;
using enum cudnn_graphs::Uid;  // kQ, kK, ... of the variant packs

constexpr int kMinComputeMajor = 8;  // cuDNN's flash attention: Ampere and newer

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, std::string(kKernelName) + " (cudnn): " + msg);
}

// ---- cuDNN handles: leased per call from a per-device pool (like cuda::BlasHandle) ----

class HandleLease {
 public:
  HandleLease(int device, cudaStream_t stream) : device_(device) {
    {
      std::lock_guard<std::mutex> lock(mu());
      auto& free = pool(device);
      if (!free.empty()) h_ = free.back(), free.pop_back();
    }
    if (!h_) {
      const cudnnStatus_t s = cudnnCreate(&h_);
      if (s != CUDNN_STATUS_SUCCESS) fail(ErrorCode::kInternal, std::string("cudnnCreate: ") + cudnnGetErrorString(s));
    }
    const cudnnStatus_t s = cudnnSetStream(h_, stream);
    if (s != CUDNN_STATUS_SUCCESS) {
      give_back();
      fail(ErrorCode::kInternal, std::string("cudnnSetStream: ") + cudnnGetErrorString(s));
    }
  }
  ~HandleLease() { give_back(); }
  HandleLease(const HandleLease&) = delete;
  HandleLease& operator=(const HandleLease&) = delete;
  cudnnHandle_t get() const { return h_; }

 private:
  // Pooled handles are never destroyed (as cuBLAS's: teardown order with the runtime).
  static std::mutex& mu() {
    static std::mutex* m = new std::mutex;
    return *m;
  }
  static std::vector<cudnnHandle_t>& pool(int device) {
    static auto* pools = new std::unordered_map<int, std::vector<cudnnHandle_t>>;
    return (*pools)[device];
  }
  void give_back() noexcept {
    if (!h_) return;
    std::lock_guard<std::mutex> lock(mu());
    pool(device_).push_back(h_);
    h_ = nullptr;
  }
  cudnnHandle_t h_ = nullptr;
  int device_ = 0;
};

// Validates, lowers and builds `g` with heuristics mode A (the first plan cuDNN ranks best; no
// autotuning). "" on success, else what failed.
std::string build(fe::graph::Graph& g, cudnnHandle_t h, int64_t* workspace) {
  const auto step = [](fe::error_t e, const char* what) {
    return e.is_good() ? std::string() : std::string(what) + ": " + e.get_message();
  };
  std::string why;
  if (!(why = step(g.validate(), "validate")).empty()) return why;
  if (!(why = step(g.build_operation_graph(h), "build_operation_graph")).empty()) return why;
  if (!(why = step(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans")).empty()) return why;
  if (!(why = step(g.check_support(h), "check_support")).empty()) return why;
  if (!(why = step(g.build_plans(h), "build_plans")).empty()) return why;
  return step(g.get_workspace_size(*workspace), "get_workspace_size");
}

// ---- the plan cache ----

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null when cuDNN has no plan; `error` says why
  std::string error;
  int64_t workspace = 0;
  bool deterministic = false;
  bool transient = false;  // failed for a reason other than cuDNN's support (not cached)
  // Executions of one graph are serialized: the frontend's execute() is const but keeps per-graph
  // state (its variant-pack template); enqueueing is host work of microseconds.
  mutable std::mutex exec_mu;
};

std::shared_ptr<const Plan> make_plan(const cp::PlanKey& k) {
  auto made = std::make_shared<Plan>();
  Plan& plan = *made;
  try {
    cuda::DeviceGuard guard(k.device);
    HandleLease h(k.device, nullptr);
    if (k.pass == cp::Pass::kForward) {
      plan.graph = forward_graph(k);
      plan.error = build(*plan.graph, h.get(), &plan.workspace);
    } else {
      // The call's choice (Options::deterministic, backward_key). A non-deterministic call takes
      // the deterministic engine where cuDNN has no other; a deterministic one never takes the
      // non-deterministic engine: no plan, and backward() runs on cuda (deterministic) instead.
      for (const bool det : k.deterministic ? std::vector<bool>{true} : std::vector<bool>{false, true}) {
        plan.graph = backward_graph(k, det);
        plan.error = build(*plan.graph, h.get(), &plan.workspace);
        plan.deterministic = det;
        if (plan.error.empty()) break;
      }
    }
  } catch (const std::exception& e) {  // no handle, out of memory, the frontend's own throws
    plan.error = e.what();
    plan.transient = true;
  }
  if (!plan.error.empty()) plan.graph.reset();
  log::debug(std::string(kKernelName) + " (cudnn): plan " + k.str() +
             (plan.error.empty() ? " built, workspace " + std::to_string(plan.workspace) + " bytes" +
                                       (k.pass == cp::Pass::kBackward && !plan.deterministic ? " (non-deterministic)" : "")
                                 : " unavailable: " + plan.error));
  return made;
}

// The backward's key: deterministic as the call asks, unless TESSERA_CUDNN_DETERMINISTIC=0 (read
// on every call) turns that off for the whole process: side-by-side timing of what determinism
// costs without touching the caller (PyTorch's SDPA takes the non-deterministic engine by default).
cp::PlanKey backward_key(const Problem& p) {
  cp::PlanKey k = cp::plan_key(p, cp::Pass::kBackward);
  if (!env::flag("TESSERA_CUDNN_DETERMINISTIC", true)) k.deterministic = false;
  return k;
}

// Plans by key, built once (under the lock: concurrent first calls of one shape build it once;
// other shapes wait for that build). cuDNN's refusals are cached like plans; transient failures
// are not.
std::shared_ptr<const Plan> plan_for(const cp::PlanKey& k) {
  static std::mutex mu;
  static std::unordered_map<cp::PlanKey, std::shared_ptr<const Plan>, cp::PlanKeyHash> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(k); it != cache.end()) return it->second;
  if (cache.size() >= cp::kMaxCachedPlans) cache.clear();
  auto plan = make_plan(k);
  if (!plan->transient) cache.emplace(k, plan);
  return plan;
}

void execute(const Plan& plan, const Problem& p, std::unordered_map<int64_t, void*>& pack) {
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const int dev = p.device.index;
  HandleLease h(dev, stream);
  const cuda::DeviceBuffer ws(static_cast<size_t>(plan.workspace), stream, dev);
  fe::error_t e;
  {
    std::lock_guard<std::mutex> lock(plan.exec_mu);
    e = plan.graph->execute(h.get(), pack, ws.get());
  }
  if (e.is_bad()) fail(ErrorCode::kInternal, "cuDNN execute failed: " + e.get_message());
}

// ---- checks ----

std::string device_problem(int device) {
  std::string why;
  const int count = cuda::device_count(&why);
  if (count == 0) return why;
  if (device >= count) return "cuda:" + std::to_string(device) + " does not exist";
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "could not query the compute capability of cuda:" + std::to_string(device);
  }
  if (major < kMinComputeMajor)
    return "cuda:" + std::to_string(device) + " has compute capability " + std::to_string(major) +
           ".x; cuDNN's fused attention needs 8.0 or newer";
  return {};
}

const std::string kWho = std::string(kKernelName) + " (cudnn)";  // prefixes the pointer checks' errors

void* mut(const void* p) { return const_cast<void*>(p); }  // cuDNN's variant pack takes void*

// ---- the implementation ----

class Cudnn final : public Implementation {
 public:
  std::string name() const override { return "cudnn"; }
  std::string description() const override {
    return "NVIDIA GPUs (sm_80+): cuDNN " + std::to_string(cudnnGetVersion()) +
           " fused flash attention (SDPA fwd/bwd, frontend " + std::to_string(CUDNN_FRONTEND_VERSION) +
           "); f16/bf16, dense, causal / window / GQA; anything else falls back to cuda";
  }
  DeviceType device_type() const override { return DeviceType::kCUDA; }

  Availability available() const override {
    if (Availability a = primitives::cuda_available(); !a.ok) return a;
    if (cudnnGetVersion() / 10000 != CUDNN_MAJOR)
      return Availability::no("libcudnn is version " + std::to_string(cudnnGetVersion()) + ", built against " +
                              std::to_string(CUDNN_VERSION));
    return Availability::yes();
  }

  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCUDA)
      return Availability::no("inputs are on " + p.device.str() + "; the cudnn backend needs CUDA device memory");
    if (std::string why = device_problem(p.device.index); !why.empty()) return Availability::no(why);
    if (std::string why = cp::unsupported_reason(p); !why.empty()) return Availability::no(why);
    const auto plan = plan_for(cp::plan_key(p, cp::Pass::kForward));
    if (!plan->graph) return Availability::no("cuDNN has no plan for this problem: " + plan->error);
    return Availability::yes();
  }

  // cuDNN picks its own tiles; the block sizes are nominal (the only value accepted).
  BlockSizes default_block_sizes(const Problem&) const override { return {128, 128}; }
  void validate_block_sizes(const BlockSizes& bs) const override {
    if (!(bs == BlockSizes{128, 128}))
      throw Error(ErrorCode::kInvalidArgument, std::string(kKernelName) +
                                                   " cudnn: invalid block sizes: cuDNN chooses its own tiles; only "
                                                   "the nominal q=128,kv=128 is accepted, got " +
                                                   bs.str());
  }

  void forward(const Problem& p, const BlockSizes& bs, const ForwardOut& out) const override {
    validate_block_sizes(bs);
    const int dev = p.device.index;
    cuda::DeviceGuard guard(dev);
    cuda_access::forward(p, out, kWho);
    if (std::string why = cp::unsupported_outputs(p.dtype, {out.o_dtype}); !why.empty())
      return fallback(p, why).forward(p, fallback_bs(p), out);
    const auto plan = plan_for(cp::plan_key(p, cp::Pass::kForward));
    if (!plan->graph) return fallback(p, plan->error).forward(p, fallback_bs(p), out);
    std::unordered_map<int64_t, void*> pack{{kQ, mut(p.q)}, {kK, mut(p.k)}, {kV, mut(p.v)},
                                            {kO, out.o},    {kStats, out.lse}};
    execute(*plan, p, pack);
  }

  void backward(const Problem& p, const BlockSizes& bs, const BackwardIn& in, const GradOut& out) const override {
    validate_block_sizes(bs);
    const int dev = p.device.index;
    cuda::DeviceGuard guard(dev);
    cuda_access::backward(p, in, out, kWho);
    const std::string why =
        cp::unsupported_outputs(p.dtype, {in.o_dtype, in.grad_o_dtype, out.dq_dtype, out.dk_dtype, out.dv_dtype});
    if (!why.empty()) return fallback(p, why).backward(p, fallback_bs(p), in, out);
    const auto plan = plan_for(backward_key(p));
    if (!plan->graph) return fallback(p, plan->error).backward(p, fallback_bs(p), in, out);
    std::unordered_map<int64_t, void*> pack{{kQ, mut(p.q)},         {kK, mut(p.k)},   {kV, mut(p.v)},
                                            {kO, mut(in.o)},        {kDO, mut(in.grad_o)},
                                            {kStats, mut(in.lse)},  {kDQ, out.dq},    {kDK, out.dk},
                                            {kDV, out.dv}};
    execute(*plan, p, pack);
  }

 private:
  // The `cuda` implementation, for what cuDNN cannot do in a call supports() let through.
  static const Implementation& fallback(const Problem& p, const std::string& why) {
    const Implementation* c = find_implementation("cuda");
    if (!c) fail(ErrorCode::kUnsupported, why + "; and the cuda implementation is not registered");
    if (const Availability a = c->supports(p); !a.ok) fail(ErrorCode::kUnsupported, why + "; cuda: " + a.reason);
    log::debug(std::string(kKernelName) + " (cudnn): this call runs on cuda: " + why);
    return *c;
  }
  static BlockSizes fallback_bs(const Problem& p) { return find_implementation("cuda")->default_block_sizes(p); }
};

std::unique_ptr<Implementation> make_cudnn_implementation() {
  cuda::register_allocator();
  cuda::register_device_hooks();
  return std::make_unique<Cudnn>();
}

// Registered by the CUDA module when it is loaded, in place of the "cudnn" placeholder of
// implementations.cc (ahead of "cuda" in the default order).
}  // namespace

TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cudnn_implementation()); });

}  // namespace tessera::attention
