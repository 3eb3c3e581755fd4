// paged_attention: the cuda backend, version 2 — split-KV over the pages, keys across the lanes,
// the query heads of a kv head together (FlashDecoding's layout for a paged cache): the shared
// primitives/cuda_split_kv.cuh (also mla_decode's cuda_v2) on this kernel's layouts.
//
// v1 (cuda.cu) gives each (query row, head) one warp that walks its keys one at a time (a page-table
// lookup, a dependent load and a 5-step shuffle reduction per key; the query heads of a kv head read
// its keys once each): a decode step of 8192 keys ran at 1.7 % of the H200's memory line
// (docs/gpu_results/2026-11-27-tenth). Here a kv head's query heads share an item, keys are chunked
// across blocks and one key per lane. Verified on an H200 (2026-11-28: parity, memcheck, racecheck,
// initcheck; decode 9.6x v1): the default, v1 its fallback (docs/kernels/paged_attention.md, v2).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "core/trace_nvtx.h"
#include "kernels/paged_attention/cuda_checks.h"
#include "kernels/paged_attention/impl.h"
#include "primitives/cuda_available.h"
#include "primitives/cuda_split_kv.cuh"
#include "tessera/error.h"

namespace tessera::paged_attention {
namespace {

namespace skv = primitives::cuda::split_kv;
using Lim = skv::Limits<256, 256>;  // D, Dv
constexpr int kMaxRows = 8;
constexpr const char* kIndexCopy = "paged_attention cuda_v2 copies the page table and its work list to the device";

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, std::string(kKernelName) + " (cuda_v2): " + msg);
}

std::vector<int64_t> q_lens(const Problem& p) {
  std::vector<int64_t> v(static_cast<size_t>(p.N));
  for (int64_t s = 0; s < p.N; ++s) v[static_cast<size_t>(s)] = p.q_len(s);
  return v;
}

// q and o of T; the caches of T or f8e4m3.
template <class T>
void run_for(const Problem& p, const skv::Params& k, const std::vector<skv::Seq>& seqs, cudaStream_t stream, int dev) {
  const auto refuse = [](const std::string& why) { fail(ErrorCode::kUnsupported, why); };
  const size_t npt = static_cast<size_t>(p.N * p.max_pages);
  const char* what = "paged_attention (cuda_v2): copy of the work list";
  if (p.cache_dtype == DType::kF8E4M3)
    skv::run<T, __nv_fp8_e4m3, Lim, kMaxRows>(k, seqs, p.Hkv, p.page_table, npt, stream, dev, what, refuse);
  else
    skv::run<T, T, Lim, kMaxRows>(k, seqs, p.Hkv, p.page_table, npt, stream, dev, what, refuse);
}

class CudaV2 final : public primitives::CudaBackend<Implementation> {
 public:
  std::string name() const override { return "cuda_v2"; }
  std::string description() const override {
    return "NVIDIA GPUs: split-KV, keys across the lanes, a kv head's query heads together (v2, f32 math)";
  }
  std::string what_changed() const override {
    return "v1 -> v2: split-KV (chunks across blocks), a key per lane, a kv head's query heads in one item "
           "(primitives/cuda_split_kv.cuh)";
  }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCUDA) return Availability::no("the cuda_v2 backend runs on CUDA device memory");
    if (const Availability a = available(); !a.ok) return a;
    const std::string why = skv::refusal<Lim>(p.D, p.Dv, p.T, p.max_pages * p.page_size, q_lens(p), p.Hkv, p.group(),
                                              kMaxRows, static_cast<cudaStream_t>(p.stream), kIndexCopy);
    return why.empty() ? Availability::yes() : Availability::no("the cuda_v2 backend: " + why);
  }
  void forward(const Problem& p) const override {
    TESSERA_NVTX_RANGE("paged_attention.cuda_v2.fwd");
    const int dev = p.device.index;
    cuda::DeviceGuard guard(dev);
    require_launchable(p, std::string(kKernelName) + " (cuda_v2)", kIndexCopy);
    const auto stream = static_cast<cudaStream_t>(p.stream);
    std::vector<skv::Seq> seqs(static_cast<size_t>(p.N));
    for (int64_t s = 0; s < p.N; ++s) seqs[static_cast<size_t>(s)] = {p.cu_q[s], p.q_len(s), p.kv_len(s)};
    skv::Params k{};
    k.q = p.q, k.k = p.k, k.v = p.v, k.sinks = p.sinks, k.o = p.o, k.o_f32 = p.o_f32, k.lse = p.lse;
    k.Hq = p.Hq, k.G = p.group(), k.D = p.D, k.Dv = p.Dv, k.page_size = p.page_size, k.max_pages = p.max_pages;
    k.k_row = p.Hkv * p.D, k.k_head = p.D, k.v_row = p.Hkv * p.Dv, k.v_head = p.Dv;
    k.scale = static_cast<float>(p.scale), k.softcap = static_cast<float>(p.softcap);
    k.v_scale = static_cast<float>(p.v_scale);
    k.causal = p.causal, k.window = p.window;
    if (p.dtype == DType::kF32)
      run_for<float>(p, k, seqs, stream, dev);
    else if (p.dtype == DType::kBF16)
      run_for<__nv_bfloat16>(p, k, seqs, stream, dev);
    else
      run_for<__half>(p, k, seqs, stream, dev);
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cuda_v2_implementation() { return primitives::make_cuda<CudaV2>(); }

TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cuda_v2_implementation()); });

}  // namespace tessera::paged_attention
