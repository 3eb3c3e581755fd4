// Tessera's tile engines against oneDNN's, one thread, on the tile shapes the fused CPU kernels
// issue (issue #24 item 1: "measure them against OpenBLAS and oneDNN on the same shapes"). Not
// built by CMake: oneDNN is not a dependency; this program is the evidence behind
// docs/knowledge/optimizations/own-tile-engine-over-onednn.md. Build on a Debian machine:
//
//   mkdir -p /tmp/dnnl && cd /tmp/dnnl && apt-get download libdnnl-dev libdnnl2 ocl-icd-libopencl1 &&
//     for f in *.deb; do dpkg -x $f root; done            (unpacked, not installed)
//   g++ -O2 -std=c++20 -I src -I include -I /tmp/dnnl/root/usr/include bench/onednn_tile_bench.cc \
//     -L build/release/lib -ltessera -L /tmp/dnnl/root/usr/lib/x86_64-linux-gnu -ldnnl -lopenblas \
//     -Wl,-rpath,$PWD/build/release/lib:/tmp/dnnl/root/usr/lib/x86_64-linux-gnu \
//     -Wl,--disable-new-dtags -o /tmp/onednn_tile_bench   (RPATH: libdnnl finds libOpenCL there too)
//   OMP_NUM_THREADS=1 /tmp/onednn_tile_bench [M,N,K ...]
//
// C [M × N] (f32) = A [M × K] · B [K × N], row-major, A and B f32 or bf16. Per dtype and shape,
// GFLOP/s (median of 15 interleaved rounds): Tessera's kernel on B packed beforehand ("kernel",
// a caller reusing its packed operand), with one pack of B per product ("+pack"), oneDNN's matmul
// primitive (created once; plain layouts, so it packs what it needs on every call, as "+pack"),
// and for f32 OpenBLAS cblas_sgemm. Outputs are checked against each other.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "primitives/cpu_bf16_gemm.h"
#include "gemm_bench_util.h"
#include "primitives/cpu_f32_gemm.h"
#include "tessera/dtype.h"

extern "C" void openblas_set_num_threads(int);

namespace {

using gemm_bench::median;
using gemm_bench::now;
namespace f32g = tessera::cpu_f32_gemm;
namespace bfg = tessera::cpu_bf16_gemm;

// A oneDNN matmul C = A·B with plain row-major layouts, created once per shape and dtype.
struct Dnnl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul prim;
  dnnl::memory a, b, c;

  Dnnl(int64_t M, int64_t N, int64_t K, bool bf16, void* A, void* B, float* C) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dt in = bf16 ? dt::bf16 : dt::f32;
    const dnnl::memory::desc ad({M, K}, in, tag::ab), bd({K, N}, in, tag::ab), cd({M, N}, dt::f32, tag::ab);
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), eng));
    a = dnnl::memory(ad, eng, A), b = dnnl::memory(bd, eng, B), c = dnnl::memory(cd, eng, C);
  }
  void run() {
    prim.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    strm.wait();
  }
};

template <class F>
double time_it(int reps, F&& f) {
  const double t = now();
  for (int r = 0; r < reps; ++r) f();
  return (now() - t) / reps;
}

double max_diff(const std::vector<float>& x, const std::vector<float>& y) {
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, double(std::fabs(x[i] - y[i])));
  return d;
}

