// attention: the cuda backend, version 1 (CUDA-core kernels, f32 math; cuda_kernels.cuh).
// Design, limits and what is verified: docs/kernels/attention.md, section "cuda backend".
//
// Forward: forward_kernel (online softmax over key tiles). Backward, deterministic (no atomics):
//   1. delta_kernel   Δ = rowsum(dO ∘ o) into f32 scratch (lse layout)
//   2. dq_kernel      per query block: recompute P from lse, dS = P·(dP − Δ), dq = dS·K
//   3. dkdv_kernel    per key block: dv = Pᵀ·dO, dk = dSᵀ·Q over every query head of the group
//   4. dbias_kernel   when dbias is asked for: a thread (or, for broadcast biases, a warp) per
//                     dbias element sums its dS terms in a fixed order
// Everything is stream-ordered on Problem::stream; the only host-to-device traffic is the copy of
// the varlen offsets (cu_seqlens are host memory in Problem) into stream-ordered scratch, through
// an owned pinned staging buffer; a varlen call on a stream being captured is refused.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "primitives/cuda_available.h"
#include "core/trace_nvtx.h"
#include "kernels/attention/cuda_access.h"
#include "kernels/attention/cuda_kernels.cuh"
#include "kernels/attention/impl.h"
#include "tessera/error.h"

namespace tessera::attention {
namespace {

namespace ck = cuda_kernels;

constexpr int kMinComputeMajor = 8;  // bf16 conversions; the fatbin holds sm_90a + compute_80 PTX
constexpr int kDefaultSmem = 48 * 1024;  // above this a kernel must opt in to more shared memory

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, std::string(kKernelName) + " (cuda): " + msg);
}

// ---- device facts (cached per device) ----

struct DeviceFacts {
  bool ok = false;
  std::string why;
  int max_smem_optin = 0;  // bytes of shared memory one CTA may use
};

DeviceFacts query_facts(int device) {
  DeviceFacts f;
  std::string why;
  const int count = cuda::device_count(&why);
  int major = 0, minor = 0;
  if (count == 0) {
    f.why = why;
  } else if (device >= count) {
    f.why = "cuda:" + std::to_string(device) + " does not exist (" + std::to_string(count) + " CUDA device(s))";
  } else if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
             cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
             cudaDeviceGetAttribute(&f.max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
                 cudaSuccess) {
    (void)cudaGetLastError();
    f.why = "could not query the attributes of cuda:" + std::to_string(device);
  } else if (major < kMinComputeMajor) {
    f.why = "cuda:" + std::to_string(device) + " has compute capability " + std::to_string(major) + "." +
            std::to_string(minor) + "; the attention cuda backend needs 8.0 or newer";
  } else {
    f.ok = true;
  }
  return f;
}

// By value: the cache may grow (reallocate) once the lock is released.
DeviceFacts device_facts(int device) {
  static std::mutex mu;
  static std::vector<DeviceFacts> cache;
  static std::vector<bool> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto i = static_cast<size_t>(device);
  if (i >= cache.size()) cache.resize(i + 1), known.resize(i + 1, false);
  if (!known[i]) cache[i] = query_facts(device), known[i] = true;
  return cache[i];
}

// ---- kernel variants: per-lane (per-thread) column counts chosen from the head dims ----

int widest(const Problem& p) { return static_cast<int>(std::max(p.D, p.Dv)); }

// Row kernels: lanes hold columns lane + 32·c, c < C, so C = ceil(max(D, Dv) / 32) rounded up to 2, 4, 8.
int row_chunks(const Problem& p) { return widest(p) <= 64 ? 2 : widest(p) <= 128 ? 4 : 8; }

// dk/dv kernel: G warps, each thread C columns, G·C >= max(D, Dv).
struct KeyShape {
  int G, C;
};
KeyShape key_shape(const Problem& p) {
  const int w = widest(p);
  if (w <= 32) return {4, 8};
  if (w <= 64) return {4, 16};
  if (w <= 128) return {4, 32};
  return {8, 32};
}

