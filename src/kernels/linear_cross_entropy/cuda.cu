// linear_cross_entropy: the cuda backend (first design: cuBLAS GEMMs over token chunks + our
// row-wise kernels). Design, tolerances and limits: docs/kernels/linear_cross_entropy.md,
// section "cuda backend".
//
// Per chunk of `rows` tokens (sized from Problem::memory_budget):
//   1. Z = x_c · W            cuBLAS, f32 output, f32 accumulation        [rows, V] f32 scratch
//   2. row_kernel             bias, soft cap, online lse, label pick, Σz, argmax, row loss; for
//                             gradients the logit gradient g (f32 math) stored in place over Z in
//                             the GEMM operand dtype
//   3. dbias += Σ_rows g      colsum_kernel (deterministic, f32)
//   4. dx_c = α · g · Wᵀ      cuBLAS, written straight in dx's dtype (complete per chunk)
//   5. dw  += α · x_cᵀ · g    cuBLAS into an f32 accumulator (dw itself when dw is f32)
// A prologue kernel checks the labels and reduces Σ weights (mean denominator), the largest row
// factor |weight·upstream| (it sets the f16 gradient's scale, cuda_plan.h) and the upstream
// scalar on the device; one host synchronization fetches them (labels must be validated before
// any output is written, and α is a host scalar of the GEMMs); that synchronization is why a
// stream being captured into a CUDA graph is refused with a clear error. Everything else is
// stream-ordered on Problem::stream.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "primitives/cuda_available.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/trace_nvtx.h"
#include "kernels/linear_cross_entropy/cuda_kernels.cuh"
#include "kernels/linear_cross_entropy/cuda_plan.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "tessera/error.h"

namespace tessera::linear_cross_entropy {
namespace {

namespace ck = cuda_kernels;

namespace plan = cuda_plan;

constexpr int kMinComputeMajor = 8;  // bf16 tensor cores; the fatbin holds sm_90a + compute_80 PTX
static_assert(sizeof(ck::Scalars) <= plan::kScalarsBytes, "cuda_plan.h: kScalarsBytes too small");

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, std::string(kKernelName) + " (cuda): " + msg);
}

// ---- cuBLAS (handles, checks and the GEMM wrapper live in core/cuda_util) ----

// cublasGemmEx on one leased handle with one compute type; operands as cuda::GemmOperand.
struct Gemm {
  cublasHandle_t h;
  cublasComputeType_t compute;
  void operator()(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, float alpha,
                  cuda::GemmOperand a, cuda::GemmOperand b, float beta, void* c, cudaDataType ct, int64_t ldc,
                  const char* what) const {
    TESSERA_NVTX_RANGE(what);
    cuda::gemm_ex(h, compute, ta, tb, m, n, k, alpha, a, b, beta, c, ct, ldc, what);
  }
};

// ---- device facts (cached) ----

struct DeviceFacts {
  bool ok = false;
  std::string why;
  int major = 0, minor = 0;
};

// Returned by value: the cache may be resized (reallocated) by another thread once the lock is
// released, so a reference into it would dangle.
DeviceFacts device_facts(int device) {
  static std::mutex mu;
  static std::vector<DeviceFacts> cache;
  static std::vector<bool> known;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(cache.size())) {
    cache.resize(static_cast<size_t>(device) + 1);
    known.resize(static_cast<size_t>(device) + 1, false);
  }
  DeviceFacts& f = cache[static_cast<size_t>(device)];
  if (!known[static_cast<size_t>(device)]) {
    known[static_cast<size_t>(device)] = true;
    std::string why;
    const int n = cuda::device_count(&why);
    if (n == 0) {
      f.why = why;
    } else if (device >= n) {
      f.why = "cuda:" + std::to_string(device) + " does not exist (" + std::to_string(n) + " CUDA device(s))";
    } else if (cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
               cudaDeviceGetAttribute(&f.minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      f.why = "could not query the compute capability of cuda:" + std::to_string(device);
    } else if (f.major < kMinComputeMajor) {
      f.why = "cuda:" + std::to_string(device) + " has compute capability " + std::to_string(f.major) + "." +
              std::to_string(f.minor) + "; the cuda backend needs 8.0 or newer";
    } else {
      f.ok = true;
    }
  }
  return f;
}