void run_f32(int64_t M, int64_t N, int64_t K, int reps) {
  std::vector<float> A(size_t(M * K)), B(size_t(K * N)), C(size_t(M * N)), D(size_t(M * N)), E(size_t(M * N));
  std::vector<float> P(size_t(f32g::packed_floats(K, N)));
  for (size_t i = 0; i < A.size(); ++i) A[i] = float(int(i * 7 % 13) - 6) / 8.0f;
  for (size_t i = 0; i < B.size(); ++i) B[i] = float(int(i * 5 % 11) - 5) / 8.0f;
  Dnnl dn(M, N, K, false, A.data(), B.data(), E.data());
  f32g::pack(false, K, N, B.data(), N, P.data());
  std::vector<double> tk, tp, td, tb;
  for (int round = 0; round < 15; ++round) {
    tk.push_back(time_it(reps, [&] {
      f32g::gemm(f32g::Tri::kNone, false, M, N, K, 1.0f, A.data(), K, P.data(), 0.0f, C.data(), N);
    }));
    tp.push_back(time_it(reps, [&] { f32g::pack(false, K, N, B.data(), N, P.data()); }));
    td.push_back(time_it(reps, [&] { dn.run(); }));
    tb.push_back(time_it(reps, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(M), int(N), int(K), 1.0f, A.data(), int(K), B.data(),
                  int(N), 0.0f, D.data(), int(N));
    }));
  }
  const double gf = 2.0 * double(M) * double(N) * double(K) / 1e9, k = median(tk), p = median(tp);
  std::printf("f32  %6lld %6lld %6lld | %7.1f %7.1f %7.1f %7.1f | %.1e %.1e\n", (long long)M, (long long)N,
              (long long)K, gf / k, gf / (k + p), gf / median(td), gf / median(tb), max_diff(C, E), max_diff(C, D));
}

void run_bf16(int64_t M, int64_t N, int64_t K, int reps) {
  std::vector<uint16_t> A(size_t(M * K)), B(size_t(K * N));
  std::vector<float> C(size_t(M * N)), E(size_t(M * N));
  std::vector<uint32_t> P(size_t(bfg::packed_words(K, N)));
  for (size_t i = 0; i < A.size(); ++i) A[i] = tessera::f32_to_bf16(float(int(i * 7 % 13) - 6) / 8.0f);
  for (size_t i = 0; i < B.size(); ++i) B[i] = tessera::f32_to_bf16(float(int(i * 5 % 11) - 5) / 8.0f);
  std::vector<const uint16_t*> rows(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) rows[size_t(k)] = B.data() + k * N;
  Dnnl dn(M, N, K, true, A.data(), B.data(), E.data());
  bfg::pack_rows(rows.data(), K, N, P.data());
  std::vector<double> tk, tp, td;
  for (int round = 0; round < 15; ++round) {
    tk.push_back(time_it(reps, [&] { bfg::gemm(M, N, K, A.data(), K, P.data(), 1.0f, false, C.data(), N); }));
    tp.push_back(time_it(reps, [&] { bfg::pack_rows(rows.data(), K, N, P.data()); }));
    td.push_back(time_it(reps, [&] { dn.run(); }));
  }
  const double gf = 2.0 * double(M) * double(N) * double(K) / 1e9, k = median(tk), p = median(tp);
  std::printf("bf16 %6lld %6lld %6lld | %7.1f %7.1f %7.1f %7s | %.1e\n", (long long)M, (long long)N, (long long)K,
              gf / k, gf / (k + p), gf / median(td), "-", max_diff(C, E));
}

}  // namespace

int main(int argc, char** argv) {
  openblas_set_num_threads(1);
  // LCE's logits / dx tiles (b × chunk × h), attention's S = QKᵀ and O = PV tiles, mlstm's chunk
  const auto shapes = gemm_bench::shapes(argc, argv,
                                         {{256, 512, 512}, {256, 512, 1024}, {64, 2048, 1024}, {256, 512, 128},
                                          {256, 128, 512}, {64, 256, 256}, {512, 2048, 1024}});
  std::printf("one thread, GFLOP/s, median of 15 interleaved rounds; f32 kernel isa %s, bf16 dot %s\n",
              f32g::isa_name(f32g::isa()), bfg::native() ? "native" : "not native");
  std::printf("dt        M      N      K |  kernel   +pack  oneDNN   sgemm | max|diff| vs oneDNN, sgemm\n");
  for (const auto& s : shapes) {
    const int reps = int(std::clamp<double>(2e8 / (2.0 * s[0] * s[1] * s[2]), 1, 200));
    run_f32(s[0], s[1], s[2], reps);
    if (bfg::available()) run_bf16(s[0], s[1], s[2], reps);
  }
  return 0;
}
