// grouped_matmul: cuda_v2 — every local group's GEMM in one cuBLAS call
// (cublasGemmGroupedBatchedEx, cuBLAS 12.5+), instead of cuda's host loop of one cublasGemmEx per
// group. Design and status: docs/kernels/grouped_matmul.md, "cuda_v2".
//
// Per chunk of up to kChunk non-empty groups: one setup kernel writes the device arrays of
// A / B / C pointers that cuBLAS's grouped API takes (from the group and first-row indices passed
// by value in its parameters: no host-to-device copy, no synchronization), then one grouped GEMM
// runs them; the per-group dims (m, n, k, ld) are host arrays, as the API wants. Operand
// placement is cuda.cu's (row-major C = A·B as column-major Cᵀ = Bᵀ·Aᵀ). Rows outside every group
// and empty groups' tgmm matrices are cleared with cudaMemsetAsync, as in cuda.cu. Where cuBLAS has
// no grouped kernel for the dtypes (CUBLAS_STATUS_NOT_SUPPORTED) the call runs cuda's loop.
// Compiled in CI; NOT run on a GPU yet.
#include <climits>
#include <string>
#include <vector>

#include "core/cuda_module.h"
#include "core/cuda_util.h"
#include "primitives/cuda_available.h"
#include "core/trace_nvtx.h"
#include "core/log.h"
#include "kernels/grouped_matmul/cuda_checks.h"
#include "kernels/grouped_matmul/impl.h"
#include "tessera/error.h"

#if CUBLAS_VERSION < 120500
#error "grouped_matmul cuda_v2 needs cuBLAS 12.5+ (cublasGemmGroupedBatchedEx)"
#endif

namespace tessera::grouped_matmul {
namespace {

namespace cc = cuda_checks;
constexpr const char* kImpl = "cuda_v2";

// Groups per setup kernel and grouped GEMM: the setup parameters (12 bytes a group) stay well
// inside the 32 KiB of kernel parameters that CUDA 12.1+ allows on sm_70+.
constexpr int kChunk = 1024;

cudaStream_t stream_of(const Problem& p) { return static_cast<cudaStream_t>(p.stream); }

// Where one cuBLAS operand of group g, first row r, starts: base + g·per_group + r·per_row (bytes).
struct Operand {
  const char* base = nullptr;
  int64_t per_group = 0, per_row = 0;
};

struct SetupParams {
  Operand op[3];  // cuBLAS's A, B, C
  int count = 0;
  int32_t group[kChunk];
  int64_t row[kChunk];
};

// ptrs[t·count + i] = start of operand t of the i-th group of the chunk.
__global__ void setup_pointers(const SetupParams s, const void** ptrs) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= s.count) return;
  for (int t = 0; t < 3; ++t)
    ptrs[t * s.count + i] = s.op[t].base + s.group[i] * s.op[t].per_group + s.row[i] * s.op[t].per_row;
}

// One grouped GEMM shape: what varies per group is m, n or k (a group's rows).
struct Shape {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  enum Var { kM, kN, kK } var = kN;
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;  // the fixed ones
  cudaDataType in = CUDA_R_32F, out = CUDA_R_32F;
  Operand op[3];
};

