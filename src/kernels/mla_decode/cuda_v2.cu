// mla_decode: the cuda backend, version 2 — the shared split-KV decode (primitives/cuda_split_kv.cuh,
// also paged_attention's cuda_v2) on MLA's layout: one latent kv head (Hkv = 1, G = Hq), values the
// first Dv dims of the cached row (v = k, both rows D apart).
//
// v1 (cuda.cu) stages each key in shared memory behind two barriers and warp-reduces one dot product
// per (key, query row): B 128, Hq 128, T 4096, D 576 / Dv 512 took 75 ms on an H200, 0.2 % of the
// roofline (docs/gpu_results/2026-11-27-tenth). Here 4 query heads share an item, keys are chunked
// across blocks, one key per lane, no barrier per key. CUDA cores, f32 math (FlashMLA's tensor-core
// layout is the next step). Verified on an H200 (2026-11-28: parity, memcheck, racecheck, initcheck;
// 2.4x v1): the default, v1 its fallback (docs/kernels/mla_decode.md, cuda v2).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "core/trace_nvtx.h"
#include "kernels/mla_decode/impl.h"
#include "primitives/cuda_available.h"
#include "primitives/cuda_split_kv.cuh"
#include "tessera/error.h"

namespace tessera::mla_decode {
namespace {

namespace skv = primitives::cuda::split_kv;
using Lim = skv::Limits<576, 512>;  // DeepSeek's D (512 latent + 64 rotary) and Dv
constexpr int kMaxRows = 4;         // query heads an item: 4 × 512 / 32 columns of o per lane
constexpr const char* kIndexCopy = "mla_decode cuda_v2 copies the page table and its work list to the device";

[[noreturn]] void fail(const std::string& msg) {
  throw Error(ErrorCode::kUnsupported, std::string(kKernelName) + " (cuda_v2): " + msg);
}

// q and o of T; the cache of T or f8e4m3.
template <class T>
void run_for(const Problem& p, const skv::Params& k, const std::vector<skv::Seq>& seqs) {
  const auto st = static_cast<cudaStream_t>(p.stream);
  const size_t npt = static_cast<size_t>(p.B * p.max_pages);
  const char* what = "mla_decode (cuda_v2): copy of the work list";
  if (p.cache_dtype == DType::kF8E4M3)
    skv::run<T, __nv_fp8_e4m3, Lim, kMaxRows>(k, seqs, 1, p.page_table, npt, st, p.device.index, what, fail);
  else
    skv::run<T, T, Lim, kMaxRows>(k, seqs, 1, p.page_table, npt, st, p.device.index, what, fail);
}

class CudaV2 final : public primitives::CudaBackend<Implementation> {
 public:
  std::string name() const override { return "cuda_v2"; }
  std::string description() const override {
    return "NVIDIA GPUs: split-KV, keys across the lanes, 4 query heads an item (v2, CUDA cores, f32 math)";
  }
  std::string what_changed() const override {
    return "v1 -> v2: the shared split-KV decode (primitives/cuda_split_kv.cuh): a key per lane, 4 query heads "
           "an item, no barrier per key";
  }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCUDA) return Availability::no("the cuda_v2 backend runs on CUDA device memory");
    if (const Availability a = available(); !a.ok) return a;
    const std::string why = skv::refusal<Lim>(p.D, p.Dv, p.B * p.Sq, p.max_pages * p.page_size,
                                              std::vector<int64_t>(static_cast<size_t>(p.B), p.Sq), 1, p.Hq, kMaxRows,
                                              static_cast<cudaStream_t>(p.stream), kIndexCopy);
    return why.empty() ? Availability::yes() : Availability::no("the cuda_v2 backend: " + why);
  }
  void forward(const Problem& p) const override {
    TESSERA_NVTX_RANGE("mla_decode.cuda_v2.fwd");
    const int dev = p.device.index;
    cuda::DeviceGuard guard(dev);
    for (auto [ptr, what] : {std::pair<const void*, const char*>{p.q, "q"}, {p.kv, "kv_cache"}, {p.o, "o"}, {p.lse, "lse"}})
      cuda::require_accessible(ptr, dev, "mla_decode cuda_v2", what);
    std::vector<skv::Seq> seqs(static_cast<size_t>(p.B));
    for (int64_t b = 0; b < p.B; ++b) seqs[static_cast<size_t>(b)] = {b * p.Sq, p.Sq, p.seqlens[b]};
    skv::Params k{};
    k.q = p.q, k.k = p.kv, k.v = p.kv, k.sinks = nullptr, k.o = p.o, k.o_f32 = p.o_dtype == DType::kF32, k.lse = p.lse;
    k.Hq = p.Hq, k.G = p.Hq, k.D = p.D, k.Dv = p.Dv, k.page_size = p.page_size, k.max_pages = p.max_pages;
    k.k_row = p.D, k.k_head = 0, k.v_row = p.D, k.v_head = 0;
    k.scale = static_cast<float>(p.scale), k.softcap = 0.0f, k.causal = p.causal, k.window = -1;
    k.v_scale = static_cast<float>(p.v_scale);
    k.chunk = p.block_sizes ? p.block_sizes->split_keys : 0;  // the call's split length; 0: the plan's
    if (p.dtype == DType::kF32)
      run_for<float>(p, k, seqs);
    else if (p.dtype == DType::kBF16)
      run_for<__nv_bfloat16>(p, k, seqs);
    else
      run_for<__half>(p, k, seqs);
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cuda_v2_implementation() { return primitives::make_cuda<CudaV2>(); }

TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cuda_v2_implementation()); });

}  // namespace tessera::mla_decode
