// Small helpers shared by the linear_cross_entropy test files.
#pragma once

#include <cstring>
#include <vector>

#include "tessera/linear_cross_entropy.h"

namespace tessera::lce_test {

inline Tensor f32_tensor(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

inline Tensor i64_tensor(const Shape& shape, const std::vector<int64_t>& values) {
  Tensor t = Tensor::empty(DType::kI64, shape);
  std::memcpy(t.data(), values.data(), values.size() * sizeof(int64_t));
  return t;
}

inline Tensor scalar_f32(float v) { return f32_tensor({}, {v}); }

// ANCHORS' bf16 dW drift case: B identical rows (same x, label 5), H = 8, V = 16, in `dt`. With
// one token per chunk every chunk adds the same-signed increment to dw, so a 16-bit accumulator
// stalls after ~2^8 of them; an f32 one rounded once is within 2^-7 of the reference.
struct IdenticalRows {
  static constexpr int64_t H = 8, V = 16;
  int64_t B;
  DType dt;
  Tensor x, w, labels;
  IdenticalRows(int64_t b, DType d) : B(b), dt(d) {
    x = Tensor::empty(dt, {B, H}), w = Tensor::empty(dt, {H, V}), labels = Tensor::empty(DType::kI64, {B});
    for (int64_t t = 0; t < B; ++t) {
      for (int64_t h = 0; h < H; ++h) store_from_f32(x.data(), dt, t * H + h, 0.25f * static_cast<float>(h % 5) - 0.5f);
      labels.data_as<int64_t>()[t] = 5;
    }
    for (int64_t i = 0; i < H * V; ++i) store_from_f32(w.data(), dt, i, 0.1f * static_cast<float>((i * 7) % 11) - 0.5f);
  }
  // dw (in dt, on the host) of a reduction-sum forward_backward on `dev` with options `o`.
  Tensor dw(linear_cross_entropy::Options o, Device dev = Device::cpu()) const {
    namespace lce = linear_cross_entropy;
    o.reduction = lce::Reduction::kSum;
    const Tensor xd = x.to(dev), wd = w.to(dev), yd = labels.to(dev), g = scalar_f32(1.0f).to(dev);
    const lce::Inputs in{xd.view(), wd.view(), std::nullopt, yd.view(), std::nullopt};
    Tensor loss = Tensor::empty(DType::kF32, {}, dev), lse = Tensor::empty(DType::kF32, {B}, dev);
    Tensor dx = Tensor::empty(dt, {B, H}, dev), dwt = Tensor::empty(dt, {H, V}, dev);
    lce::forward_backward(in, g.view(), {loss.view(), lse.view(), std::nullopt}, {dx.view(), dwt.view(), std::nullopt}, o);
    return dwt.to(Device::cpu());
  }
};

}  // namespace tessera::lce_test
