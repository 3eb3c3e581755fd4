// grouped_matmul: the first CUDA implementation — one cuBLAS GEMM per non-empty local group, on
// the caller's stream, with the group sizes read on the host (the API takes them from host
// memory). Rows outside every local group (gmm) and empty groups' matrices (tgmm) are cleared
// with cudaMemsetAsync (0 bits are 0.0 in f32, bf16 and f16). f32 accumulation
// (CUBLAS_COMPUTE_32F; TESSERA_CUDA_TF32=1 allows TF32 for f32 operands, as everywhere).
//
// Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ, so every call below swaps the operands:
//   gmm   rows of group g:  C[r, N] = A[r, K]·B[K, N]    → gemm(op_b, N, N=n, m=rows, k=K)
//   tgmm  group g:          C[K, N] = A[r, K]ᵀ·D[r, N]   → col-major C'[N, K] = D'[N, r]·A'[K, r]ᵀ
// Since cuda_v2 (one grouped cuBLAS call) it is the per-group baseline for side-by-side timing
// and cuda_v2's fallback where cuBLAS has no grouped kernel for the dtypes.
// Compiled in CI; NOT run on a GPU yet (docs/kernels/grouped_matmul.md says what is verified).
#include <climits>
#include <string>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "primitives/cuda_available.h"
#include "core/trace_nvtx.h"
#include "kernels/grouped_matmul/cuda_checks.h"
#include "kernels/grouped_matmul/impl.h"
#include "tessera/error.h"

namespace tessera::grouped_matmul {
namespace {

cudaStream_t stream_of(const Problem& p) { return static_cast<cudaStream_t>(p.stream); }

void clear(void* base, DType t, int64_t first, int64_t count, const Problem& p, const char* what) {
  if (count <= 0) return;
  const size_t es = dtype_size(t);
  cuda::check(cudaMemsetAsync(static_cast<char*>(base) + static_cast<size_t>(first) * es, 0,
                              static_cast<size_t>(count) * es, stream_of(p)),
              what);
}

class Cuda final : public primitives::CudaBackend<Implementation> {
 public:
  std::string name() const override { return "cuda"; }
  std::string description() const override {
    return "NVIDIA GPUs: one cuBLAS GEMM per non-empty group (host group sizes), f32 accumulation";
  }


  Availability supports(const Problem& p) const override { return cuda_checks::device_support(p, "cuda", false); }
  void validate_block_sizes(const BlockSizes&) const override {}  // cuBLAS chooses its own tiles

  void gmm(const Problem& p, const BlockSizes&, const GmmArgs& x) const override {
    TESSERA_NVTX_RANGE("gmm.cuda.gmm");
    cuda::DeviceGuard guard(p.device.index);
    cuda_checks::check_args(p, x.a, x.b, x.c, "cuda", "rhs");
    clear(x.c, x.c_dtype, 0, p.row_lo() * p.N, p, "grouped_matmul cuda: clearing rows before the groups");
    clear(x.c, x.c_dtype, p.row_hi() * p.N, (p.M - p.row_hi()) * p.N, p, "grouped_matmul cuda: clearing rows past them");
    if (p.N == 0) return;
    if (p.K == 0) {  // every product is an empty sum
      clear(x.c, x.c_dtype, p.row_lo() * p.N, (p.row_hi() - p.row_lo()) * p.N, p, "grouped_matmul cuda: K = 0");
      return;
    }
    cuda::BlasHandle h(p.device.index, stream_of(p));
    const cudaDataType in = cuda::blas_type(p.dtype), out = cuda::blas_type(x.c_dtype);
    const size_t es = dtype_size(p.dtype), os = dtype_size(x.c_dtype);
    // rhs[g] row-major [K, N] is column-major [N, K] (ld N): op N; stored [N, K] (transpose_rhs)
    // it is column-major [K, N] (ld K): op T.
    const cublasOperation_t op_b = p.transpose_rhs ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int64_t ldb = p.transpose_rhs ? p.K : p.N;
    for (int64_t g = 0; g < p.G; ++g) {
      const int64_t rows = p.rows(g);
      if (rows == 0) continue;
      const char* b = static_cast<const char*>(x.b) + static_cast<size_t>(g * p.K * p.N) * es;
      const char* a = static_cast<const char*>(x.a) + static_cast<size_t>(p.begin[g] * p.K) * es;
      char* c = static_cast<char*>(x.c) + static_cast<size_t>(p.begin[g] * p.N) * os;
      cuda::gemm_ex(h.get(), cuda::blas_compute(p.dtype), op_b, CUBLAS_OP_N, p.N, rows, p.K, 1.0f, {b, in, ldb},
                    {a, in, p.K}, 0.0f, c, out, p.N, "grouped_matmul cuda: gmm group GEMM");
    }
  }

  void tgmm(const Problem& p, const BlockSizes&, const TgmmArgs& x) const override {
    TESSERA_NVTX_RANGE("gmm.cuda.tgmm");
    cuda::DeviceGuard guard(p.device.index);
    cuda_checks::check_args(p, x.a, x.d, x.c, "cuda", "dout");
    if (p.K == 0 || p.N == 0) return;
    cuda::BlasHandle h(p.device.index, stream_of(p));
    const cudaDataType in = cuda::blas_type(p.dtype), out = cuda::blas_type(x.c_dtype);
    const size_t es = dtype_size(p.dtype), os = dtype_size(x.c_dtype);
    for (int64_t g = 0; g < p.G; ++g) {
      const int64_t rows = p.rows(g);
      char* c = static_cast<char*>(x.c) + static_cast<size_t>(g * p.K * p.N) * os;
      if (rows == 0) {
        clear(x.c, x.c_dtype, g * p.K * p.N, p.K * p.N, p, "grouped_matmul cuda: clearing an empty group");
        continue;
      }
      // lhs rows of g: column-major [K, rows] (ld K); dout rows: column-major [N, rows] (ld N).
      const cuda::GemmOperand a{static_cast<const char*>(x.a) + static_cast<size_t>(p.begin[g] * p.K) * es, in, p.K};
      const cuda::GemmOperand d{static_cast<const char*>(x.d) + static_cast<size_t>(p.begin[g] * p.N) * es, in, p.N};
      if (p.transpose_rhs)  // drhs[g] row-major [N, K] = column-major [K, N] = A'·D'ᵀ
        cuda::gemm_ex(h.get(), cuda::blas_compute(p.dtype), CUBLAS_OP_N, CUBLAS_OP_T, p.K, p.N, rows, 1.0f, a, d, 0.0f,
                      c, out, p.K, "grouped_matmul cuda: tgmm group GEMM");
      else  // drhs[g] row-major [K, N] = column-major [N, K] = D'·A'ᵀ
        cuda::gemm_ex(h.get(), cuda::blas_compute(p.dtype), CUBLAS_OP_N, CUBLAS_OP_T, p.N, p.K, rows, 1.0f, d, a, 0.0f,
                      c, out, p.N, "grouped_matmul cuda: tgmm group GEMM");
    }
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cuda_implementation() { return primitives::make_cuda<Cuda>(); }

// The CUDA module registers this implementation when it is loaded, in place of the "cuda"
// placeholder declared in implementations.cc.
TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cuda_implementation()); });

}  // namespace tessera::grouped_matmul