size_t forward_smem(const Problem& p) { return ck::forward_smem_bytes(static_cast<int>(p.D), static_cast<int>(p.Dv)); }
size_t backward_smem(const Problem& p) {
  return std::max(ck::dq_smem_bytes(static_cast<int>(p.D), static_cast<int>(p.Dv)),
                  ck::dkdv_smem_bytes(key_shape(p).G, static_cast<int>(p.D), static_cast<int>(p.Dv)));
}

// Lets `kernel` use `bytes` of dynamic shared memory (an opt-in above 48 KiB).
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* what) {
  if (bytes <= static_cast<size_t>(kDefaultSmem)) return;
  cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), what);
}

int elem_type(DType t) {
  switch (t) {
    case DType::kF32: return ck::kF32;
    case DType::kBF16: return ck::kBF16;
    case DType::kF16: return ck::kF16;
    default: fail(ErrorCode::kInternal, std::string("unexpected dtype ") + dtype_name(t));
  }
}

int as_int(int64_t v) { return static_cast<int>(v); }  // ranges checked in supports()

// The kernels' view of a problem; the varlen offsets point at `cu` (device scratch).
ck::Params params_of(const Problem& p, const int32_t* cu) {
  ck::Params k;
  k.N = as_int(p.N), k.Sq = as_int(p.Sq), k.Sk = as_int(p.Sk);
  k.cu_q = p.varlen ? cu : nullptr;
  k.cu_k = p.varlen ? cu + p.N + 1 : nullptr;
  k.total_q = p.total_q;
  k.Hq = as_int(p.Hq), k.Hkv = as_int(p.Hkv), k.group = as_int(p.group()), k.D = as_int(p.D), k.Dv = as_int(p.Dv);
  k.q = p.q, k.k = p.k, k.v = p.v, k.in_t = elem_type(p.dtype);
  k.alibi = p.alibi, k.alibi_stride = p.alibi_seq_stride;
  k.seg_q = p.seg_q, k.seg_k = p.seg_k;
  k.scale = static_cast<float>(p.scale), k.softcap = static_cast<float>(p.softcap);
  k.causal = p.causal, k.wl = p.window_left, k.wr = p.window_right;
  if (p.dropout()) {  // the seed is device memory (the inputs'), read by the kernels
    k.drop_seed = p.dropout_seed, k.drop_threshold = p.dropout_threshold;
    k.drop_scale = static_cast<float>(1.0 / (1.0 - p.dropout_p));
  }
  if (p.bias) {  // dense form only (api.cc)
    k.bias = p.bias, k.bias_t = elem_type(p.bias_dtype);
    for (int d = 0; d < 4; ++d) k.bias_stride[d] = p.bias_stride[d], k.bias_shape[d] = as_int(p.bias_shape[d]);
  }
  return k;
}

// What a varlen call does that a CUDA graph capture cannot record.
constexpr const char* kVarlenCopy = "a varlen call copies cu_seqlens from host memory to the device";

// Device copies of the varlen offsets (cu_q then cu_k, N+1 each), or an empty buffer (dense).
// cu_seqlens are host memory (pageable or pinned) that the caller may change once the call
// returns: they go through Tessera's own pinned staging buffer (cuda::copy_host_to_device), and
// a stream being captured is refused there (the graph would replay stale offsets).
cuda::DeviceBuffer copy_offsets(const Problem& p, cudaStream_t stream, int dev) {
  if (!p.varlen) return {};
  if (const std::string why = cuda::capture_refusal(stream, kVarlenCopy); !why.empty())
    fail(ErrorCode::kUnsupported, why);
  const size_t n = static_cast<size_t>(p.N + 1);
  std::vector<int32_t> both(2 * n);  // one staged copy instead of two
  std::copy(p.cu_q, p.cu_q + n, both.begin());
  std::copy(p.cu_k, p.cu_k + n, both.begin() + static_cast<std::ptrdiff_t>(n));
  cuda::DeviceBuffer buf(both.size() * sizeof(int32_t), stream, dev);
  cuda::copy_host_to_device(buf.get(), both.data(), buf.bytes(), stream, dev, "attention (cuda): copy of cu_seqlens");
  return buf;
}

