// linear_cross_entropy: the reference implementation (the oracle).
//
// Plain loops, double accumulation everywhere, one token row at a time. Obviously correct
// rather than fast. Memory: O(V) doubles for a row of logits, plus, in backward, an H×V (and V)
// double accumulator for dw (and dbias) — O(H·V), never O(B·V). Never edited to make a fast
// path pass: it changes only when the math changes.
#include <cmath>
#include <vector>

#include "kernels/linear_cross_entropy/impl.h"
#include "tessera/error.h"

namespace tessera::linear_cross_entropy {
namespace {

double x_at(const Problem& p, int64_t t, int64_t h) {
  return load_as_f32(p.x, p.dtype, t * p.H + h);
}
double w_at(const Problem& p, int64_t h, int64_t j) {
  const int64_t i = p.layout == WLayout::kHV ? h * p.V + j : j * p.H + h;
  return load_as_f32(p.w, p.dtype, i);
}

// Row t of the logits after bias and soft cap, z[0..V).
void logits_row(const Problem& p, int64_t t, std::vector<double>& z) {
  for (int64_t j = 0; j < p.V; ++j) {
    double s = 0.0;
    for (int64_t h = 0; h < p.H; ++h) s += x_at(p, t, h) * w_at(p, h, j);
    if (p.bias) s += load_as_f32(p.bias, p.bias_dtype, j);
    if (p.softcap > 0.0) s = p.softcap * std::tanh(s / p.softcap);
    z[static_cast<size_t>(j)] = s;
  }
}

double logsumexp(const std::vector<double>& z) {
  double m = -INFINITY;
  for (double v : z) {
    if (std::isnan(v)) return NAN;  // (std::max would skip it)
    m = std::max(m, v);
  }
  if (m == -INFINITY) return -INFINITY;  // log Σ 0: every logit −inf (a fully masked vocabulary slice)
  double s = 0.0;
  for (double v : z) s += std::exp(v - m);
  return m + std::log(s);
}

double sigma(const Problem& p, int64_t c) {
  return p.class_weights ? static_cast<double>(p.class_weights[c]) : 1.0;
}

struct RowLoss {
  double lse = 0.0;
  double loss = 0.0;  // weight_t · (ce + λ·lse²); 0 for ignored rows
  int64_t argmax = 0;
};

RowLoss row_loss(const Problem& p, int64_t t, const std::vector<double>& z) {
  RowLoss r;
  r.lse = logsumexp(z);
  for (int64_t j = 1; j < p.V; ++j)
    if (z[static_cast<size_t>(j)] > z[static_cast<size_t>(r.argmax)]) r.argmax = j;
  if (p.ignored(t) || p.partial()) return r;
  const int64_t y = p.label(t);
  const double nll = r.lse - z[static_cast<size_t>(y)];
  const double eps = p.label_smoothing;
  // Smoothing: ε/V · Σ_c σ_c·(−log p_c), σ = class weights (1 without), scaled by the token
  // weight alone when class weights are given (PyTorch), else by the row's weight.
  // Without smoothing the term is absent, not 0 times it: a −inf logit (a masked class) makes
  // lse − z_c infinite, and 0·inf would turn the loss into NaN.
  double smooth = 0.0;
  if (eps > 0.0) {
    for (int64_t c = 0; c < p.V; ++c) smooth += sigma(p, c) * (r.lse - z[static_cast<size_t>(c)]);
    smooth *= eps / static_cast<double>(p.V);
  }
  r.loss = static_cast<double>(p.weight(t)) * ((1.0 - eps) * nll + p.z_loss_weight * r.lse * r.lse) +
           static_cast<double>(p.smooth_weight(t)) * smooth;
  return r;
}

// Σ weight_t over non-ignored rows.
double weight_sum(const Problem& p) {
  double s = 0.0;
  for (int64_t t = 0; t < p.B; ++t)
    if (!p.ignored(t)) s += p.weight(t);
  return s;
}

class Reference final : public Implementation {
 public:
  std::string name() const override { return "reference"; }
  std::string description() const override {
    return "plain loops in double precision, the oracle (slow; O(H*V) extra memory in backward)";
  }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU)
      return Availability::no("inputs are on " + p.device.str() + ", reference runs on host memory");
    return Availability::yes();
  }
  BlockSizes default_block_sizes(const Problem&) const override { return {}; }
  void validate_block_sizes(const BlockSizes&) const override {}  // unblocked: ignores them

  // The partial form: the slice's statistics per token (ForwardOut's partial fields).
  static void forward_partial(const Problem& p, const ForwardOut& out) {
    std::vector<double> z(static_cast<size_t>(p.V));
    for (int64_t t = 0; t < p.B; ++t) {
      logits_row(p, t, z);
      const RowLoss r = row_loss(p, t, z);  // lse and argmax only: row_loss skips the loss then
      const int64_t y = p.label(t);
      const bool mine = !p.ignored(t) && y >= 0 && y < p.V;
      double sz = 0.0;
      for (int64_t c = 0; c < p.V; ++c) sz += sigma(p, c) * z[static_cast<size_t>(c)];
      out.lse[t] = static_cast<float>(r.lse);
      out.label_logit[t] = mine ? static_cast<float>(z[static_cast<size_t>(y)]) : 0.0f;
      out.logit_sum[t] = static_cast<float>(sz);
      if (out.argmax) {
        out.argmax[t] = r.argmax;
        out.max_logit[t] = static_cast<float>(z[static_cast<size_t>(r.argmax)]);
      }
    }
  }

