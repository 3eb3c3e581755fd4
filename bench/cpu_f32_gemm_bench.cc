// primitives/cpu_f32_gemm against OpenBLAS sgemm, one thread, f32 (never a unit test). Decides
// which callers take the micro-kernel on a CPU (docs/kernels/mlstm.md v0.6, knowledge:
// own-microkernel-over-the-blas).
//
//   bin/cpu_f32_gemm_bench [M,N,K ...]        (default: the fused kernels' tile shapes)
//   TESSERA_CPU_F32_GEMM=avx2 bin/cpu_f32_gemm_bench   the AVX2 kernel on an AVX-512 CPU
//
// C [M × N] = A [M × K] · B [K × N], row-major. "kernel" times gemm on B packed beforehand (a
// caller that reuses its packed operand), "+pack" adds one pack of B per product, "sgemm" is
// cblas_sgemm (which packs both operands on every call). Timed in interleaved rounds (median of
// 15), so load drift on a shared machine hits all three alike; results checked against each other.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gemm_bench_util.h"
#include "primitives/cpu_f32_gemm.h"

extern "C" void openblas_set_num_threads(int);

namespace {

using gemm_bench::median;
using gemm_bench::now;
namespace g = tessera::cpu_f32_gemm;

void run(int64_t M, int64_t N, int64_t K) {
  std::vector<float> A(size_t(M * K)), B(size_t(K * N)), C(size_t(M * N)), D(size_t(M * N));
  std::vector<float> P(size_t(g::packed_floats(K, N)));
  for (size_t i = 0; i < A.size(); ++i) A[i] = float(int(i * 7 % 13) - 6) / 8.0f;
  for (size_t i = 0; i < B.size(); ++i) B[i] = float(int(i * 5 % 11) - 5) / 8.0f;
  g::pack(false, K, N, B.data(), N, P.data());
  const int reps = int(std::clamp<double>(2e8 / (2.0 * M * N * K), 1, 200));  // ~0.1 s of work a round at most
  std::vector<double> tk, tp, tb;
  for (int round = 0; round < 15; ++round) {
    double t = now();
    for (int r = 0; r < reps; ++r) g::gemm(g::Tri::kNone, false, M, N, K, 1.0f, A.data(), K, P.data(), 0.0f, C.data(), N);
    tk.push_back((now() - t) / reps);
    t = now();
    for (int r = 0; r < reps; ++r) g::pack(false, K, N, B.data(), N, P.data());
    tp.push_back((now() - t) / reps);
    t = now();
    for (int r = 0; r < reps; ++r)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(M), int(N), int(K), 1.0f, A.data(), int(K), B.data(),
                  int(N), 0.0f, D.data(), int(N));
    tb.push_back((now() - t) / reps);
  }
  double diff = 0;
  for (size_t i = 0; i < C.size(); ++i) diff = std::max(diff, double(std::fabs(C[i] - D[i])));
  const double gf = 2.0 * double(M) * double(N) * double(K) / 1e9, k = median(tk), p = median(tp), b = median(tb);
  std::printf("%6lld %6lld %6lld | %7.1f %7.1f %7.1f | %5.2f | %.1e\n", (long long)M, (long long)N, (long long)K, gf / k,
              gf / (k + p), gf / b, b / k, diff);
}

}  // namespace

int main(int argc, char** argv) {
  openblas_set_num_threads(1);
  // mlstm's chunk products (L = 64, D = 256), attention-like tiles, gmm / LCE depths
  const auto shapes = gemm_bench::shapes(argc, argv,
                                         {{256, 256, 64}, {64, 256, 256}, {64, 256, 64}, {64, 64, 256}, {128, 128, 128},
                                          {128, 256, 128}, {128, 128, 256}, {64, 2048, 1024}, {512, 2048, 1024}});
  std::printf("cpu_f32_gemm (%s) vs OpenBLAS sgemm, one thread, GFLOP/s (median of 15 interleaved rounds)\n",
              g::isa_name(g::isa()));
  std::printf("     M      N      K |  kernel   +pack   sgemm | sgemm/kernel time | max |diff|\n");
  for (const auto& s : shapes) run(s[0], s[1], s[2]);
  return 0;
}
