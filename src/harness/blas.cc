// Host BLAS through CBLAS (linked: BLAS::BLAS). OpenBLAS-only entry points (version string,
// thread control, sbgemm) are weak references, used only when the linked library exports them.
#include "harness/blas.h"

#include <cblas.h>

#include <climits>
#include <string>

#include "tessera/error.h"

extern "C" {
char* openblas_get_config(void) __attribute__((weak));
char* openblas_get_corename(void) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
void openblas_set_num_threads(int) __attribute__((weak));
}
// Declared by OpenBLAS's cblas.h whatever the build; exported only with BUILD_BFLOAT16.
#pragma weak cblas_sbgemm

namespace tessera::harness::blas {
namespace {
blasint to_blas(int64_t v, const char* what) {
  check(v >= 0 && v <= static_cast<int64_t>(INT_MAX) &&
            static_cast<int64_t>(static_cast<blasint>(v)) == v,
        ErrorCode::kUnsupported,
        std::string("BLAS ") + what + " = " + std::to_string(v) + " does not fit the BLAS integer");
  return static_cast<blasint>(v);
}
}  // namespace

bool available() { return true; }
std::string unavailable_reason() { return {}; }

std::string name() {
  if (openblas_get_config) {
    std::string s = openblas_get_config();
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s.rfind("OpenBLAS", 0) == 0 ? s : "OpenBLAS " + s;
  }
  return "unknown CBLAS";
}

std::string core_name() {
  if (!openblas_get_corename) return {};
  const char* s = openblas_get_corename();
  return s ? std::string(s) : std::string();
}

int threads() { return openblas_get_num_threads ? openblas_get_num_threads() : 1; }
void set_threads(int n) {
  if (openblas_set_num_threads && n >= 1) openblas_set_num_threads(n);
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              to_blas(M, "M"), to_blas(N, "N"), to_blas(K, "K"), alpha, A, to_blas(lda, "lda"), B,
              to_blas(ldb, "ldb"), beta, C, to_blas(ldc, "ldc"));
}

bool has_sbgemm() { return &cblas_sbgemm != nullptr; }

void sbgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
            int64_t ldc) {
  check(has_sbgemm(), ErrorCode::kUnsupported,
        "the linked BLAS (" + name() + ") does not export cblas_sbgemm (bf16 GEMM)");
  cblas_sbgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
               to_blas(M, "M"), to_blas(N, "N"), to_blas(K, "K"), alpha,
               reinterpret_cast<const bfloat16*>(A), to_blas(lda, "lda"),
               reinterpret_cast<const bfloat16*>(B), to_blas(ldb, "ldb"), beta, C, to_blas(ldc, "ldc"));
}

}  // namespace tessera::harness::blas
