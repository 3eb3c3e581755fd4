// mlstm: the cuda backend, version 1 — the chunkwise form of cpu.cc on the GPU, f32 accumulation,
// gate sums and exponents in double (cuda_kernels.cuh holds the kernels and their math).
//
// Forward: state_kernel (the inter-chunk recurrence, sequential over the chunks of a head,
// parallel over rows of C), then intra_kernel (one block per chunk and head: h). Backward:
// state_kernel again, intra_kernel in its backward mode (per-step den and the gradients of the
// denominator and the decay), dstate_kernel (the reverse recurrence of dC, dn), grads_kernel (one
// block per chunk and head: dq, dk, dv, di, df). A first-contact design: correctness first, no
// tensor cores, operands read from global memory (docs/kernels/mlstm.md).
//
// Device calls convert nothing (impl.h): q, k, v, i, f, h, dh and the gradients are read and
// written in their own dtypes; states and their gradients are f32. Scratch (stream-ordered):
// the state each chunk enters with, B·NH·NC·(DHQK·DHV + DHQK) f32 + B·NH·NC doubles, twice in the
// backward (with the gradients of the states), plus 3·B·NH·S f32.
#include <cuda_runtime.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "core/trace_nvtx.h"
#include "primitives/cuda_available.h"  // before cuda_kernels.cuh: its cuda:: is tessera::cuda
#include "kernels/mlstm/cuda_kernels.cuh"
#include "kernels/mlstm/impl.h"
#include "tessera/error.h"

namespace tessera::mlstm {
namespace {

namespace ck = cuda_kernels;

constexpr int64_t kMaxHeadDim = 1024;  // DHQK, DHV
constexpr int64_t kMaxHeads = 65535;   // B·NH: the grid's y dimension
constexpr size_t kDefaultSmem = 48 * 1024;
// The largest chunk fits an H100's 227 KiB per block (an A100's 163 KiB takes chunks up to 115:
// supports() asks the device).
static_assert(ck::grads_smem(ck::kMaxChunk) <= 227 * 1024, "grads_kernel at kMaxChunk must fit an sm_90 block");

const std::string kWho = std::string(kKernelName) + " (cuda)";

int chunk_of(const Problem& p) { return static_cast<int>(p.chunk > 0 ? p.chunk : kDefaultChunk); }

int code(DType t) {
  switch (t) {
    case DType::kF32: return ck::kF32;
    case DType::kBF16: return ck::kBF16;
    case DType::kF16: return ck::kF16;
    case DType::kI32: return ck::kI32;
    case DType::kI64: return ck::kI64;
    default: throw Error(ErrorCode::kInternal, kWho + ": unexpected dtype " + dtype_name(t));
  }
}

// Bytes of shared memory one block may use on `device` (the opt-in limit), 0 when unknown.
int smem_optin(int device) {
  int bytes = 0;
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return bytes;
}

// Lets `kernel` use `bytes` of dynamic shared memory (an opt-in above 48 KiB).
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* what) {
  if (bytes <= kDefaultSmem) return;
  cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), what);
}

// The parameters common to both passes, the scratch of the states.
struct Run {
  ck::Params k;
  cudaStream_t stream;
  int dev;
  cuda::DeviceBuffer Cs, ns, ms;

  explicit Run(const Problem& p) : stream(static_cast<cudaStream_t>(p.stream)), dev(p.device.index) {
    k.B = p.B, k.NH = p.NH, k.S = p.S, k.DK = p.DK, k.DV = p.DV;
    k.L = chunk_of(p), k.NC = static_cast<int>((p.S + k.L - 1) / k.L);
    k.scale = 1.0f / std::sqrt(static_cast<float>(p.DK)), k.eps = static_cast<float>(p.eps);
    k.q = p.dev.q.data, k.k = p.dev.k.data, k.v = p.dev.v.data, k.i = p.dev.i.data, k.f = p.dev.f.data;
    k.qkv = code(p.dev.q.dtype), k.gates = code(p.dev.i.dtype);
    k.resets = p.dev.resets.data, k.rdt = p.dev.resets.data ? code(p.dev.resets.dtype) : ck::kI32;
    k.c0 = p.c0, k.n0 = p.n0, k.m0 = p.m0;
    const size_t heads_chunks = static_cast<size_t>(p.B * p.NH) * static_cast<size_t>(k.NC);
    Cs = cuda::DeviceBuffer(heads_chunks * static_cast<size_t>(p.DK * p.DV) * sizeof(float), stream, dev);
    ns = cuda::DeviceBuffer(heads_chunks * static_cast<size_t>(p.DK) * sizeof(float), stream, dev);
    ms = cuda::DeviceBuffer(heads_chunks * sizeof(double), stream, dev);
    k.Cs = static_cast<float*>(Cs.get()), k.ns = static_cast<float*>(ns.get()), k.ms = static_cast<double*>(ms.get());
  }

