// Tessera internal: a host tensor of any float dtype seen as f32, for an API whose host path
// computes in f32 (mlstm's inputs and gradients, slstm's dh). An input is the caller's buffer
// when it is f32 already, else a converted copy; an output is the caller's buffer when it is f32,
// else a zeroed f32 scratch that finish() stores back in the caller's dtype. An absent view
// (dispatch::given false) gives a null pointer. in_dtype: the other way, an f32 upstream gradient
// rounded to the dtype a kernel takes. as_flags: a host mask as 0/1 bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "dispatch/arg_check.h"
#include "tessera/tensor.h"

namespace tessera::dispatch {

struct F32In {
  Tensor copy;
  const float* ptr = nullptr;
};
inline F32In as_f32(const TensorView& t) {
  F32In r;
  if (!given(t)) return r;
  if (t.dtype == DType::kF32) {
    r.ptr = t.data_as<const float>();
    return r;
  }
  r.copy = Tensor::empty(DType::kF32, t.shape);
  for (int64_t j = 0; j < t.numel(); ++j) r.copy.data_as<float>()[j] = load_as_f32(t.data, t.dtype, j);
  r.ptr = r.copy.data_as<const float>();
  return r;
}

struct F32Out {
  TensorView user;
  Tensor scratch;
  float* ptr = nullptr;
  void finish() const {
    if (!scratch.defined()) return;
    for (int64_t j = 0; j < user.numel(); ++j) store_from_f32(user.data, user.dtype, j, scratch.data_as<float>()[j]);
  }
};
inline F32Out as_f32_out(const TensorView& t) {
  F32Out r;
  r.user = t;
  if (!given(t)) return r;
  if (t.dtype == DType::kF32) {
    r.ptr = t.data_as<float>();
    return r;
  }
  r.scratch = Tensor::zeros(DType::kF32, t.shape);
  r.ptr = r.scratch.data_as<float>();
  return r;
}

// A contiguous host float view in `dtype` (frameworks hand upstream gradients in f32 where a kernel
// takes the inputs' dtype): a copy rounded once, kept in `keep`; any other view is returned as it
// is (the call's validation then names it).
inline TensorView in_dtype(const TensorView& t, DType dtype, Tensor& keep) {
  if (t.dtype == dtype || !is_float(t.dtype) || t.device.type != DeviceType::kCPU || !t.is_contiguous()) return t;
  keep = Tensor::empty(dtype, t.shape);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_f32(keep.data(), dtype, i, load_as_f32(t.data, t.dtype, i));
  return keep.view();
}

// An integer mask in host memory (resets) as 0/1 bytes kept in `keep`; null when not given. Call
// it after the mask passed an "int" rule and only for host data (it reads the elements).
inline const uint8_t* as_flags(const TensorView& mask, std::vector<uint8_t>& keep) {
  if (!given(mask)) return nullptr;
  keep.resize(static_cast<size_t>(mask.numel()));
  for (int64_t i = 0; i < mask.numel(); ++i) keep[size_t(i)] = load_as_i64(mask.data, mask.dtype, i) != 0;
  return keep.data();
}

}  // namespace tessera::dispatch