int cc_major(int device) { return device_facts(device).major; }

// ---- planning (the arithmetic is in cuda_plan.h, tested on the host) ----

size_t budget_of(const Problem& p) { return p.memory_budget ? p.memory_budget : plan::kDefaultBudget; }

int cc_major(int device);  // below: the device's compute capability (0 if unknown)

// What this call needs besides the logits chunk.
plan::ScratchNeeds needs_of(const Problem& p, bool fwd, bool grad, const GradOut* go) {
  plan::ScratchNeeds n;
  n.B = p.B;
  n.V = p.V;
  n.row_losses = fwd && p.reduction != Reduction::kNone;
  n.dbias_acc = grad && p.bias && go->dbias && go->dbias_dtype != DType::kF32;
  n.cc_major = cc_major(p.device.index);
  return n;
}

// The most any call on `p` can need (supports() and the default block sizes).
plan::ScratchNeeds worst_needs(const Problem& p) {
  plan::ScratchNeeds n = plan::worst_case_needs(p.B, p.V, p.reduction != Reduction::kNone, p.bias != nullptr);
  n.cc_major = cc_major(p.device.index);
  return n;
}

int64_t chunk_rows(const Problem& p, const BlockSizes& bs, const plan::ScratchNeeds& n) {
  const int64_t rows = plan::chunk_rows(plan::budget_rows(n, budget_of(p)), p.B, bs.b);
  if (rows <= 0)
    fail(ErrorCode::kUnsupported,
         "memory_budget of " + std::to_string(budget_of(p)) + " bytes does not hold one row of f32 logits (" +
             std::to_string(plan::logits_row_stride(p.V) * 4) + " bytes) plus " +
             std::to_string(plan::scratch_layout(n, budget_of(p), 0).bytes) +
             " bytes of fixed scratch (cuBLAS workspace included); raise Options::memory_budget");
  return rows;
}

void check_accessible(const void* ptr, int device, const char* what) {
  cuda::require_accessible(ptr, device, std::string(kKernelName) + " (cuda)", what);
}

// Why a call on `stream` cannot run now ("" when it can): a call synchronizes the host once (the
// label check and the GEMMs' host scalars), which a CUDA graph capture cannot record, so a
// capturing stream is refused before anything is queued on it (the capture stays valid).
std::string capture_problem(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cannot tell whether the stream is being captured into a CUDA graph (cudaStreamIsCapturing: ") +
           cudaGetErrorString(e) + "; the legacy stream while another stream captures?)";
  }
  if (status == cudaStreamCaptureStatusNone) return "";
  return "the stream is being captured into a CUDA graph, and the cuda backend synchronizes the host once per "
         "call (label check, GEMM scalars), which a capture cannot record: call it outside the capture";
}

template <class OutT>
void launch_rows(const ck::RowParams& rp, int64_t n, cudaStream_t stream) {
  TESSERA_NVTX_RANGE("lce.cuda.rows");
  const dim3 grid(static_cast<unsigned>(n));
  ck::row_kernel<OutT><<<grid, ck::kRowThreads, 0, stream>>>(rp);
}

template <class OutT>
void launch_colsum(const void* g, int64_t ld, int64_t rows, int64_t V, float alpha, float* acc, cudaStream_t s) {
  TESSERA_NVTX_RANGE("lce.cuda.dbias");
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((V + threads - 1) / threads);
  ck::colsum_kernel<OutT><<<blocks, threads, 0, s>>>(static_cast<const OutT*>(g), ld, rows, V, alpha, acc);
}