  void forward(const Problem& p, const BlockSizes&, const ForwardOut& out) const override {
    if (p.partial()) return forward_partial(p, out);
    std::vector<double> z(static_cast<size_t>(p.V));
    double total = 0.0;
    for (int64_t t = 0; t < p.B; ++t) {
      logits_row(p, t, z);
      const RowLoss r = row_loss(p, t, z);
      out.lse[t] = static_cast<float>(r.lse);
      if (out.argmax) out.argmax[t] = r.argmax;
      if (p.reduction == Reduction::kNone) out.loss[t] = static_cast<float>(r.loss);
      total += r.loss;
    }
    if (p.reduction == Reduction::kSum) out.loss[0] = static_cast<float>(total);
    if (p.reduction == Reduction::kMean) {
      const double denom = weight_sum(p);
      out.loss[0] = denom == 0.0 ? 0.0f : static_cast<float>(total / denom);
    }
  }

  void backward(const Problem& p, const BlockSizes&, const GradIn& g,
                const GradOut& out) const override {
    const auto V = static_cast<size_t>(p.V);
    std::vector<double> z(V), dz(V);
    std::vector<double> dw(static_cast<size_t>(p.H) * V, 0.0);  // [H][V]
    std::vector<double> dbias(V, 0.0);
    std::vector<double> dx(static_cast<size_t>(p.H));
    const double denom = p.reduction == Reduction::kMean ? weight_sum(p) : 1.0;
    const double eps = p.label_smoothing;

    for (int64_t t = 0; t < p.B; ++t) {
      std::fill(dx.begin(), dx.end(), 0.0);
      if (!p.ignored(t)) {
        // Upstream gradient reaching loss_t.
        double up = p.reduction == Reduction::kNone ? g.grad_loss[t] : g.grad_loss[0];
        if (p.reduction == Reduction::kMean) up = denom == 0.0 ? 0.0 : up / denom;
        const double wt = p.weight(t), st = p.smooth_weight(t);
        logits_row(p, t, z);
        // The partial form: the global lse comes from the caller (the slice's is not it).
        const double lse = p.partial() ? static_cast<double>(g.lse[t]) : logsumexp(z);
        const int64_t y = p.label(t);
        // d loss_t / d z_j = w_t·[(1−ε)·(p_j − [j==y]) + 2λ·lse·p_j] + s_t·ε/V·(Σσ·p_j − σ_j)
        // Σ_c σ_c over every class (the partial form's slice holds only some of them).
        const double sigma_sum = p.class_weights ? p.class_weight_sum : p.vocab();
        for (size_t j = 0; j < V; ++j) {
          const double pj = std::exp(z[j] - lse);
          const double onehot = static_cast<int64_t>(j) == y ? 1.0 : 0.0;
          double d = wt * ((1.0 - eps) * (pj - onehot) + 2.0 * p.z_loss_weight * lse * pj) +
                     st * eps / p.vocab() * (sigma_sum * pj - sigma(p, static_cast<int64_t>(j)));
          d *= up;
          // Through the soft cap: z = c·tanh(s/c)  =>  dz/ds = 1 − (z/c)².
          if (p.softcap > 0.0) d *= 1.0 - (z[j] / p.softcap) * (z[j] / p.softcap);
          dz[j] = d;
        }
        for (int64_t h = 0; h < p.H; ++h) {
          const double xh = x_at(p, t, h);
          double acc = 0.0;
          for (size_t j = 0; j < V; ++j) {
            acc += dz[j] * w_at(p, h, static_cast<int64_t>(j));
            dw[static_cast<size_t>(h) * V + j] += xh * dz[j];
          }
          dx[static_cast<size_t>(h)] = acc;
        }
        for (size_t j = 0; j < V; ++j) dbias[j] += dz[j];
      }
      for (int64_t h = 0; h < p.H; ++h)
        store_from_f32(out.dx, out.dx_dtype, t * p.H + h, static_cast<float>(dx[static_cast<size_t>(h)]));
    }
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t j = 0; j < p.V; ++j) {
        const int64_t i = p.layout == WLayout::kHV ? h * p.V + j : j * p.H + h;
        store_from_f32(out.dw, out.dw_dtype, i,
                       static_cast<float>(dw[static_cast<size_t>(h) * V + static_cast<size_t>(j)]));
      }
    if (out.dbias)
      for (int64_t j = 0; j < p.V; ++j)
        store_from_f32(out.dbias, out.dbias_dtype, j, static_cast<float>(dbias[static_cast<size_t>(j)]));
  }
};

}  // namespace

std::unique_ptr<Implementation> make_reference_implementation() {
  return std::make_unique<Reference>();
}

}  // namespace tessera::linear_cross_entropy
