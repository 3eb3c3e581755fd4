// mla_decode cpu: stage 1's scores with bf16 dot products (vdpbf16ps, AVX512-BF16), used for
// bf16 inputs where the CPU has them (cpu_stages.h). Exact bf16 products summed in f32.
#include <algorithm>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/env.h"
#include "kernels/mla_decode/cpu_stages.h"

namespace tessera::mla_decode::cpu {

bool have_bf16_dot() {
#if defined(__x86_64__)
  static const bool have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512bf16");
  return have && env::flag("TESSERA_CPU_BF16_DOT", true);
#else
  return false;
#endif
}

#if defined(__x86_64__)
// Rows r0..r0+3 against keys j0..j0+31: 8 accumulators of 16 keys, one broadcast q pair per row.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void block4x32(const uint32_t* qp, int64_t D2,
                                                                            const uint32_t* ct, int64_t stride,
                                                                            __m512 acc[4][2]) {
  for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t d2 = 0; d2 < D2; ++d2) {
    const __m512bh c0 = (__m512bh)_mm512_loadu_si512(ct + d2 * stride);
    const __m512bh c1 = (__m512bh)_mm512_loadu_si512(ct + d2 * stride + 16);
    for (int i = 0; i < 4; ++i) {
      const __m512bh q = (__m512bh)_mm512_set1_epi32(static_cast<int>(qp[i * D2 + d2]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], q, c0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], q, c1);
    }
  }
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void scores_bf16_dot(const uint32_t* qp, int64_t R, int64_t D2,
                                                                           const uint32_t* ct, int64_t stride,
                                                                           int64_t n, float scale, float* s) {
  const __m512 sc = _mm512_set1_ps(scale);
  alignas(64) float tmp[32];
  for (int64_t r0 = 0; r0 < R; r0 += 4) {
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
      __m512 acc[4][2];
      block4x32(qp + r0 * D2, D2, ct + j0, stride, acc);
      const int64_t cols = std::min<int64_t>(32, n - j0);
      for (int64_t i = 0; i < std::min<int64_t>(4, R - r0); ++i) {
        _mm512_store_ps(tmp, _mm512_mul_ps(acc[i][0], sc));
        _mm512_store_ps(tmp + 16, _mm512_mul_ps(acc[i][1], sc));
        std::copy(tmp, tmp + cols, s + (r0 + i) * n + j0);
      }
    }
  }
}
#else
void scores_bf16_dot(const uint32_t*, int64_t, int64_t, const uint32_t*, int64_t, int64_t, float, float*) {}
#endif

}  // namespace tessera::mla_decode::cpu