// Runs groups `gs` (non-empty; their first rows `rows_begin`, counts `rows`) in chunks. Returns
// false, having written nothing, when cuBLAS has no grouped kernel for the types.
bool run_grouped(const Problem& p, const Shape& sh, const std::vector<int32_t>& gs) {
  const cudaStream_t stream = stream_of(p);
  cuda::BlasHandle h(p.device.index, stream);
  for (size_t first = 0; first < gs.size(); first += kChunk) {
    const int count = static_cast<int>(std::min<size_t>(kChunk, gs.size() - first));
    SetupParams s;
    for (int t = 0; t < 3; ++t) s.op[t] = sh.op[t];
    s.count = count;
    std::vector<int> m(count, sh.m), n(count, sh.n), k(count, sh.k);
    for (int i = 0; i < count; ++i) {
      const int32_t g = gs[first + static_cast<size_t>(i)];
      s.group[i] = g;
      s.row[i] = p.begin[g];
      const int rows = static_cast<int>(p.rows(g));
      (sh.var == Shape::kM ? m : sh.var == Shape::kN ? n : k)[static_cast<size_t>(i)] = rows;
    }
    const cuda::DeviceBuffer ptrs(3 * static_cast<size_t>(count) * sizeof(void*), stream, p.device.index);
    const auto** d = static_cast<const void**>(ptrs.get());
    setup_pointers<<<(count + 127) / 128, 128, 0, stream>>>(s, d);
    cuda::check(cudaGetLastError(), "grouped_matmul cuda_v2: setup_pointers launch");
    const std::vector<cublasOperation_t> ta(count, sh.ta), tb(count, sh.tb);
    const std::vector<int> lda(count, sh.lda), ldb(count, sh.ldb), ldc(count, sh.ldc), one(count, 1);
    const std::vector<float> alpha(count, 1.0f), beta(count, 0.0f);
    const cublasStatus_t st = cublasGemmGroupedBatchedEx(
        h.get(), ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(), d, sh.in, lda.data(), d + count,
        sh.in, ldb.data(), beta.data(), const_cast<void* const*>(reinterpret_cast<const void* const*>(d + 2 * count)),
        sh.out, ldc.data(), count, one.data(), cuda::blas_compute(p.dtype));
    if (st == CUBLAS_STATUS_NOT_SUPPORTED && first == 0) return false;
    cuda::blas_check(st, "grouped_matmul cuda_v2: cublasGemmGroupedBatchedEx");
  }
  return true;
}

void clear(void* base, DType t, int64_t first, int64_t count, const Problem& p, const char* what) {
  if (count <= 0) return;
  const size_t es = dtype_size(t);
  cuda::check(cudaMemsetAsync(static_cast<char*>(base) + static_cast<size_t>(first) * es, 0,
                              static_cast<size_t>(count) * es, stream_of(p)),
              what);
}

std::vector<int32_t> nonempty_groups(const Problem& p) {
  std::vector<int32_t> gs;
  for (int64_t g = 0; g < p.G; ++g)
    if (p.rows(g) > 0) gs.push_back(static_cast<int32_t>(g));
  return gs;
}

// cuda's per-group loop, for what cuBLAS's grouped API does not take.
const Implementation& loop() {
  const Implementation* c = find_implementation("cuda");
  if (!c) throw Error(ErrorCode::kInternal, "grouped_matmul cuda_v2: the cuda implementation is not registered");
  return *c;
}

class CudaV2 final : public primitives::CudaBackend<Implementation> {
 public:
  std::string name() const override { return kImpl; }
  std::string description() const override {
    return "NVIDIA GPUs (sm_80+): all groups in one cublasGemmGroupedBatchedEx call (pointer arrays written on "
           "the device), f32 accumulation";
  }
  std::string what_changed() const override {
    return "one grouped cuBLAS call per 1024 groups instead of one GEMM per group from a host loop";
  }


  Availability supports(const Problem& p) const override { return cc::device_support(p, kImpl, true); }
  void validate_block_sizes(const BlockSizes&) const override {}  // cuBLAS chooses its own tiles

  void gmm(const Problem& p, const BlockSizes& bs, const GmmArgs& x) const override {
    TESSERA_NVTX_RANGE("gmm.cuda_v2.gmm");
    cuda::DeviceGuard guard(p.device.index);
    cc::check_args(p, x.a, x.b, x.c, kImpl, "rhs");
    clear(x.c, x.c_dtype, 0, p.row_lo() * p.N, p, "grouped_matmul cuda_v2: clearing rows before the groups");
    clear(x.c, x.c_dtype, p.row_hi() * p.N, (p.M - p.row_hi()) * p.N, p, "grouped_matmul cuda_v2: clearing rows past them");
    if (p.N == 0) return;
    if (p.K == 0) {  // every product is an empty sum
      clear(x.c, x.c_dtype, p.row_lo() * p.N, (p.row_hi() - p.row_lo()) * p.N, p, "grouped_matmul cuda_v2: K = 0");
      return;
    }
    const int64_t es = static_cast<int64_t>(dtype_size(p.dtype)), os = static_cast<int64_t>(dtype_size(x.c_dtype));
    Shape sh;  // column-major: C[N, rows] = op(B_g)[N, K] · A_rows[K, rows]
    sh.ta = p.transpose_rhs ? CUBLAS_OP_T : CUBLAS_OP_N, sh.tb = CUBLAS_OP_N;
    sh.var = Shape::kN;
    sh.m = static_cast<int>(p.N), sh.k = static_cast<int>(p.K);
    sh.lda = static_cast<int>(p.transpose_rhs ? p.K : p.N), sh.ldb = static_cast<int>(p.K), sh.ldc = static_cast<int>(p.N);
    sh.in = cuda::blas_type(p.dtype), sh.out = cuda::blas_type(x.c_dtype);
    sh.op[0] = {static_cast<const char*>(x.b), p.K * p.N * es, 0};
    sh.op[1] = {static_cast<const char*>(x.a), 0, p.K * es};
    sh.op[2] = {static_cast<const char*>(x.c), 0, p.N * os};
    if (run_grouped(p, sh, nonempty_groups(p))) return;
    log::debug("grouped_matmul cuda_v2: cuBLAS has no grouped kernel for these dtypes; running cuda's loop");
    loop().gmm(p, bs, x);
  }

