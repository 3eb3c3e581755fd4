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

}  // namespace tessera::lce_test
