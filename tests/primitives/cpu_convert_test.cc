// cpu_convert: the one SIMD widening of bf16/f16 to f32 that every CPU backend uses, against the
// scalar conversions of tessera/dtype.h: every f16 encoding, bf16 encodings, every tail length.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "hwy/targets.h"
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif
#include "primitives/cpu_convert.h"
#include "tessera/dtype.h"

namespace tessera {
namespace {

bool same_bits_or_both_nan(float a, float b) {
  if (a != a && b != b) return true;
  return std::memcmp(&a, &b, sizeof a) == 0;
}

TEST(CpuConvert, EveryF16AndBf16EncodingWidensExactly) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> out(65536);
  for (bool bf16 : {false, true}) {
    cpu_convert::half_to_f32(all.data(), bf16, out.data(), 65536);
    for (uint32_t i = 0; i < 65536; ++i) {
      const float want = bf16 ? bf16_to_f32(all[i]) : f16_to_f32(all[i]);
      ASSERT_TRUE(same_bits_or_both_nan(out[i], want)) << (bf16 ? "bf16 " : "f16 ") << std::hex << i;
    }
  }
}

TEST(CpuConvert, EveryF8E4M3EncodingWidensExactlyAtEveryLength) {
  std::vector<uint8_t> all(256 + 40);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint8_t>(i * 37 + 11);  // every code, shuffled
  for (int64_t n : {0, 1, 7, 15, 16, 17, 33, 255, 256, 257, 295}) {
    std::vector<float> dst(static_cast<size_t>(n) + 2, -7.0f);
    cpu_convert::f8e4m3_to_f32(all.data() + 1, dst.data() + 1, n);  // unaligned on purpose
    EXPECT_EQ(dst[0], -7.0f);
    EXPECT_EQ(dst[static_cast<size_t>(n) + 1], -7.0f) << n;
    for (int64_t i = 0; i < n; ++i)
      ASSERT_TRUE(same_bits_or_both_nan(dst[static_cast<size_t>(i) + 1], f8e4m3_to_f32(all[static_cast<size_t>(i) + 1])))
          << n << " " << i;
    std::vector<uint16_t> b(static_cast<size_t>(n) + 2, 0xdead);
    cpu_convert::f8e4m3_to_bf16(all.data() + 1, b.data() + 1, n);
    EXPECT_EQ(b[0], 0xdead);
    EXPECT_EQ(b[static_cast<size_t>(n) + 1], 0xdead) << n;
    for (int64_t i = 0; i < n; ++i)
      ASSERT_TRUE(same_bits_or_both_nan(bf16_to_f32(b[static_cast<size_t>(i) + 1]), f8e4m3_to_f32(all[static_cast<size_t>(i) + 1])))
          << n << " " << i;
  }
}

// A caller's flush-to-zero / denormals-are-zero mode (torch.set_flush_denormal(True) sets it)
// must not touch an f8e4m3 subnormal: the widening is integer arithmetic.
TEST(CpuConvert, F8E4M3WidensSubnormalsUnderFlushToZero) {
#if defined(__x86_64__)
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ | DAZ
  std::vector<uint8_t> codes(64);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i < 32 ? i % 16 : 0x80 | (i % 16));
  std::vector<float> f(64);
  std::vector<uint16_t> b(64);
  cpu_convert::f8e4m3_to_f32(codes.data(), f.data(), 64);
  cpu_convert::f8e4m3_to_bf16(codes.data(), b.data(), 64);
  _mm_setcsr(saved);
  for (size_t i = 0; i < codes.size(); ++i) {
    EXPECT_TRUE(same_bits_or_both_nan(f[i], f8e4m3_to_f32(codes[i]))) << i;
    EXPECT_TRUE(same_bits_or_both_nan(bf16_to_f32(b[i]), f8e4m3_to_f32(codes[i]))) << i;
  }
  EXPECT_EQ(f[1], std::ldexp(1.0f, -9));
#else
  GTEST_SKIP() << "x86-64 only (MXCSR)";
#endif
}

TEST(CpuConvert, TailsWriteExactlyNElements) {
  std::vector<uint16_t> src(70);
  for (size_t i = 0; i < src.size(); ++i) src[i] = f32_to_bf16(0.5f * static_cast<float>(i) - 3.0f);
  for (int64_t n = 0; n <= 69; ++n) {
    std::vector<float> dst(71, -7.0f);
    cpu_convert::half_to_f32(src.data() + 1, true, dst.data() + 1, n);  // unaligned on purpose
    EXPECT_EQ(dst[0], -7.0f);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(dst[1 + i], bf16_to_f32(src[1 + i])) << n << " " << i;
    EXPECT_EQ(dst[1 + n], -7.0f) << "wrote past n=" << n;
  }
}