  void tgmm(const Problem& p, const BlockSizes& bs, const TgmmArgs& x) const override {
    TESSERA_NVTX_RANGE("gmm.cuda_v2.tgmm");
    cuda::DeviceGuard guard(p.device.index);
    cc::check_args(p, x.a, x.d, x.c, kImpl, "dout");
    if (p.K == 0 || p.N == 0) return;
    clear_empty_groups(p, x);
    const int64_t es = static_cast<int64_t>(dtype_size(p.dtype)), os = static_cast<int64_t>(dtype_size(x.c_dtype));
    const Operand a{static_cast<const char*>(x.a), 0, p.K * es}, d{static_cast<const char*>(x.d), 0, p.N * es};
    Shape sh;
    sh.ta = CUBLAS_OP_N, sh.tb = CUBLAS_OP_T;
    sh.var = Shape::kK;
    sh.in = cuda::blas_type(p.dtype), sh.out = cuda::blas_type(x.c_dtype);
    sh.op[2] = {static_cast<const char*>(x.c), p.K * p.N * os, 0};
    if (p.transpose_rhs) {  // drhs[g] row-major [N, K] = column-major [K, N] = A'·D'ᵀ
      sh.m = static_cast<int>(p.K), sh.n = static_cast<int>(p.N);
      sh.lda = static_cast<int>(p.K), sh.ldb = static_cast<int>(p.N), sh.ldc = static_cast<int>(p.K);
      sh.op[0] = a, sh.op[1] = d;
    } else {  // drhs[g] row-major [K, N] = column-major [N, K] = D'·A'ᵀ
      sh.m = static_cast<int>(p.N), sh.n = static_cast<int>(p.K);
      sh.lda = static_cast<int>(p.N), sh.ldb = static_cast<int>(p.K), sh.ldc = static_cast<int>(p.N);
      sh.op[0] = d, sh.op[1] = a;
    }
    if (run_grouped(p, sh, nonempty_groups(p))) return;
    log::debug("grouped_matmul cuda_v2: cuBLAS has no grouped kernel for these dtypes; running cuda's loop");
    loop().tgmm(p, bs, x);
  }

 private:
  // An empty group's matrix is zero: one memset per run of consecutive empty groups.
  static void clear_empty_groups(const Problem& p, const TgmmArgs& x) {
    for (int64_t g = 0; g < p.G;) {
      if (p.rows(g) > 0) {
        ++g;
        continue;
      }
      int64_t end = g;
      while (end < p.G && p.rows(end) == 0) ++end;
      clear(x.c, x.c_dtype, g * p.K * p.N, (end - g) * p.K * p.N, p, "grouped_matmul cuda_v2: clearing empty groups");
      g = end;
    }
  }
};

std::unique_ptr<Implementation> make_cuda_v2_implementation() { return primitives::make_cuda<CudaV2>(); }

}  // namespace

// Registered by the CUDA module when it is loaded, in place of the "cuda_v2" placeholder of
// implementations.cc (ahead of cuda in the default order).
TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cuda_v2_implementation()); });

}  // namespace tessera::grouped_matmul
