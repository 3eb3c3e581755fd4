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

TEST(DType, ParseAndNames) {
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float16"), DType::kF16);
  EXPECT_STREQ(dtype_name(DType::kI64), "i64");
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