const std::string kWho = std::string(kKernelName) + " (cuda)";  // prefixes the pointer checks' errors

int q_blocks(const Problem& p) { return as_int((p.Sq + ck::kRowsPerBlock - 1) / ck::kRowsPerBlock); }
int k_blocks(const Problem& p) { return as_int((p.Sk + ck::kBwdKeys - 1) / ck::kBwdKeys); }

// ---- launches ----

template <int C>
void launch_forward_c(const ck::Params& k, const Problem& p, cudaStream_t stream) {
  const size_t smem = forward_smem(p);
  allow_smem(ck::forward_kernel<C>, smem, "cudaFuncSetAttribute (attention forward_kernel)");
  const dim3 grid(static_cast<unsigned>(p.N) * static_cast<unsigned>(q_blocks(p)), static_cast<unsigned>(p.Hq));
  ck::forward_kernel<C><<<grid, ck::kRowWarps * ck::kWarp, smem, stream>>>(k, q_blocks(p));
  cuda::check_launch("attention forward_kernel", stream);
}

void launch_forward(const ck::Params& k, const Problem& p, cudaStream_t stream) {
  TESSERA_NVTX_RANGE("attn.cuda.forward_kernel");
  if (p.N == 0 || p.Sq == 0) return;
  switch (row_chunks(p)) {
    case 2: launch_forward_c<2>(k, p, stream); break;
    case 4: launch_forward_c<4>(k, p, stream); break;
    default: launch_forward_c<8>(k, p, stream); break;
  }
}

void launch_dbias(const ck::Params& k, const Problem& p, cudaStream_t stream) {
  TESSERA_NVTX_RANGE("attn.cuda.dbias");
  constexpr int kThreads = 128;
  const int64_t count = p.bias_numel();
  if (count == 0) return;  // no keys or rows: nothing to write (a grid of 0 blocks is a launch error)
  // A warp per element where each sums at least a warp's worth of terms (broadcast biases).
  const bool warp_each = ck::dbias_terms(k) >= ck::kWarp;
  const int64_t threads = count * (warp_each ? ck::kWarp : 1);
  const int64_t grid = (threads + kThreads - 1) / kThreads;
  if (grid > INT_MAX)
    fail(ErrorCode::kUnsupported, "attention (cuda): dbias of " + std::to_string(count) + " elements needs " +
                                      std::to_string(grid) + " blocks, over the grid's 2^31 - 1");
  const auto blocks = static_cast<unsigned>(grid);
  if (warp_each)
    ck::dbias_kernel<true><<<blocks, kThreads, 0, stream>>>(k, count);
  else
    ck::dbias_kernel<false><<<blocks, kThreads, 0, stream>>>(k, count);
  cuda::check_launch("attention dbias_kernel", stream);
}

void launch_delta(const ck::Params& k, const Problem& p, cudaStream_t stream) {
  TESSERA_NVTX_RANGE("attn.cuda.delta");
  const int64_t warps = p.total_q * p.Hq;
  if (warps == 0) return;
  const auto blocks = static_cast<unsigned>((warps + ck::kDeltaWarps - 1) / ck::kDeltaWarps);
  ck::delta_kernel<<<blocks, ck::kDeltaWarps * ck::kWarp, 0, stream>>>(k);
  cuda::check_launch("attention delta_kernel", stream);
}

