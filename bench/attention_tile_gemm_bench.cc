// attention cpu: the two matrix products of a forward tile, OpenBLAS sgemm vs a Highway
// micro-kernel, at D = 128 (never a unit test). Decides which one the cpu backend uses
// (docs/kernels/attention.md, devlog v1).
//
//   S = Q·Kᵀ  (bq × bk, K = D)   and   O += P·V  (bq × D, K = bk), single thread, f32.
//
// The Highway kernel is a register-blocked 6 × 2-vector micro-kernel (12 accumulators, FMA) over
// B packed into 2-vector column panels; its timing includes packing Kᵀ / V per tile, as the
// backend would have to. Both are timed in interleaved rounds (median), so load drift on a shared
// machine hits both alike. Results are checked against each other.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/attention_tile_gemm_bench.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/aligned_allocator.h"

HWY_BEFORE_NAMESPACE();
namespace tilebench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// Bp[p][k][0..2N): columns [p·2N, p·2N + 2N) of B (zero-padded), B[k][n] = trans ? M[n][k] : M[k][n].
void Pack(const float* Mx, int64_t ld, bool trans, int64_t K, int64_t N, float* Bp) {
  const DF df;
  const int64_t W = 2 * static_cast<int64_t>(hn::Lanes(df));
  for (int64_t p0 = 0; p0 < N; p0 += W) {
    float* dst = Bp + (p0 / W) * K * W;
    const int64_t w = std::min(W, N - p0);
    for (int64_t k = 0; k < K; ++k) {
      float* d = dst + k * W;
      if (trans)
        for (int64_t c = 0; c < w; ++c) d[c] = Mx[(p0 + c) * ld + k];
      else
        for (int64_t c = 0; c < w; ++c) d[c] = Mx[k * ld + p0 + c];
      for (int64_t c = w; c < W; ++c) d[c] = 0.0f;
    }
  }
}

template <int MR>
HWY_INLINE void Micro(const float* A, int64_t lda, const float* Bp, int64_t K, float* C, int64_t ldc, int64_t w,
                      float alpha, bool acc) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> c0[MR], c1[MR];
  for (int r = 0; r < MR; ++r) c0[r] = c1[r] = hn::Zero(df);
  for (int64_t k = 0; k < K; ++k) {
    const auto b0 = hn::Load(df, Bp + k * 2 * N), b1 = hn::Load(df, Bp + k * 2 * N + N);
    for (int r = 0; r < MR; ++r) {
      const auto a = hn::Set(df, A[r * lda + k]);
      c0[r] = hn::MulAdd(a, b0, c0[r]);
      c1[r] = hn::MulAdd(a, b1, c1[r]);
    }
  }
  const auto va = hn::Set(df, alpha);
  for (int r = 0; r < MR; ++r) {
    float* c = C + r * ldc;
    if (w == 2 * N) {
      auto x0 = hn::Mul(va, c0[r]), x1 = hn::Mul(va, c1[r]);
      if (acc) {
        x0 = hn::Add(x0, hn::LoadU(df, c));
        x1 = hn::Add(x1, hn::LoadU(df, c + N));
      }
      hn::StoreU(x0, df, c);
      hn::StoreU(x1, df, c + N);
    } else {
      HWY_ALIGN float buf[2 * hn::MaxLanes(df)];
      hn::Store(hn::Mul(va, c0[r]), df, buf);
      hn::Store(hn::Mul(va, c1[r]), df, buf + N);
      for (int64_t j = 0; j < w; ++j) c[j] = acc ? c[j] + buf[j] : buf[j];
    }
  }
}

