#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "harness/device_hooks.h"
#include "tessera/dtype.h"
#include "tessera/error.h"
#include "tessera/tensor.h"

namespace tessera {
namespace {

TEST(DType, Bf16RoundTripsExactValues) {
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 3.140625f, 65536.0f, 1e-30f}) {
    const float r = bf16_to_f32(f32_to_bf16(v));
    EXPECT_EQ(std::fabs(r - v) <= std::fabs(v) * (1.0f / 256), true) << v;
  }
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.140625f)), -3.140625f);
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3·2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even) -> 1.015625.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.015625f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256 + 1e-6f)), 1.0078125f);
}

TEST(DType, Bf16KeepsNanAndInf) {
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(INFINITY)), INFINITY);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-INFINITY)), -INFINITY);
}

TEST(DType, F16MatchesKnownEncodings) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);            // max finite
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);            // rounds to Inf
  EXPECT_EQ(f32_to_f16(5.9604645e-08f), 0x0001);      // smallest subnormal 2^-24
  EXPECT_EQ(f32_to_f16(6.1035156e-05f), 0x0400);      // smallest normal 2^-14
  EXPECT_EQ(f32_to_f16(0.333333333f), 0x3555);
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(f16_to_f32(0x0001), 5.9604645e-08f);
  EXPECT_EQ(f16_to_f32(0x03ff), 6.0975552e-05f);      // largest subnormal
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(DType, F16RoundTripsEveryFiniteEncoding) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;  // Inf/NaN
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    EXPECT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

// OCP E4M3 ("e4m3fn"): the values ml_dtypes.float8_e4m3fn and torch.float8_e4m3fn give.
TEST(DType, F8E4M3MatchesKnownEncodings) {
  EXPECT_EQ(f8e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(f8e4m3_to_f32(0x80)));
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(f8e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x77), 240.0f);  // e 14, m 7: 1.875 · 2^7 (e 15 m 7 is NaN, not this)
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0xff)));
  EXPECT_EQ(f8e4m3_to_f32(0x78), 256.0f);  // e 15 is a normal exponent in e4m3fn
}

TEST(DType, F8E4M3RoundsToNearestEvenAndOverflowsToNan) {
  EXPECT_EQ(f32_to_f8e4m3(1.0625f), 0x38);   // halfway 1 | 1.125: to even (1)
  EXPECT_EQ(f32_to_f8e4m3(1.1875f), 0x3a);   // halfway 1.125 | 1.25: to even (1.25)
  EXPECT_EQ(f32_to_f8e4m3(1.07f), 0x39);
  EXPECT_EQ(f32_to_f8e4m3(-3.3f), 0xc5);     // -3.25
  EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7e);    // halfway 448 | (480): to even, 448
  EXPECT_EQ(f32_to_f8e4m3(465.0f), 0x7f);    // past it: NaN (no infinity in e4m3fn)
  EXPECT_EQ(f32_to_f8e4m3(-1e6f), 0xff);
  EXPECT_EQ(f32_to_f8e4m3(std::numeric_limits<float>::infinity()), 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(std::nanf("")), 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -10)), 0x00);      // halfway 0 | 2^-9: to even, 0
  EXPECT_EQ(f32_to_f8e4m3(3 * std::ldexp(1.0f, -10)), 0x02);  // halfway 1 | 2 units of 2^-9
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(15.5f, -10)), 0x08);     // 7.75 units rounds up into the normals
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -30)), 0x00);
  EXPECT_EQ(f32_to_f8e4m3(-0.0f), 0x80);
}

TEST(DType, F8E4M3RoundTripsEveryEncoding) {
  for (uint32_t c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(f32_to_f8e4m3(f8e4m3_to_f32(static_cast<uint8_t>(c))), c) << std::hex << c;
  }
  uint8_t buf[2] = {0, 0};
  store_from_f32(buf, DType::kF8E4M3, 1, -2.0f);
  EXPECT_EQ(buf[1], 0xc0);
  EXPECT_EQ(load_as_f32(buf, DType::kF8E4M3, 1), -2.0f);
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
}

TEST(DType, ParseAndNames) {
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float16"), DType::kF16);
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::kF8E4M3);
  EXPECT_STREQ(dtype_name(DType::kI64), "i64");
  EXPECT_STREQ(dtype_name(DType::kF8E4M3), "f8e4m3");
  EXPECT_THROW(parse_dtype("f8"), Error);
}

TEST(Tensor, ContiguityAndTranspose) {
  Tensor t = Tensor::zeros(DType::kF32, {3, 5});
  EXPECT_TRUE(t.view().is_contiguous());
  Tensor tt = t.as_strided({5, 3}, {1, 5});
  EXPECT_FALSE(tt.view().is_contiguous());
  EXPECT_EQ(tt.data(), t.data());
  EXPECT_THROW(t.as_strided({5, 4}, {1, 5}), Error);
  // empty_like_layout keeps the memory layout: row-major, or the same transposed view.
  Tensor c = Tensor::empty_like_layout(t.view(), DType::kBF16);
  EXPECT_EQ(c.dtype(), DType::kBF16);
  EXPECT_EQ(c.view().strides, (Shape{5, 1}));
  Tensor ct = Tensor::empty_like_layout(tt.view(), DType::kF32);
  EXPECT_EQ(ct.shape(), (Shape{5, 3}));
  EXPECT_EQ(ct.view().strides, (Shape{1, 5}));
  EXPECT_THROW(Tensor::empty_like_layout(TensorView(t.data(), DType::kF32, {3, 2}, {10, 2}), DType::kF32), Error);
  // A CUDA tensor: refused with an Error without a device (or without the CUDA module), allocated with one.
  const harness::DeviceHooks* cuda = harness::device_hooks(DeviceType::kCUDA);
  if (cuda != nullptr && cuda->device_count() > 0)
    EXPECT_EQ(Tensor::empty(DType::kF32, {2}, Device::cuda()).numel(), 2);
  else
    EXPECT_THROW(Tensor::empty(DType::kF32, {2}, Device::cuda()).numel(), Error);
}

}  // namespace
}  // namespace tessera