template <int C>
void launch_dq_c(const ck::Params& k, const Problem& p, cudaStream_t stream) {
  const size_t smem = ck::dq_smem_bytes(k.D, k.Dv);
  allow_smem(ck::dq_kernel<C>, smem, "cudaFuncSetAttribute (attention dq_kernel)");
  const dim3 grid(static_cast<unsigned>(p.N) * static_cast<unsigned>(q_blocks(p)), static_cast<unsigned>(p.Hq));
  ck::dq_kernel<C><<<grid, ck::kRowWarps * ck::kWarp, smem, stream>>>(k, q_blocks(p));
  cuda::check_launch("attention dq_kernel", stream);
}

void launch_dq(const ck::Params& k, const Problem& p, cudaStream_t stream) {
  TESSERA_NVTX_RANGE("attn.cuda.dq");
  if (p.N == 0 || p.Sq == 0) return;
  switch (row_chunks(p)) {
    case 2: launch_dq_c<2>(k, p, stream); break;
    case 4: launch_dq_c<4>(k, p, stream); break;
    default: launch_dq_c<8>(k, p, stream); break;
  }
}

template <int G, int C>
void launch_dkdv_gc(const ck::Params& k, const Problem& p, cudaStream_t stream) {
  const size_t smem = ck::dkdv_smem_bytes(G, k.D, k.Dv);
  allow_smem(ck::dkdv_kernel<G, C>, smem, "cudaFuncSetAttribute (attention dkdv_kernel)");
  const dim3 grid(static_cast<unsigned>(p.N) * static_cast<unsigned>(k_blocks(p)), static_cast<unsigned>(p.Hkv));
  ck::dkdv_kernel<G, C><<<grid, G * ck::kWarp, smem, stream>>>(k, k_blocks(p));
  cuda::check_launch("attention dkdv_kernel", stream);
}

void launch_dkdv(const ck::Params& k, const Problem& p, cudaStream_t stream) {
  TESSERA_NVTX_RANGE("attn.cuda.dkdv");
  if (p.N == 0 || p.Sk == 0) return;
  const KeyShape ks = key_shape(p);
  if (ks.G == 8) return launch_dkdv_gc<8, 32>(k, p, stream);
  switch (ks.C) {
    case 8: launch_dkdv_gc<4, 8>(k, p, stream); break;
    case 16: launch_dkdv_gc<4, 16>(k, p, stream); break;
    default: launch_dkdv_gc<4, 32>(k, p, stream); break;
  }
}

// ---- the implementation ----