  dim3 state_grid() const {
    return dim3(static_cast<unsigned>(k.B * k.NH), static_cast<unsigned>((k.DK + ck::kStateRows - 1) / ck::kStateRows));
  }
  dim3 chunk_grid() const { return dim3(static_cast<unsigned>(k.NC), static_cast<unsigned>(k.B * k.NH)); }

  void states(bool want_last) {
    const size_t smem = ck::state_smem(k.L);
    allow_smem(ck::state_kernel, smem, "cudaFuncSetAttribute (mlstm state_kernel)");
    ck::state_kernel<<<state_grid(), ck::kThreads, smem, stream>>>(k, want_last);
    cuda::check_launch("mlstm state_kernel", stream);
  }
  void intra(bool backward) {
    const size_t smem = ck::intra_smem(k.L);
    allow_smem(ck::intra_kernel, smem, "cudaFuncSetAttribute (mlstm intra_kernel)");
    ck::intra_kernel<<<chunk_grid(), ck::kThreads, smem, stream>>>(k, backward);
    cuda::check_launch("mlstm intra_kernel", stream);
  }
  void dstates(bool want_d0) {
    const size_t smem = ck::dstate_smem(k.L);
    allow_smem(ck::dstate_kernel, smem, "cudaFuncSetAttribute (mlstm dstate_kernel)");
    ck::dstate_kernel<<<state_grid(), ck::kThreads, smem, stream>>>(k, want_d0);
    cuda::check_launch("mlstm dstate_kernel", stream);
  }
  void grads() {
    const size_t smem = ck::grads_smem(k.L);
    allow_smem(ck::grads_kernel, smem, "cudaFuncSetAttribute (mlstm grads_kernel)");
    ck::grads_kernel<<<chunk_grid(), ck::kThreads, smem, stream>>>(k);
    cuda::check_launch("mlstm grads_kernel", stream);
  }
};

void require_on_device(const Problem& p, std::initializer_list<std::pair<const void*, const char*>> arrays) {
  for (const auto& [ptr, what] : arrays)
    if (ptr) cuda::require_accessible(ptr, p.device.index, kWho, what);
}

// The forward's inputs (both passes read them).
void require_inputs_on_device(const Problem& p) {
  require_on_device(p, {{p.dev.q.data, "q"}, {p.dev.k.data, "k"}, {p.dev.v.data, "v"}, {p.dev.i.data, "i"},
                        {p.dev.f.data, "f"}, {p.dev.resets.data, "resets"}, {p.c0, "c0"}, {p.n0, "n0"},
                        {p.m0, "m0"}});
}

