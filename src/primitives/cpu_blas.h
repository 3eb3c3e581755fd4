// Tessera internal: the BLAS as the CPU backends use it (built with TESSERA_CPU_BACKEND).
//
// The backends run their own worker threads and call sgemm on tiles from each of them, so
// OpenBLAS must not start threads of its own meanwhile: a SingleThreaded guard sets it to one
// thread while any guard lives — one process-wide count shared by every backend, so that two
// kernels running at once on different threads never restore the setting under each other —
// and restores the caller's setting when the last one ends.
#pragma once

#include <cstdint>

namespace tessera::cpu_blas {

class SingleThreaded {
 public:
  SingleThreaded();
  ~SingleThreaded();
  SingleThreaded(const SingleThreaded&) = delete;
  SingleThreaded& operator=(const SingleThreaded&) = delete;
};

// OpenBLAS's thread count now, and setting it (n >= 1): for tests and tools.
int threads();
void set_threads(int n);

// Row-major C = alpha·op(A)·op(B) + beta·C. M or N <= 0: nothing; K <= 0: C = beta·C (C = 0 for
// beta = 0, whatever C held). Every dimension and leading dimension must fit an int (the BLAS
// interface): callers check that in their supports().
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace tessera::cpu_blas