class Cuda final : public primitives::CudaBackend<Implementation> {
 public:
  std::string name() const override { return "cuda"; }
  std::string description() const override {
    return "NVIDIA GPUs (sm_80+): flash-style online softmax over key tiles, CUDA-core f32 math (v1, no tensor "
           "cores yet); deterministic backward without atomics; D, Dv <= 256";
  }


  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCUDA)
      return Availability::no("inputs are on " + p.device.str() + "; the cuda backend needs CUDA device memory");
    const DeviceFacts f = device_facts(p.device.index);
    if (!f.ok) return Availability::no(f.why);
    if (p.varlen)
      if (const std::string why = cuda::capture_refusal(static_cast<cudaStream_t>(p.stream), kVarlenCopy); !why.empty())
        return Availability::no(why);
    if (p.D > ck::kMaxHeadDim || p.Dv > ck::kMaxHeadDim)
      return Availability::no("the cuda backend supports head dims D <= " + std::to_string(ck::kMaxHeadDim) +
                              " and Dv <= " + std::to_string(ck::kMaxHeadDim) + ", got D=" + std::to_string(p.D) +
                              ", Dv=" + std::to_string(p.Dv));
    if (p.Hq > 65535 || p.Hkv > 65535)
      return Availability::no("the cuda backend takes at most 65535 heads (a grid dimension), got Hq=" +
                              std::to_string(p.Hq));
    if (p.Sq >= INT_MAX || p.Sk >= INT_MAX || p.N >= INT_MAX ||
        p.N * std::max<int64_t>(q_blocks(p), k_blocks(p)) >= INT_MAX)
      return Availability::no("sequence lengths and counts must be < 2^31 (grid size) on the cuda backend");
    const size_t smem = std::max(forward_smem(p), backward_smem(p));
    if (smem > static_cast<size_t>(f.max_smem_optin))
      return Availability::no("D=" + std::to_string(p.D) + ", Dv=" + std::to_string(p.Dv) + " need " +
                              std::to_string(smem) + " bytes of shared memory per block; cuda:" +
                              std::to_string(p.device.index) + " allows " + std::to_string(f.max_smem_optin));
    return Availability::yes();
  }

  // v1 has fixed tiles: 16 query rows per block (4 warps × 4 rows) and 32 keys per tile (one per
  // lane); the backward's dk/dv blocks are 32 keys × 16 query rows.
  BlockSizes default_block_sizes(const Problem&) const override { return {ck::kRowsPerBlock, ck::kKeysPerTile}; }

  void validate_block_sizes(const BlockSizes& bs) const override {
    if (bs.q != ck::kRowsPerBlock || bs.kv != ck::kKeysPerTile)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(kKernelName) + " cuda: invalid block sizes: this version has fixed tiles q=" +
                      std::to_string(ck::kRowsPerBlock) + " (query rows per block), kv=" +
                      std::to_string(ck::kKeysPerTile) + " (keys per tile); got " + bs.str());
  }

  void forward(const Problem& p, const BlockSizes& bs, const ForwardOut& out) const override {
    TESSERA_NVTX_RANGE("attn.cuda.fwd");
    validate_block_sizes(bs);
    cuda::DeviceGuard guard(p.device.index);
    cuda_access::forward(p, out, kWho);
    const auto stream = static_cast<cudaStream_t>(p.stream);
    const cuda::DeviceBuffer cu = copy_offsets(p, stream, p.device.index);
    ck::Params k = params_of(p, static_cast<const int32_t*>(cu.get()));
    k.o = out.o, k.o_t = elem_type(out.o_dtype), k.lse = out.lse;
    launch_forward(k, p, stream);
  }

  void backward(const Problem& p, const BlockSizes& bs, const BackwardIn& in, const GradOut& out) const override {
    TESSERA_NVTX_RANGE("attn.cuda.bwd");
    validate_block_sizes(bs);
    const int dev = p.device.index;
    cuda::DeviceGuard guard(dev);
    cuda_access::backward(p, in, out, kWho);
    const auto stream = static_cast<cudaStream_t>(p.stream);
    const cuda::DeviceBuffer cu = copy_offsets(p, stream, dev);
    const cuda::DeviceBuffer delta(static_cast<size_t>(std::max<int64_t>(1, p.Hq * p.total_q)) * sizeof(float), stream,
                                   dev);
    ck::Params k = params_of(p, static_cast<const int32_t*>(cu.get()));
    k.o_in = in.o, k.o_in_t = elem_type(in.o_dtype), k.lse_in = in.lse;
    k.dout = in.grad_o, k.dout_t = elem_type(in.grad_o_dtype);
    k.delta = static_cast<float*>(delta.get());
    k.dq = out.dq, k.dq_t = elem_type(out.dq_dtype);
    k.dk = out.dk, k.dk_t = elem_type(out.dk_dtype);
    k.dv = out.dv, k.dv_t = elem_type(out.dv_dtype);
    launch_delta(k, p, stream);
    launch_dq(k, p, stream);
    launch_dkdv(k, p, stream);
    if (out.dbias) {
      k.dbias = out.dbias, k.dbias_t = elem_type(out.dbias_dtype);
      launch_dbias(k, p, stream);
    }
    // Scratch is released stream-ordered (cudaFreeAsync) when cu / delta go out of scope.
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cuda_implementation() { return primitives::make_cuda<Cuda>(); }

// The CUDA module (core/cuda_module.h) registers this implementation when it is loaded; it takes
// the place of the "cuda" placeholder declared in implementations.cc.
TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cuda_implementation()); });

}  // namespace tessera::attention
