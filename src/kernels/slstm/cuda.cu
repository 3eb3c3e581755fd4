// slstm cuda, version 1: a persistent kernel in the FlashRNN style, one block per (head, block of
// kRows batch rows), looping over all S steps with block-level synchronization (the block owns
// its rows' whole recurrence: no grid-wide barrier).
//   forward (slstm_forward): the head's recurrent weights stay resident for the whole sequence —
//     in shared memory in the inputs' dtype, with the first kRegRows rows j of each column in
//     registers when all of r does not fit (f32 at DH > 112 on an H100); thread c = g·DH + k owns column c
//     (gate g, unit k): per step pre[b, c] = Σ_j h[b, j]·r[g, j, k] + wx + b for the block's rows
//     (h broadcast from shared memory), then the cells' pointwise gates in f32 (stable sigmoid,
//     logsigmoid, tanh; the first-step rule m = ī), state (h, c, n, m) in shared memory.
//   backward (slstm_backward): the same block, steps in reverse, from the forward's tape (11 f32
//     per cell in device scratch): the gates' gradients per cell (dwx written, dpre kept in f32
//     scratch), then dh_{t−1} = Σ_{g,k} r[g, j, k]·dpre[g, k] by thread (g, j) from rᵀ resident the
//     same way (its first kRegRows columns k in registers), summed over the gates.
//   dr, db (slstm_weight_grads): Σ over B·S of h_{t−1}ᵀ·dpre and dpre, f32 accumulators per thread
//     (deterministic: no atomics), rounded once to the inputs' dtype.
// DH ≤ 128 (kMaxDH), and the shared memory a block needs must fit the device's opt-in limit
// (f32 DH = 128 needs 208 KiB forward, 214 KiB backward: H100 / H200 227 KiB). Resets are host
// memory (Problem): copied to the device once per call. The kernels are in cuda_kernels.cuh, which
// the CPU suite also runs by emulation (SlstmCudaEmulation.*). Compiled in CI for sm_90a + PTX; NOT
// run on a GPU yet (docs/kernels/slstm.md).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "core/trace_nvtx.h"
#include "kernels/slstm/cuda_kernels.cuh"
#include "kernels/slstm/impl.h"
#include "primitives/cuda_available.h"
#include "tessera/error.h"

namespace tessera::slstm {
namespace {

using namespace cuda_kernels;  // NOLINT: the device code of this backend

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, std::string(kKernelName) + " (cuda): " + msg);
}

constexpr const char* kResetsCopy = "slstm (cuda) copies the resets mask to the device";

size_t optin_smem(int dev) {
  int v = 0;
  cuda::check(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
              "slstm (cuda): cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  return static_cast<size_t>(v);
}

template <class K>
void launch(K kernel, const char* name, const Args& a, size_t smem, cudaStream_t st) {
  cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), name);
  const dim3 grid(static_cast<unsigned>(a.NH), static_cast<unsigned>((a.B + kRows - 1) / kRows));
  kernel<<<grid, threads_for(a.DH), smem, st>>>(a);
  cuda::check_launch(name, st);
}

template <class T, int JR>
void run_typed(const Problem& p, Args a, cudaStream_t st) {
  const size_t esz = sizeof(T);
  {
    TESSERA_NVTX_RANGE("slstm.cuda.forward");
    launch(slstm_forward<T, JR>, "slstm_forward", a, forward_smem(p.DH, esz, JR), st);
  }
  if (!p.backward) return;
  {
    TESSERA_NVTX_RANGE("slstm.cuda.backward");
    launch(slstm_backward<T, JR>, "slstm_backward", a, backward_smem(p.DH, esz, JR), st);
  }
  TESSERA_NVTX_RANGE("slstm.cuda.weight_grads");
  const dim3 grid(static_cast<unsigned>(p.NH), static_cast<unsigned>((p.DH + kWeightJ - 1) / kWeightJ));
  slstm_weight_grads<T><<<grid, std::min(threads_for(p.DH), kMaxThreads), 0, st>>>(
      a.tape + kHPrev * p.B * p.S * p.NH * p.DH, a.dpre, p.B * p.S, p.NH, p.DH, static_cast<T*>(p.dr),
      static_cast<T*>(p.db));
  cuda::check_launch("slstm_weight_grads", st);
}

template <class T>
void run_dtype(const Problem& p, const Args& a, int jr, cudaStream_t st) {
  if (jr == 0) return run_typed<T, 0>(p, a, st);
  return run_typed<T, kRegRows>(p, a, st);
}