void launch_convert(const float* src, void* dst, DType t, int64_t n, cudaStream_t s) {
  TESSERA_NVTX_RANGE("lce.cuda.convert");
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, 65535));
  switch (t) {
    case DType::kBF16:
      ck::convert_kernel<__nv_bfloat16><<<blocks, threads, 0, s>>>(src, static_cast<__nv_bfloat16*>(dst), n);
      break;
    case DType::kF16: ck::convert_kernel<__half><<<blocks, threads, 0, s>>>(src, static_cast<__half*>(dst), n); break;
    default: fail(ErrorCode::kInternal, "convert to f32 requested");
  }
}

int bias_type(const Problem& p) {
  if (!p.bias) return ck::kBiasNone;
  switch (p.bias_dtype) {
    case DType::kF32: return ck::kBiasF32;
    case DType::kBF16: return ck::kBiasBF16;
    default: return ck::kBiasF16;
  }
}

// Between calls the scratch pool keeps at most this call's memory budget (or the pool's own
// release threshold, whichever is larger): what is already freed in stream order beyond it (the
// f32 dw accumulator) goes back to the driver now; the rest at the next synchronization.
void keep_at_most_budget(const Problem& p) {
  cuda::trim_scratch(p.device.index, std::max<uint64_t>(budget_of(p), cuda::pool_keep_bytes()));
}

class Cuda final : public primitives::CudaBackend<Implementation> {
 public:
  std::string name() const override { return "cuda"; }
  bool skips_gradients() const override { return true; }
  std::string description() const override {
    return "NVIDIA GPUs (sm_80+, tuned for Hopper): cuBLAS GEMMs over token chunks sized by "
           "memory_budget + row-wise CUDA kernels; f32 logits and accumulation";
  }


  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCUDA)
      return Availability::no("inputs are on " + p.device.str() + "; the cuda backend needs CUDA device memory");
    const DeviceFacts f = device_facts(p.device.index);
    if (!f.ok) return Availability::no(f.why);
    if (const std::string why = capture_problem(p.stream); !why.empty()) return Availability::no(why);
    if (!is_float(p.dtype)) return Availability::no(std::string("dtype ") + dtype_name(p.dtype) + " is not supported");
    if (p.class_weights) return Availability::no("class weights with label smoothing are not implemented on the device");
    if (p.partial()) return Availability::no("the vocab-parallel partial form is not implemented on the device yet");
    if (2 * plan::logits_row_stride(p.V) > INT_MAX || p.H > INT_MAX)
      return Availability::no("V=" + std::to_string(p.V) + ", H=" + std::to_string(p.H) +
                              " exceed the cuBLAS int range (V < 2^30, H < 2^31)");
    if (plan::budget_rows(worst_needs(p), budget_of(p)) < 1)
      return Availability::no("memory_budget " + std::to_string(budget_of(p)) +
                              " bytes is smaller than one row of f32 logits (4·V bytes) plus fixed scratch "
                              "(cuBLAS workspace, row losses, dbias accumulator)");
    return Availability::yes();
  }

  BlockSizes default_block_sizes(const Problem& p) const override {
    BlockSizes bs;
    bs.b = std::max<int64_t>(1, std::min(p.B, plan::budget_rows(worst_needs(p), budget_of(p))));
    bs.h = p.H;
    bs.v = p.V;
    return bs;
  }

  // The chunk size b (tokens per chunk) is tunable: bigger chunks make bigger GEMMs, smaller
  // ones keep the logits chunk in L2 longer; memory_budget caps it either way (chunk_rows).
  bool tunable() const override { return true; }
  std::vector<BlockSizes> candidate_block_sizes(const Problem& p) const override {
    std::vector<BlockSizes> out;
    for (const int64_t b : plan::chunk_candidates(p.B, plan::budget_rows(worst_needs(p), budget_of(p))))
      out.push_back({b, p.H, p.V});
    return out;
  }
  void synchronize(const Problem& p) const override {
    cuda::DeviceGuard g(p.device.index);
    cuda::check(cudaStreamSynchronize(static_cast<cudaStream_t>(p.stream)),
                "linear_cross_entropy cuda: cudaStreamSynchronize");
  }

  void validate_block_sizes(const BlockSizes& bs) const override {
    if (bs.b < 1)
      throw Error(ErrorCode::kInvalidArgument,
                  "cuda: block b (max tokens per chunk) must be >= 1, got " + std::to_string(bs.b));
    if (bs.h < 1 || bs.v < 1)
      throw Error(ErrorCode::kInvalidArgument, "cuda: block h and v must be >= 1 (they are not used), got " + bs.str());
  }

  void forward(const Problem& p, const BlockSizes& bs, const ForwardOut& out) const override {
    run(p, bs, &out, nullptr, nullptr);
    keep_at_most_budget(p);
  }
  void backward(const Problem& p, const BlockSizes& bs, const GradIn& g, const GradOut& out) const override {
    run(p, bs, nullptr, &g, &out);
    keep_at_most_budget(p);
  }
  void forward_backward(const Problem& p, const BlockSizes& bs, const GradIn& g, const ForwardOut& fout,
                        const GradOut& gout) const override {
    run(p, bs, &fout, &g, &gout);
    keep_at_most_budget(p);
  }

 private:
  void run(const Problem& p, const BlockSizes& bs, const ForwardOut* fo, const GradIn* gi,
           const GradOut* go) const;
};

