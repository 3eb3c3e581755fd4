// Tessera harness: the host BLAS the tools link (OpenBLAS on Debian), for ceilings and
// baselines. Built against a real BLAS when TESSERA_CPU_BACKEND is ON (blas.cc); otherwise
// blas_none.cc, where available() is false and every call throws Error(kUnsupported) with the
// reason. Row-major, 64-bit sizes (checked against the BLAS's int range).
#pragma once

#include <cstdint>
#include <string>

namespace tessera::harness::blas {

bool available();
// Why not, when !available(); empty otherwise.
std::string unavailable_reason();
// "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64" or "unknown BLAS".
std::string name();
// The kernel set the BLAS dispatched to on this CPU (OpenBLAS openblas_get_corename(), e.g.
// "Zen", "SkylakeX", "Haswell"); "" when the library cannot tell.
std::string core_name();
// Threads the BLAS uses now (1 if it cannot tell); set_threads(n) where it can (n >= 1).
int threads();
void set_threads(int n);

// C[M,N] = alpha · op(A)·op(B) + beta · C, row-major; op(A) is [M,K], op(B) is [K,N].
// lda / ldb / ldc are row strides of the stored matrices.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc);

// bf16 inputs, f32 output (OpenBLAS cblas_sbgemm). Only when has_sbgemm(): Debian's
// OpenBLAS 0.3.21 is built without BUILD_BFLOAT16 and declares but does not export it.
bool has_sbgemm();
void sbgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
            int64_t ldc);

}  // namespace tessera::harness::blas