class Cuda final : public primitives::CudaBackend<Implementation> {
 public:
  std::string name() const override { return "cuda"; }
  std::string description() const override {
    return "NVIDIA GPUs: persistent kernel, one block per (head, 4 batch rows) over all steps, recurrent weights "
           "resident in shared memory (and registers), backward through time from a device tape (v1, DH <= 128)";
  }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCUDA) return Availability::no("the cuda backend runs on CUDA device memory");
    if (const Availability a = available(); !a.ok) return a;
    if (p.DH > kMaxDH)
      return Availability::no("DH=" + std::to_string(p.DH) + " is over the cuda limit of " + std::to_string(kMaxDH) +
                              " (a head's recurrent weights stay resident in one block)");
    if ((p.B + kRows - 1) / kRows > 65535 || p.NH > 65535)
      return Availability::no("B must be <= 262140 and NH <= 65535 on the cuda backend (grid dimensions)");
    const size_t optin = optin_smem(p.device.index), esz = dtype_size(p.dtype);
    if (register_rows(p.DH, esz, optin) < 0)
      return Availability::no("DH=" + std::to_string(p.DH) + " in " + dtype_name(p.dtype) + " needs " +
                              std::to_string(backward_smem(p.DH, esz, kRegRows)) + " bytes of shared memory per block; " +
                              p.device.str() + " gives " + std::to_string(optin));
    if (p.resets)
      if (const std::string why = cuda::capture_refusal(static_cast<cudaStream_t>(p.stream), kResetsCopy); !why.empty())
        return Availability::no(why);
    return Availability::yes();
  }

  void run(const Problem& p) const override {
    const int dev = p.device.index;
    cuda::DeviceGuard guard(dev);
    const std::string who = std::string(kKernelName) + " (cuda)";
    for (const auto& [ptr, what] : {std::pair<const void*, const char*>{p.wx, "wx"}, {p.r, "r"}, {p.b, "b"}})
      cuda::require_accessible(ptr, dev, who, what);
    for (const auto& [ptr, what] :
         {std::pair<const void*, const char*>{p.h0, "h0"}, {p.c0, "c0"}, {p.n0, "n0"}, {p.m0, "m0"}, {p.h, "h"},
          {p.h_last, "h_last"}, {p.c_last, "c_last"}, {p.n_last, "n_last"}, {p.m_last, "m_last"}, {p.dh_given, "dh"},
          {p.dh_last, "dh_last"}, {p.dc_last, "dc_last"}, {p.dn_last, "dn_last"}, {p.dwx, "dwx"}, {p.dr, "dr"},
          {p.db, "db"}, {p.dh0, "dh0"}, {p.dc0, "dc0"}, {p.dn0, "dn0"}})
      if (ptr) cuda::require_accessible(ptr, dev, who, what);
    const int jr = register_rows(p.DH, dtype_size(p.dtype), optin_smem(dev));
    if (jr < 0) fail(ErrorCode::kUnsupported, "DH=" + std::to_string(p.DH) + " does not fit this device's shared memory");
    const auto st = static_cast<cudaStream_t>(p.stream);
    cuda::DeviceBuffer resets;
    if (p.resets) {
      if (const std::string why = cuda::capture_refusal(st, kResetsCopy); !why.empty()) fail(ErrorCode::kUnsupported, why);
      resets = cuda::DeviceBuffer(size_t(p.B * p.S), st, dev);
      cuda::copy_host_to_device(resets.get(), p.resets, resets.bytes(), st, dev, "slstm (cuda): copy of the resets");
    }
    const size_t cells = size_t(p.B * p.S * p.NH * p.DH);
    cuda::DeviceBuffer tape, dpre;
    if (p.backward) {
      tape = cuda::DeviceBuffer(sizeof(float) * kTapeFields * cells, st, dev);
      dpre = cuda::DeviceBuffer(sizeof(float) * 4 * cells, st, dev);
    }
    const auto code = [](DType t) { return t == DType::kF32 ? 0 : t == DType::kBF16 ? 1 : 2; };
    const int dh_code = code(p.dh_dtype);
    const Args a{p.wx, p.r, p.b, static_cast<const uint8_t*>(resets.get()), p.h0, p.c0, p.n0, p.m0, p.h, code(p.h_dtype), p.h_last,
                 p.c_last, p.n_last, p.m_last, static_cast<float*>(tape.get()), p.dh_given, dh_code, p.dh_last,
                 p.dc_last, p.dn_last, p.dwx, static_cast<float*>(dpre.get()), p.dh0, p.dc0, p.dn0, p.B, p.S, p.NH,
                 p.DH};
    switch (p.dtype) {
      case DType::kF32: return run_dtype<float>(p, a, jr, st);
      case DType::kBF16: return run_dtype<__nv_bfloat16>(p, a, jr, st);
      case DType::kF16: return run_dtype<__half>(p, a, jr, st);
      default: fail(ErrorCode::kInternal, "dtype");
    }
    // resets, tape and dpre are released stream-ordered when they go out of scope.
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cuda_implementation() { return primitives::make_cuda<Cuda>(); }

// The CUDA module registers this implementation when it is loaded, in place of the "cuda"
// placeholder declared in implementations.cc.
TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cuda_implementation()); });

}  // namespace tessera::slstm
