#include "kernels/attention/baseline.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "harness/blas.h"
#include "harness/process.h"
#include "tessera/error.h"

namespace tessera::attention {
namespace {

namespace blas = harness::blas;

Tensor f32_copy(const Tensor& t) {
  Tensor o = Tensor::empty(DType::kF32, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) o.data_as<float>()[i] = load_as_f32(t.data(), t.dtype(), i);
  return o;
}

class Materialized {
 public:
  Materialized(const BaselineInputs& in, Pass pass) : in_(in), fused_(pass == Pass::kFused) {
    q_ = f32_copy(*in.q), k_ = f32_copy(*in.k), v_ = f32_copy(*in.v);
    o_ = Tensor::zeros(DType::kF32, in.q->shape());
    P_ = Tensor::empty(DType::kF32, {in.S, in.S});
    if (fused_) {
      do_ = f32_copy(*in.d_o);
      dP_ = Tensor::empty(DType::kF32, {in.S, in.S});
      dq_ = Tensor::zeros(DType::kF32, in.q->shape());
      dk_ = Tensor::zeros(DType::kF32, in.k->shape());
      dv_ = Tensor::zeros(DType::kF32, in.v->shape());
    }
  }

  std::vector<Tensor> results() const {
    if (!fused_) return {o_};
    return {o_, dq_, dk_, dv_};
  }

  void run() {
    if (fused_) {  // dK and dV accumulate over the query heads of a group
      std::fill_n(dk_.data_as<float>(), dk_.numel(), 0.f);
      std::fill_n(dv_.data_as<float>(), dv_.numel(), 0.f);
    }
    for (int64_t b = 0; b < in_.B; ++b)
      for (int64_t h = 0; h < in_.H; ++h) head(b, h);
  }

 private:
  // Row-major [S, heads, D] slices: element (i, d) of head h of sequence b at base + i·ld + d.
  float* at(Tensor& t, int64_t b, int64_t h, int64_t heads) const {
    return t.data_as<float>() + (b * in_.S * heads + h) * in_.D;
  }

  void head(int64_t b, int64_t h) {
    const int64_t S = in_.S, D = in_.D, kvh = h / (in_.H / in_.Hkv);
    const int64_t ldq = in_.H * D, ldk = in_.Hkv * D;
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    float* P = P_.data_as<float>();
    float *q = at(q_, b, h, in_.H), *k = at(k_, b, kvh, in_.Hkv), *v = at(v_, b, kvh, in_.Hkv);
    blas::sgemm(false, true, S, S, D, scale, q, ldq, k, ldk, 0.f, P, S);
    softmax_rows(P);
    blas::sgemm(false, false, S, D, S, 1.f, P, S, v, ldk, 0.f, at(o_, b, h, in_.H), ldq);
    if (!fused_) return;
    float* dP = dP_.data_as<float>();
    float* dO = at(do_, b, h, in_.H);
    blas::sgemm(false, true, S, S, D, 1.f, dO, ldq, v, ldk, 0.f, dP, S);                     // dP = dO·Vᵀ
    blas::sgemm(true, false, S, D, S, 1.f, P, S, dO, ldq, 1.f, at(dv_, b, kvh, in_.Hkv), ldk);  // dV += Pᵀ·dO
    ds_rows(P, dP, scale);                                                                      // dP := dS
    blas::sgemm(false, false, S, D, S, 1.f, dP, S, k, ldk, 0.f, at(dq_, b, h, in_.H), ldq);  // dQ = dS·K
    blas::sgemm(true, false, S, D, S, 1.f, dP, S, q, ldq, 1.f, at(dk_, b, kvh, in_.Hkv), ldk);  // dK += dSᵀ·Q
  }

  void softmax_rows(float* P) const {
    const int64_t S = in_.S;
    harness::parallel_for(S, in_.threads, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        float* row = P + i * S;
        const int64_t n = in_.causal ? i + 1 : S;
        std::fill(row + n, row + S, 0.f);  // masked keys: exp(−inf) = 0
        const float m = *std::max_element(row, row + n);
        float sum = 0.f;
        for (int64_t j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - m));
        const float inv = 1.f / sum;
        for (int64_t j = 0; j < n; ++j) row[j] *= inv;
      }
    });
  }

  void ds_rows(const float* P, float* dP, float scale) const {
    const int64_t S = in_.S;
    harness::parallel_for(S, in_.threads, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        const float* p = P + i * S;
        float* d = dP + i * S;
        float delta = 0.f;
        for (int64_t j = 0; j < S; ++j) delta += p[j] * d[j];
        for (int64_t j = 0; j < S; ++j) d[j] = p[j] * (d[j] - delta) * scale;
      }
    });
  }

  BaselineInputs in_;
  bool fused_;
  Tensor q_, k_, v_, o_, P_, do_, dP_, dq_, dk_, dv_;
};

}  // namespace

MaterializedBaseline make_materialized_baseline(const BaselineInputs& in, Pass pass) {
  check(blas::available(), ErrorCode::kUnsupported, "BLAS baselines unavailable: " + blas::unavailable_reason());
  check(pass != Pass::kBackward, ErrorCode::kUnsupported, "the materialized attention baseline times forward and fused");
  auto m = std::make_shared<Materialized>(in, pass);
  MaterializedBaseline out;
  out.description = "per head: sgemm S=QKᵀ (" + std::to_string(in.S) + "x" + std::to_string(in.S) + "x" +
                    std::to_string(in.D) + "), softmax, sgemm PV" +
                    (pass == Pass::kFused ? "; backward: 5 sgemms on the kept P" : "");
  out.run = [m] { m->run(); };
  out.results = [m] { return m->results(); };
  return out;
}

}  // namespace tessera::attention
