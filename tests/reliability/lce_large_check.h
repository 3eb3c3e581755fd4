// The size test of linear_cross_entropy shared by the host and device suites: a problem whose
// logits count B·V passes 2^31 (B = 65536, V = 32771, H = 16: 2 147 680 256 logits, never
// materialized), run with gradients on `impl` (inputs on `dev`) and checked against the reference
// by sampling: whole rows (loss, lse, dx) from a reference run on those rows alone, the last rows
// included (their flat logit index t·V + v is past 2^31), and whole columns of dw recomputed in
// double from the inputs and the checked lse. About 25 MiB of memory.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/linear_cross_entropy.h"

namespace tessera {

// `tol`: the scale of the tolerances (1: the cpu backend's f32 sums; a device's GEMMs sum in
// another order: the cuda suite passes 10, the check grid's 2e-4 relative for f32).
inline void expect_lce_large_matches_samples(const std::string& impl, Device dev, double tol = 1.0) {
  namespace lce = linear_cross_entropy;
  const int64_t B = 65536, H = 16, V = 32771;
  ASSERT_GT(B * V, int64_t{1} << 31);
  Tensor x = Tensor::empty(DType::kF32, {B, H}), w = Tensor::empty(DType::kF32, {H, V});
  Tensor labels = Tensor::empty(DType::kI64, {B});
  uint64_t s = 12345;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<double>(s >> 40) / 16777216.0 - 0.5);
  };
  for (int64_t i = 0; i < B * H; ++i) x.data_as<float>()[i] = next();
  for (int64_t i = 0; i < H * V; ++i) w.data_as<float>()[i] = 2.0f * next();
  for (int64_t t = 0; t < B; ++t) labels.data_as<int64_t>()[t] = (t * 7919) % V;
  labels.data_as<int64_t>()[B - 1] = V - 1;  // the very last logit of the problem
  labels.data_as<int64_t>()[100] = -100;     // an ignored row

  lce::Options opt;
  opt.implementation = impl;
  opt.reduction = lce::Reduction::kNone;
  opt.skip_ignored = false;  // every row computed: lse of the ignored row is compared too
  const Tensor xd = x.to(dev), wd = w.to(dev), yd = labels.to(dev);
  lce::Inputs in{xd.view(), wd.view(), std::nullopt, yd.view(), std::nullopt};
  lce::Result r = lce::compute_with_grad(in, opt);
  ASSERT_EQ(r.implementation, impl);
  r.loss = r.loss.to(Device::cpu()), r.lse = r.lse.to(Device::cpu()), r.dx = r.dx.to(Device::cpu());
  r.dw = r.dw.to(Device::cpu());

  // Rows: the first, an ignored one, the middle, and the last ten (t·V past 2^31).
  std::vector<int64_t> rows = {0, 1, 100, 4097, B / 2};
  for (int64_t t = B - 10; t < B; ++t) rows.push_back(t);
  ASSERT_GT(rows.back() * V, int64_t{1} << 31);
  const int64_t S = static_cast<int64_t>(rows.size());
  Tensor xs = Tensor::empty(DType::kF32, {S, H}), ls = Tensor::empty(DType::kI64, {S});
  for (int64_t i = 0; i < S; ++i) {
    std::memcpy(xs.data_as<float>() + i * H, x.data_as<float>() + rows[i] * H, H * sizeof(float));
    ls.data_as<int64_t>()[i] = labels.data_as<int64_t>()[rows[i]];
  }
  lce::Options ref_opt = opt;
  ref_opt.implementation = "reference";
  const lce::Result ref = lce::compute_with_grad({xs.view(), w.view(), std::nullopt, ls.view(), std::nullopt}, ref_opt);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t t = rows[i];
    EXPECT_NEAR(r.loss.data_as<float>()[t], ref.loss.data_as<float>()[i], tol * 2e-5 * (1 + std::fabs(ref.loss.data_as<float>()[i])))
        << "row " << t;
    EXPECT_NEAR(r.lse.data_as<float>()[t], ref.lse.data_as<float>()[i], tol * 2e-5 * (1 + std::fabs(ref.lse.data_as<float>()[i])))
        << "row " << t;
    for (int64_t h = 0; h < H; ++h)
      EXPECT_NEAR(r.dx.data_as<float>()[t * H + h], ref.dx.data_as<float>()[i * H + h], tol * 1e-5) << "dx row " << t;
  }

  // Columns of dw: dw[h, v] = Σ_t x[t, h] · (softmax(z_t)_v − [y_t = v]), in double, with
  // z_tv recomputed from x and w and the row's lse from the (sample-checked) kernel.
  for (int64_t v : {int64_t{0}, int64_t{7919}, V / 2, V - 1}) {
    std::vector<double> col(H, 0.0);
    for (int64_t t = 0; t < B; ++t) {
      const int64_t y = labels.data_as<int64_t>()[t];
      if (y == -100) continue;
      const float* xt = x.data_as<float>() + t * H;
      double z = 0;
      for (int64_t h = 0; h < H; ++h) z += static_cast<double>(xt[h]) * w.data_as<float>()[h * V + v];
      const double g = std::exp(z - r.lse.data_as<float>()[t]) - (y == v ? 1.0 : 0.0);
      for (int64_t h = 0; h < H; ++h) col[h] += xt[h] * g;
    }
    for (int64_t h = 0; h < H; ++h)
      EXPECT_NEAR(r.dw.data_as<float>()[h * V + v], col[h], tol * 1e-4 * (1 + std::fabs(col[h]))) << "dw[" << h << ", " << v << "]";
  }
}

}  // namespace tessera
