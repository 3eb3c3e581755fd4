// grouped_matmul: the bench's baselines, the same products done the plain way: all M rows as one
// group on the cpu implementation (the dense floor every dtype is compared with), and OpenBLAS
// (f32): one dense sgemm of all rows, or one sgemm per non-empty group.
#include <functional>
#include <memory>
#include <vector>

#include "harness/blas.h"
#include "tessera/grouped_matmul.h"

namespace tessera::grouped_matmul {

// lhs [M, K] against rhs[0] ([K, N], the first K·N values of rhs) as one group of M rows, on the
// cpu implementation, into a scratch [M, N] of lhs's dtype. The tensors share their storage with
// the bench's (kept alive by the run).
std::function<void()> one_group_baseline(const Tensor& lhs, const Tensor& rhs, int64_t N, int threads) {
  const int64_t M = lhs.shape()[0], K = lhs.shape()[1];
  auto out = std::make_shared<Tensor>(Tensor::empty(lhs.dtype(), {M, N}));
  auto one = std::make_shared<Tensor>(Tensor::empty(DType::kI64, {1}));
  one->data_as<int64_t>()[0] = M;
  return [lhs, rhs, K, N, out, one, threads] {
    Options opt;
    opt.implementation = "cpu";
    opt.num_threads = threads;
    const TensorView r0(rhs.data(), rhs.dtype(), {1, K, N});
    gmm({lhs.view(), r0, one->view()}, out->view(), opt);
  };
}

// f32 lhs [M, K] and rhs [G, K, N] through OpenBLAS: one sgemm of every row against rhs[0]
// (`dense`), or one per non-empty group of `sizes` rows.
std::function<void()> blas_baseline(const Tensor& lhs, const Tensor& rhs, std::vector<int64_t> sizes, bool dense) {
  const int64_t M = lhs.shape()[0], K = lhs.shape()[1], N = rhs.shape()[2];
  auto out = std::make_shared<Tensor>(Tensor::zeros(DType::kF32, {M, N}));
  return [lhs, rhs, sizes, out, M, K, N, dense] {
    const float *a = lhs.data_as<float>(), *w = rhs.data_as<float>();
    float* o = out->data_as<float>();
    if (dense) return harness::blas::sgemm(false, false, M, N, K, 1.f, a, K, w, N, 0.f, o, N);
    int64_t r = 0;
    for (size_t g = 0; g < sizes.size(); r += sizes[g], ++g)
      if (sizes[g] > 0)
        harness::blas::sgemm(false, false, sizes[g], N, K, 1.f, a + r * K, K, w + static_cast<int64_t>(g) * K * N, N,
                             0.f, o + r * N, N);
  };
}

}  // namespace tessera::grouped_matmul