// C = alpha·A·B (+ C when acc), B packed by Pack.
void Gemm(const float* A, int64_t lda, const float* Bp, int64_t M, int64_t N, int64_t K, float* C, int64_t ldc,
          float alpha, bool acc, int mr) {
  const DF df;
  const int64_t W = 2 * static_cast<int64_t>(hn::Lanes(df));
  for (int64_t p0 = 0; p0 < N; p0 += W) {
    const float* bp = Bp + (p0 / W) * K * W;
    const int64_t w = std::min(W, N - p0);
    int64_t i = 0;
#if HWY_TARGET <= HWY_AVX3
    if (mr == 12)
      for (; i + 12 <= M; i += 12) Micro<12>(A + i * lda, lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc);
    if (mr == 8)
      for (; i + 8 <= M; i += 8) Micro<8>(A + i * lda, lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc);
#else
    (void)mr;
#endif
    for (; i + 6 <= M; i += 6) Micro<6>(A + i * lda, lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc);
    switch (M - i) {
      case 5: Micro<5>(A + i * lda, lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc); break;
      case 4: Micro<4>(A + i * lda, lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc); break;
      case 3: Micro<3>(A + i * lda, lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc); break;
      case 2: Micro<2>(A + i * lda, lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc); break;
      case 1: Micro<1>(A + i * lda, lda, bp, K, C + i * ldc + p0, ldc, w, alpha, acc); break;
      default: break;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tilebench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tilebench {
HWY_EXPORT(Pack);
HWY_EXPORT(Gemm);

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace tilebench

int main(int argc, char** argv) {
  using namespace tilebench;
  openblas_set_num_threads(1);
  const int64_t D = 128, H = 8, ld_in = H * D;  // q/k/v rows of a [S, H, D] tensor
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  // Rows of the micro-kernel's register block: 6 (the backend's), or 8 / 12 on AVX-512 targets.
  const int mr = argc > 2 ? std::atoi(argv[2]) : 6;
  std::vector<float> Q(1024 * ld_in), Kx(4096 * ld_in), V(4096 * ld_in);
  for (size_t i = 0; i < Q.size(); ++i) Q[i] = std::sin(0.37 * double(i));
  for (size_t i = 0; i < Kx.size(); ++i) Kx[i] = std::cos(0.11 * double(i));
  for (size_t i = 0; i < V.size(); ++i) V[i] = std::sin(0.05 * double(i) + 1.0);
  hwy::AlignedFreeUniquePtr<float[]> Bp = hwy::AllocateAligned<float>(4096 * 256 + 64);
  std::printf("single thread, D=%lld, inputs with row stride H*D=%lld; GFLOP/s, median of %d interleaved rounds\n",
              (long long)D, (long long)ld_in, rounds);
  std::printf("%5s %5s | %10s %10s %10s | %10s %10s | %s\n", "bq", "bk", "QKt blas", "QKt hwy", "(no pack)", "PV blas",
              "PV hwy", "max |diff|");
  for (int64_t bq : {64, 128, 256})
    for (int64_t bk : {128, 256, 512}) {
      const int64_t lds = (bk + 15) / 16 * 16;
      std::vector<float> S1(bq * lds), S2(bq * lds), S3(bq * lds), O1(bq * D, 0.0f), O2(bq * D, 0.0f);
      const double fl = 2.0 * double(bq) * double(bk) * double(D);
      const int reps = std::max<int>(2, int(4e8 / fl));
      std::vector<double> t[5];
      for (int r = 0; r < rounds; ++r) {
        double t0 = now();
        for (int i = 0; i < reps; ++i)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(bq), int(bk), int(D), 0.088f, Q.data(), int(ld_in),
                      Kx.data() + (i % 4) * bk * ld_in, int(ld_in), 0.0f, S1.data(), int(lds));
        t[0].push_back((now() - t0) / reps);
        t0 = now();
        for (int i = 0; i < reps; ++i) {
          HWY_DYNAMIC_DISPATCH(Pack)(Kx.data() + (i % 4) * bk * ld_in, ld_in, true, D, bk, Bp.get());
          HWY_DYNAMIC_DISPATCH(Gemm)(Q.data(), ld_in, Bp.get(), bq, bk, D, S2.data(), lds, 0.088f, false, mr);
        }
        t[1].push_back((now() - t0) / reps);
        // The same product with Kᵀ packed once outside the loop (the micro-kernel alone).
        HWY_DYNAMIC_DISPATCH(Pack)(Kx.data(), ld_in, true, D, bk, Bp.get());
        t0 = now();
        for (int i = 0; i < reps; ++i)
          HWY_DYNAMIC_DISPATCH(Gemm)(Q.data(), ld_in, Bp.get(), bq, bk, D, S3.data(), lds, 0.088f, false, mr);
        t[4].push_back((now() - t0) / reps);
        t0 = now();
        for (int i = 0; i < reps; ++i)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(bq), int(D), int(bk), 1.0f, S1.data(), int(lds),
                      V.data() + (i % 4) * bk * ld_in, int(ld_in), 1.0f, O1.data(), int(D));
        t[2].push_back((now() - t0) / reps);
        t0 = now();
        for (int i = 0; i < reps; ++i) {
          HWY_DYNAMIC_DISPATCH(Pack)(V.data() + (i % 4) * bk * ld_in, ld_in, false, bk, D, Bp.get());
          HWY_DYNAMIC_DISPATCH(Gemm)(S2.data(), lds, Bp.get(), bq, D, bk, O2.data(), D, 1.0f, true, mr);
        }
        t[3].push_back((now() - t0) / reps);
      }
      double diff = 0.0;
      for (int64_t i = 0; i < bq; ++i)
        for (int64_t j = 0; j < bk; ++j) diff = std::max(diff, double(std::fabs(S1[i * lds + j] - S2[i * lds + j])));
      double odiff = 0.0, omax = 0.0;
      for (int64_t i = 0; i < bq * D; ++i) {
        odiff = std::max(odiff, double(std::fabs(O1[i] - O2[i])));
        omax = std::max(omax, double(std::fabs(O1[i])));
      }
      diff = std::max(diff, odiff / std::max(1.0, omax));
      double g[5];
      for (int k = 0; k < 5; ++k) {
        std::sort(t[k].begin(), t[k].end());
        g[k] = fl / t[k][t[k].size() / 2] / 1e9;
      }
      std::printf("%5lld %5lld | %10.1f %10.1f %10.1f | %10.1f %10.1f | %.2g\n", (long long)bq, (long long)bk, g[0], g[1],
                  g[4], g[2], g[3], diff);
    }
  return 0;
}
#endif  // HWY_ONCE
