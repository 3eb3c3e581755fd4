// linear_cross_entropy: skipping ignored tokens (see compact.h).
#include "kernels/linear_cross_entropy/compact.h"

#include <cstring>

namespace tessera::linear_cross_entropy {

std::optional<Compaction> Compaction::make(const Problem& p) {
  if (p.device.type != DeviceType::kCPU || p.B == 0) return std::nullopt;
  Compaction c;
  for (int64_t t = 0; t < p.B; ++t)
    if (!p.ignored(t)) c.rows_.push_back(t);
  const int64_t ignored = p.B - c.kept();
  if (ignored == 0 || ignored * kMinIgnoredShare < p.B) return std::nullopt;
  c.p_ = p;
  c.q_ = p;
  const int64_t n = c.kept();
  c.q_.B = n;
  const size_t row_bytes = static_cast<size_t>(p.H) * dtype_size(p.dtype);
  c.x_ = Tensor::empty(p.dtype, {n, p.H});
  c.labels_ = Tensor::empty(DType::kI64, {n});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = c.rows_[static_cast<size_t>(i)];
    std::memcpy(static_cast<char*>(c.x_.data()) + static_cast<size_t>(i) * row_bytes,
                static_cast<const char*>(p.x) + static_cast<size_t>(t) * row_bytes, row_bytes);
    c.labels_.data_as<int64_t>()[i] = p.label(t);
  }
  c.q_.x = c.x_.data();
  c.q_.labels = c.labels_.data();
  c.q_.label_dtype = DType::kI64;
  c.q_.weights = c.gather(p.weights, c.weights_);
  c.q_.token_weights = c.gather(p.token_weights, c.token_weights_);
  c.per_token_loss_ = p.reduction == Reduction::kNone;
  return c;
}

// The kept rows of a per-token f32 array into `dst` (null stays null).
const float* Compaction::gather(const float* src, Tensor& dst) const {
  if (!src) return nullptr;
  const int64_t n = kept();
  dst = Tensor::empty(DType::kF32, {n});
  for (int64_t i = 0; i < n; ++i) dst.data_as<float>()[i] = src[rows_[static_cast<size_t>(i)]];
  return dst.data_as<float>();
}

ForwardOut Compaction::forward_out(const ForwardOut& full) {
  const int64_t n = kept();
  ForwardOut o = full;
  if (per_token_loss_) {
    loss_ = Tensor::empty(DType::kF32, {n});
    o.loss = loss_.data_as<float>();
  }
  lse_ = Tensor::empty(DType::kF32, {n});
  o.lse = lse_.data_as<float>();
  if (full.argmax) {
    argmax_ = Tensor::empty(DType::kI64, {n});
    o.argmax = argmax_.data_as<int64_t>();
  }
  return o;
}

GradIn Compaction::grad_in(const GradIn& full) {
  GradIn g = full;
  if (per_token_loss_) g.grad_loss = gather(full.grad_loss, grad_);
  if (full.lse) g.lse = gather(full.lse, lse_in_);
  return g;
}

GradOut Compaction::grad_out(const GradOut& full) {
  GradOut g = full;
  if (!full.dx) return g;  // dx left out (Gradients): nothing to gather or scatter
  dx_dtype_ = full.dx_dtype;
  dx_ = Tensor::empty(full.dx_dtype, {kept(), p_.H});
  g.dx = dx_.data();
  return g;
}

void Compaction::scatter_forward(const ForwardOut& full) const {
  std::vector<char> keep(static_cast<size_t>(p_.B), 0);
  for (int64_t t : rows_) keep[static_cast<size_t>(t)] = 1;
  for (int64_t t = 0; t < p_.B; ++t) {
    if (keep[static_cast<size_t>(t)]) continue;
    if (per_token_loss_) full.loss[t] = 0.0f;
    full.lse[t] = 0.0f;
    if (full.argmax) full.argmax[t] = 0;
  }
  for (int64_t i = 0; i < kept(); ++i) {
    const int64_t t = rows_[static_cast<size_t>(i)];
    if (per_token_loss_) full.loss[t] = loss_.data_as<float>()[i];
    full.lse[t] = lse_.data_as<float>()[i];
    if (full.argmax) full.argmax[t] = argmax_.data_as<int64_t>()[i];
  }
}

void Compaction::scatter_backward(const GradOut& full) const {
  if (!full.dx) return;
  const size_t row_bytes = static_cast<size_t>(p_.H) * dtype_size(dx_dtype_);
  std::memset(full.dx, 0, static_cast<size_t>(p_.B) * row_bytes);  // 0 bits are 0.0 in every dtype
  for (int64_t i = 0; i < kept(); ++i)
    std::memcpy(static_cast<char*>(full.dx) + static_cast<size_t>(rows_[static_cast<size_t>(i)]) * row_bytes,
                static_cast<const char*>(dx_.data()) + static_cast<size_t>(i) * row_bytes, row_bytes);
}

}  // namespace tessera::linear_cross_entropy