class Cuda final : public primitives::CudaBackend<Implementation> {
 public:
  std::string name() const override { return "cuda"; }
  std::string description() const override {
    return "NVIDIA GPUs: chunkwise — the state recurrence per head, then one block per (chunk, head) (v1, f32 math)";
  }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCUDA) return Availability::no("the cuda backend runs on CUDA device memory");
    if (const Availability a = available(); !a.ok) return a;
    if (p.DK > kMaxHeadDim || p.DV > kMaxHeadDim)
      return Availability::no("DHQK and DHV must be <= " + std::to_string(kMaxHeadDim) + " (cuda), got " +
                              std::to_string(p.DK) + " and " + std::to_string(p.DV));
    if (p.B * p.NH > kMaxHeads)
      return Availability::no("B·NH must be <= " + std::to_string(kMaxHeads) + " (cuda grid), got " + std::to_string(p.B * p.NH));
    const int L = chunk_of(p);
    if (L > ck::kMaxChunk)
      return Availability::no("chunk_size must be <= " + std::to_string(ck::kMaxChunk) + " (cuda), got " + std::to_string(L));
    const size_t need = ck::grads_smem(L);
    const int have = smem_optin(p.device.index);
    if (need > static_cast<size_t>(have))
      return Availability::no("chunk_size " + std::to_string(L) + " needs " + std::to_string(need) +
                              " bytes of shared memory per block (cuda grads_kernel); cuda:" +
                              std::to_string(p.device.index) + " allows " + std::to_string(have));
    return Availability::yes();
  }

  void forward(const Problem& p, const ForwardOut& out) const override {
    TESSERA_NVTX_RANGE("mlstm.cuda.fwd");
    cuda::DeviceGuard guard(p.device.index);
    require_inputs_on_device(p);
    require_on_device(p, {{out.h_dev.data, "h"}, {out.c_last, "c_last"}, {out.n_last, "n_last"}, {out.m_last, "m_last"}});
    Run r(p);
    r.k.h = out.h_dev.data, r.k.hdt = code(out.h_dev.dtype);
    r.k.c_last = out.c_last, r.k.n_last = out.n_last, r.k.m_last = out.m_last;
    r.states(out.c_last != nullptr);
    r.intra(false);
  }

  void backward(const Problem& p, const BackwardArgs& a) const override {
    TESSERA_NVTX_RANGE("mlstm.cuda.bwd");
    cuda::DeviceGuard guard(p.device.index);
    require_inputs_on_device(p);
    require_on_device(p, {{a.dh_dev.data, "dh"}, {a.dc_last, "dc_last"}, {a.dn_last, "dn_last"},
                          {a.dq_dev.data, "dq"}, {a.dk_dev.data, "dk"}, {a.dv_dev.data, "dv"},
                          {a.di_dev.data, "di"}, {a.df_dev.data, "df"}, {a.dc0, "dc0"}, {a.dn0, "dn0"}});
    Run r(p);
    ck::Params& k = r.k;
    k.dh = a.dh_dev.data, k.dhdt = code(a.dh_dev.dtype);
    k.dc_last = a.dc_last, k.dn_last = a.dn_last;
    k.dq = a.dq_dev.data, k.dk = a.dk_dev.data, k.dv = a.dv_dev.data, k.di = a.di_dev.data, k.df = a.df_dev.data;
    k.dqdt = code(a.dq_dev.dtype), k.dkdt = code(a.dk_dev.dtype), k.dvdt = code(a.dv_dev.dtype);
    k.didt = code(a.di_dev.dtype), k.dfdt = code(a.df_dev.dtype);
    k.dc0 = a.dc0, k.dn0 = a.dn0;
    const size_t heads_chunks = static_cast<size_t>(p.B * p.NH) * static_cast<size_t>(k.NC);
    const size_t steps = static_cast<size_t>(p.B * p.NH * p.S);
    cuda::DeviceBuffer dCs(heads_chunks * static_cast<size_t>(p.DK * p.DV) * sizeof(float), r.stream, r.dev);
    cuda::DeviceBuffer dns(heads_chunks * static_cast<size_t>(p.DK) * sizeof(float), r.stream, r.dev);
    cuda::DeviceBuffer per_step(3 * steps * sizeof(float), r.stream, r.dev);
    k.dCs = static_cast<float*>(dCs.get()), k.dns = static_cast<float*>(dns.get());
    k.den = static_cast<float*>(per_step.get()), k.ddr = k.den + steps, k.dg = k.ddr + steps;
    r.states(false);
    r.intra(true);
    r.dstates(a.dc0 != nullptr);
    r.grads();
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cuda_implementation() { return primitives::make_cuda<Cuda>(); }

TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cuda_implementation()); });

}  // namespace tessera::mlstm