// Rounding to f16 as dtype.h does it: every f16 value, every midpoint between neighbours (ties
// to even), values past the largest finite (overflow), subnormal midpoints, NaN and infinities.
TEST(CpuConvert, F32ToF16RoundsLikeTheScalarConversion) {
  std::vector<float> src;
  for (uint32_t i = 0; i < 65536; ++i) {
    const float a = f16_to_f32(static_cast<uint16_t>(i)), b = f16_to_f32(static_cast<uint16_t>(i + 1));
    src.push_back(a);
    if (a == a && b == b) {
      src.push_back(0.5f * (a + b));  // a tie (exact in f32)
      src.push_back(std::nextafter(0.5f * (a + b), b));
    }
  }
  for (float v : {65504.0f, 65519.0f, 65520.0f, 1e6f, -1e6f, 1e-9f, -1e-9f, 3e-8f, 0.0f, -0.0f}) src.push_back(v);
  std::vector<uint16_t> got(src.size());
  for (size_t n : {src.size(), size_t{13}, size_t{1}}) {
    cpu_convert::f32_to_f16(src.data(), got.data(), static_cast<int64_t>(n));
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = f32_to_f16(src[i]);
      if (src[i] != src[i]) {
        EXPECT_TRUE(f16_to_f32(got[i]) != f16_to_f32(got[i])) << i;
        continue;
      }
      ASSERT_EQ(got[i], want) << "value " << src[i] << " (index " << i << ")";
    }
  }
}

// Rounding to bf16: bit for bit the scalar conversion over a sweep of f32 bit patterns (every
// 2^12th encoding with its neighbours, so ties, carries into the exponent, overflow to inf,
// subnormals and NaN payloads all occur), at every tail length.
TEST(CpuConvert, F32ToBf16IsBitForBitTheScalarConversion) {
  std::vector<float> src;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4096)
    for (uint32_t d : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const uint32_t bits = static_cast<uint32_t>(u) + d;
      float f;
      std::memcpy(&f, &bits, 4);
      src.push_back(f);
    }
  std::vector<uint16_t> got(src.size());
  cpu_convert::f32_to_bf16(src.data(), got.data(), static_cast<int64_t>(src.size()));
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(got[i], f32_to_bf16(src[i])) << "index " << i;
  for (int64_t n = 1; n <= 33; ++n) {
    std::vector<uint16_t> t(static_cast<size_t>(n) + 1, 0xabcd);
    cpu_convert::f32_to_bf16(src.data() + 7, t.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(t[i], f32_to_bf16(src[7 + i]));
    EXPECT_EQ(t[n], 0xabcd) << "wrote past n=" << n;
  }
}

// The same checks with Highway restricted to SSE4 (x86 CPUs without AVX2, VMs that hide it):
// Highway 1.0 emulates f16 there by truncation (1 + 2^-11 + 2^-20 gave 0x3c00, not 0x3c01;
// 65520 gave 0x7bff, not Inf), so those targets take the scalar conversions.
class CpuConvertSse4 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!(hwy::SupportedTargets() & HWY_SSE4)) GTEST_SKIP() << "no SSE4 target here";
    hwy::SetSupportedTargetsForTest(HWY_SSE4);
  }
  void TearDown() override { hwy::SetSupportedTargetsForTest(0); }
};

TEST_F(CpuConvertSse4, F32ToF16RoundsAndOverflowsLikeTheScalarConversion) {
  const float src[] = {1.0f + 0x1p-11f + 0x1p-20f, 65520.0f, 1e6f, -INFINITY, 0.1f, 3e-8f, -2.5f, 65504.0f, 1.0f + 0x1p-11f};
  uint16_t got[9];
  cpu_convert::f32_to_f16(src, got, 9);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(got[i], f32_to_f16(src[i])) << src[i];
}

TEST_F(CpuConvertSse4, F16InfinitiesAndNaNWidenExactly) {
  const uint16_t src[] = {0x7c00, 0xfc00, 0x7e00, 0x3c01, 0x0001, 0x7bff, 0x8000, 0x3555};
  float got[8];
  cpu_convert::half_to_f32(src, false, got, 8);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(same_bits_or_both_nan(got[i], f16_to_f32(src[i]))) << std::hex << src[i];
}

}  // namespace
}  // namespace tessera