void Cuda::run(const Problem& p, const BlockSizes& bs, const ForwardOut* fo, const GradIn* gi,
               const GradOut* go) const {
  TESSERA_NVTX_RANGE("lce.cuda");
  if (const std::string why = capture_problem(p.stream); !why.empty()) fail(ErrorCode::kUnsupported, why);
  const int dev = p.device.index;
  cuda::DeviceGuard guard(dev);
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const bool fwd = fo != nullptr;
  const bool grad = go != nullptr;
  const int64_t B = p.B, H = p.H, V = p.V;
  const size_t esize = dtype_size(p.dtype);

  // Every pointer must be device memory (the API cannot inspect device views).
  check_accessible(p.x, dev, "x");
  check_accessible(p.w, dev, "w");
  check_accessible(p.labels, dev, "labels");
  if (p.bias) check_accessible(p.bias, dev, "bias");
  if (p.weights) check_accessible(p.weights, dev, "weights");
  if (fwd) {
    check_accessible(fo->loss, dev, "loss");
    check_accessible(fo->lse, dev, "lse");
    if (fo->argmax) check_accessible(fo->argmax, dev, "argmax");
  }
  if (grad) {
    check_accessible(gi->grad_loss, dev, "grad_loss");
    if (gi->lse) check_accessible(gi->lse, dev, "lse (backward input)");
    if (go->dx) check_accessible(go->dx, dev, "dx");  // a gradient left out is null (GradOut)
    if (go->dw) check_accessible(go->dw, dev, "dw");
    if (go->dbias) check_accessible(go->dbias, dev, "dbias");
  }

  // An empty batch never reaches here through the API (it answers B = 0 itself); a direct caller
  // gets the same outputs instead of a misleading budget error and an unwritten dw.
  if (B == 0) {
    if (fwd && p.reduction != Reduction::kNone)
      cuda::check(cudaMemsetAsync(fo->loss, 0, sizeof(float), stream), "loss zeroing (empty batch)");
    if (grad && go->dw)
      cuda::check(cudaMemsetAsync(go->dw, 0, static_cast<size_t>(H) * static_cast<size_t>(V) * dtype_size(go->dw_dtype),
                                  stream),
                  "dw zeroing (empty batch)");
    if (grad && go->dbias)
      cuda::check(cudaMemsetAsync(go->dbias, 0, static_cast<size_t>(V) * dtype_size(go->dbias_dtype), stream),
                  "dbias zeroing (empty batch)");
    return;
  }

  // ---- plan and scratch (all before any output is written) ----
  const plan::ScratchNeeds needs = needs_of(p, fwd, grad, go);
  const int64_t rows = chunk_rows(p, bs, needs);
  const plan::ScratchLayout lay = plan::scratch_layout(needs, budget_of(p), rows);
  const bool need_row_loss = needs.row_losses;
  const bool dbias_acc_needed = needs.dbias_acc;
  const bool dw_acc_needed = grad && go->dw && go->dw_dtype != DType::kF32;

  cuda::DeviceBuffer ws(lay.bytes, stream, dev);
  char* base = static_cast<char*>(ws.get());
  base += (plan::kAlign - reinterpret_cast<uintptr_t>(base) % plan::kAlign) % plan::kAlign;  // slack is in lay.bytes
  auto* scalars_dev = reinterpret_cast<ck::Scalars*>(base + lay.scalars);
  float* row_loss = need_row_loss ? reinterpret_cast<float*>(base + lay.row_loss) : nullptr;
  float* dbias_acc = dbias_acc_needed ? reinterpret_cast<float*>(base + lay.dbias) : nullptr;
  float* logits = reinterpret_cast<float*>(base + lay.logits);

  // The f32 dw accumulator (only when dw is stored in bf16/f16: accumulating chunk after chunk
  // in 16 bits drifts). It is 4·H·V bytes on top of the budget; an f32 dw avoids it.
  cuda::DeviceBuffer dw_acc_buf;
  if (dw_acc_needed) {
    const size_t bytes = static_cast<size_t>(H) * static_cast<size_t>(V) * sizeof(float);
    if (lay.bytes + bytes > budget_of(p))
      log::warn_once(std::string(kKernelName) + " (cuda): dw is " + dtype_name(go->dw_dtype) +
                     ", so gradients are accumulated in an f32 copy of dw (" + std::to_string(bytes) +
                     " bytes) on top of memory_budget; pass an f32 dw to avoid it");
    dw_acc_buf = cuda::DeviceBuffer(bytes, stream, dev);
  }

  // ---- prologue: label check, Σ weights, upstream scalar; one synchronization ----
  const bool per_row_upstream = grad && p.reduction == Reduction::kNone;
  ck::prologue_kernel<<<1, ck::kReduceThreads, 0, stream>>>(
      p.labels, p.label_dtype == DType::kI32, p.weights, B, V, p.ignore_index,
      grad && !per_row_upstream ? gi->grad_loss : nullptr, per_row_upstream ? gi->grad_loss : nullptr, scalars_dev);
  cuda::check_launch("linear_cross_entropy prologue_kernel", stream);
  ck::Scalars sc{};
  cuda::check(cudaMemcpyAsync(&sc, scalars_dev, sizeof(sc), cudaMemcpyDeviceToHost, stream), "copy of the prologue");
  cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after the prologue");
  if (sc.first_bad != ULLONG_MAX) {
    const auto t = static_cast<int64_t>(sc.first_bad);
    int64_t y = 0;
    // Read on `stream` (a plain cudaMemcpy would wait for the legacy stream's work).
    if (p.label_dtype == DType::kI32) {
      int32_t v = 0;
      cuda::check(cudaMemcpyAsync(&v, static_cast<const int32_t*>(p.labels) + t, sizeof(v), cudaMemcpyDeviceToHost,
                                  stream),
                  "label copy");
      cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after the label copy");
      y = v;
    } else {
      cuda::check(cudaMemcpyAsync(&y, static_cast<const int64_t*>(p.labels) + t, sizeof(y), cudaMemcpyDeviceToHost,
                                  stream),
                  "label copy");
      cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after the label copy");
    }
    fail(ErrorCode::kInvalidArgument, "label " + std::to_string(y) + " at token " + std::to_string(t) +
                                          " is outside [0, V=" + std::to_string(V) + ") and is not ignore_index (" +
                                          std::to_string(p.ignore_index) + ")");
  }

  // Gradient scale through the GEMMs: α = (upstream scalar / denominator) / S, where S is the
  // power of two folded into the stored logit gradient (f16 only, chosen from this call's rows).
  const float S = p.dtype == DType::kF16 ? cuda_plan::f16_grad_scale(sc.max_row_factor) : 1.0f;
  float alpha = 1.0f / S;
  if (grad) {
    double g = 1.0;
    if (p.reduction == Reduction::kSum) g = sc.grad_scalar;
    if (p.reduction == Reduction::kMean) g = sc.denom == 0.0 ? 0.0 : static_cast<double>(sc.grad_scalar) / sc.denom;
    alpha = static_cast<float>(g / static_cast<double>(S));
  }

  // ---- GEMM set-up ----
  cuda::BlasHandle blas(dev, stream);
  blas.set_workspace(base + lay.workspace, lay.workspace_bytes);  // counted scratch, not cuBLAS's own
  const Gemm gemm{blas.get(), cuda::blas_compute(p.dtype)};
  const cudaDataType in_t = cuda::blas_type(p.dtype);
  const bool hv = p.layout == WLayout::kHV;
  const cublasOperation_t N = CUBLAS_OP_N, T = CUBLAS_OP_T;

  float* dbias_target = nullptr;
  if (grad && p.bias && go->dbias) {
    dbias_target = dbias_acc ? dbias_acc : static_cast<float*>(go->dbias);
    cuda::check(cudaMemsetAsync(dbias_target, 0, static_cast<size_t>(V) * sizeof(float), stream), "dbias zeroing");
  }
  float* dw_target = grad && go->dw ? (dw_acc_needed ? static_cast<float*>(dw_acc_buf.get()) : static_cast<float*>(go->dw)) : nullptr;

  // Logits rows padded to ldz floats (a multiple of 8: every row 32-byte aligned, also for odd V).
  // The stored logit gradient: OutT = input dtype, row stride ldg elements (in place over Z).
  const int64_t ldz = plan::logits_row_stride(V);
  const int64_t ldg = p.dtype == DType::kF32 ? ldz : 2 * ldz;

  ck::RowParams rp;
  rp.logits = logits;
  rp.V = V;
  rp.ld = ldz;
  rp.bias = p.bias;
  rp.bias_type = bias_type(p);
  rp.labels = p.labels;
  rp.labels_i32 = p.label_dtype == DType::kI32;
  rp.weights = p.weights;
  rp.ignore_index = p.ignore_index;
  rp.softcap = static_cast<float>(p.softcap);
  rp.eps = static_cast<float>(p.label_smoothing);
  rp.zloss = static_cast<float>(p.z_loss_weight);
  if (fwd) {
    rp.lse_out = fo->lse;
    rp.loss_out = p.reduction == Reduction::kNone ? fo->loss : row_loss;
    rp.argmax_out = fo->argmax;
  }
  if (grad) {
    rp.want_grad = true;
    rp.lse_in = fwd ? nullptr : gi->lse;
    rp.grad_rows = p.reduction == Reduction::kNone ? gi->grad_loss : nullptr;
    rp.dz_scale = S;
  }

  for (int64_t c0 = 0; c0 < B; c0 += rows) {
    TESSERA_NVTX_RANGE("lce.cuda.chunk");
    const int64_t n = std::min(rows, B - c0);
    const void* xc = static_cast<const char*>(p.x) + static_cast<size_t>(c0) * static_cast<size_t>(H) * esize;

    // 1. Z[n, V] (row-major, row stride ldz) = x_c · W; column-major: Zᵀ[V, n] = op(W)[V, H] · x_cᵀ[H, n].
    gemm(hv ? N : T, N, V, n, H, 1.0f, {p.w, in_t, hv ? V : H}, {xc, in_t, H}, 0.0f, logits, CUDA_R_32F, ldz,
         "the logits GEMM of linear_cross_entropy (cuda)");

    // 2. Row-wise pass.
    rp.rows = n;
    rp.row0 = c0;
    switch (p.dtype) {
      case DType::kF32: launch_rows<float>(rp, n, stream); break;
      case DType::kBF16: launch_rows<__nv_bfloat16>(rp, n, stream); break;
      default: launch_rows<__half>(rp, n, stream); break;
    }
    cuda::check_launch("linear_cross_entropy row_kernel", stream);
    if (!grad) continue;

    // 3. dbias += α · Σ_rows g.
    if (dbias_target) {
      switch (p.dtype) {
        case DType::kF32: launch_colsum<float>(logits, ldg, n, V, alpha, dbias_target, stream); break;
        case DType::kBF16: launch_colsum<__nv_bfloat16>(logits, ldg, n, V, alpha, dbias_target, stream); break;
        default: launch_colsum<__half>(logits, ldg, n, V, alpha, dbias_target, stream); break;
      }
      cuda::check_launch("linear_cross_entropy colsum_kernel", stream);
    }

    // 4. dx_c[n, H] = α · g[n, V] · Wᵀ; column-major: dx_cᵀ[H, n] = op(W)[H, V] · gᵀ[V, n]. (Not when
    // dx is left out, nor 5 without dw: GradOut's null pointers.)
    if (go->dx) {
      void* dxc = static_cast<char*>(go->dx) +
                  static_cast<size_t>(c0) * static_cast<size_t>(H) * dtype_size(go->dx_dtype);
      gemm(hv ? T : N, N, H, n, V, alpha, {p.w, in_t, hv ? V : H}, {logits, in_t, ldg}, 0.0f, dxc,
           cuda::blas_type(go->dx_dtype), H, "the dx GEMM of linear_cross_entropy (cuda)");
    }

    // 5. dw += α · x_cᵀ · g, in w's layout.
    const float beta = c0 == 0 ? 0.0f : 1.0f;
    if (!dw_target) continue;
    if (hv) {  // dw[H, V] row-major = column-major [V, H]: gᵀ[V, n] · x_c[n, H]
      gemm(N, T, V, H, n, alpha, {logits, in_t, ldg}, {xc, in_t, H}, beta, dw_target, CUDA_R_32F, V,
           "the dw GEMM of linear_cross_entropy (cuda)");
    } else {  // dw[V, H] row-major = column-major [H, V]: x_cᵀ[H, n] · g[n, V]
      gemm(N, T, H, V, n, alpha, {xc, in_t, H}, {logits, in_t, ldg}, beta, dw_target, CUDA_R_32F, H,
           "the dw GEMM of linear_cross_entropy (cuda)");
    }
  }

  if (need_row_loss) {
    ck::reduce_loss_kernel<<<1, ck::kReduceThreads, 0, stream>>>(row_loss, B, scalars_dev,
                                                                 p.reduction == Reduction::kMean, fo->loss);
    cuda::check_launch("linear_cross_entropy reduce_loss_kernel", stream);
  }
  if (dw_acc_needed) {
    launch_convert(dw_target, go->dw, go->dw_dtype, H * V, stream);
    cuda::check_launch("linear_cross_entropy convert_kernel (dw)", stream);
  }
  if (dbias_acc_needed) {
    launch_convert(dbias_acc, go->dbias, go->dbias_dtype, V, stream);
    cuda::check_launch("linear_cross_entropy convert_kernel (dbias)", stream);
  }
  // Scratch is released stream-ordered (cudaFreeAsync) when ws / dw_acc_buf go out of scope.
}

}  // namespace

std::unique_ptr<Implementation> make_cuda_implementation() { return primitives::make_cuda<Cuda>(); }

// The CUDA module (core/cuda_module.h) registers this implementation when it is loaded; it
// takes the place of the "cuda" placeholder declared in implementations.cc.
TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cuda_implementation()); });

}  // namespace tessera::linear_cross_entropy
