#include "primitives/cpu_blas.h"

#include <cblas.h>

#include <mutex>

namespace tessera::cpu_blas {
namespace {

std::mutex g_mu;
int g_users = 0;
int g_saved = 1;

}  // namespace

SingleThreaded::SingleThreaded() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_users++ == 0) {
    g_saved = openblas_get_num_threads();
    if (g_saved != 1) openblas_set_num_threads(1);
  }
}

SingleThreaded::~SingleThreaded() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (--g_users == 0 && g_saved != 1) openblas_set_num_threads(g_saved);
}

int threads() { return openblas_get_num_threads(); }
void set_threads(int n) { openblas_set_num_threads(n); }

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
              static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}

}  // namespace tessera::cpu_blas
