// linear_cross_entropy: its benchmark problem for `tessera bench` (and `tessera tune`'s timed
// calls), through its signature (call_data).
//
// Inputs: x, w uniform (w scaled by 3/√H so logits have unit variance), labels uniform in [0, V)
// (a share of them ignore_index with --ignored), optional bias and class weights; no token
// weights, mean reduction, no z-loss. The floor is the plain GEMM x·W of the same shape (1 per
// forward, 2 per backward, 3 fused); the baseline is the BLAS-materialized loss (baseline.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include <memory>

#include "core/random.h"
#include "kernels/linear_cross_entropy/baseline.h"
#include "kernels/registry.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy {

const kernels::KernelSpec& spec();

namespace {

struct Settings {
  int64_t B = 0, H = 0, V = 0;
  DType dtype = DType::kF32;
  WLayout layout = WLayout::kHV;
  bool bias = false;
  double softcap = 0.0;
  double ignored = 0.0;  // fraction of tokens labelled ignore_index, spread evenly
  double label_smoothing = 0.0;
  bool class_weights = false;  // random per-class weights in [0.5, 1.5)
  std::vector<std::string> skip;  // gradients left out (a frozen w: dw)
  bool skips(const char* g) const { return std::find(skip.begin(), skip.end(), g) != skip.end(); }
};

class LceBench final : public kernels::CallBenchProblem {
 public:
  LceBench(const Settings& s, uint64_t seed, bool with_data) : CallBenchProblem(spec), s_(s) {
    if (!with_data) return;  // cost model only
    x_ = random_uniform(s.dtype, {s.B, s.H}, 1.0f, seed * 3 + 1);
    const float ws = 3.0f / std::sqrt(static_cast<float>(s.H));
    w_ = random_uniform(s.dtype, s.layout == WLayout::kVH ? Shape{s.V, s.H} : Shape{s.H, s.V}, ws, seed * 3 + 2);
    if (s.bias) bias_ = random_uniform(s.dtype, {s.V}, 0.5f, seed * 3 + 3);
    labels_ = random_indices(DType::kI64, {s.B}, s.V, seed * 7919 + 5);
    // Row t is ignored when floor((t + 1)·f) > floor(t·f): round(f·B) rows, evenly spread.
    for (int64_t t = 0; t < s.B; ++t)
      if (static_cast<int64_t>((t + 1) * s.ignored) > static_cast<int64_t>(t * s.ignored))
        labels_.data_as<int64_t>()[t] = -100;
    if (s.class_weights) {
      class_weights_ = random_uniform(DType::kF32, {s.V}, 0.5f, seed * 3 + 4);
      for (int64_t v = 0; v < s.V; ++v) class_weights_.data_as<float>()[v] += 1.0f;
    }
  }

  harness::Row describe() const override {
    harness::Row r = harness::Row::object();
    r["layout"] = w_layout_name(s_.layout);
    if (s_.ignored > 0) r["ignored"] = s_.ignored;
    r["bias"] = s_.bias;
    r["softcap"] = s_.softcap;
    if (s_.label_smoothing > 0) r["label_smoothing"] = s_.label_smoothing;
    if (s_.class_weights) r["class_weights"] = true;
    if (!s_.skip.empty()) {
      std::string names;
      for (const std::string& n : s_.skip) names += (names.empty() ? "" : ",") + n;
      r["skip_grads"] = names;
    }
    return r;
  }

  double work() const override { return static_cast<double>(s_.B) * s_.H * s_.V; }

  // The cost model, term by term so that a reader can check it against the kernel's math
  // (include/tessera/linear_cross_entropy.h). Per logit (B·V of them), forward: bias add 1 flop;
  // soft cap c·tanh(z/c) 2 flops + 1 tanh; online logsumexp (max, subtract, add) 3 flops + 1 exp;
  // label smoothing's Σz 1 flop. Per token: 1 log, ~6 flops for the loss. Backward, per logit:
  // p = exp(z − lse) 1 flop + 1 exp, dz = scale·(k·p − ε/V − [j=y]) 3 flops; the soft cap's
  // derivative 1 − (z/c)² and product 3 flops; dbias column sum 1 flop. GEMMs 2·B·H·V flops each.
  // A recomputed GEMM also recomputes its epilogue (bias, soft cap): issued, not useful. Bytes are
  // the minimum traffic: each input read once, each output written once; nothing B×V.
  harness::Cost cost(Pass pass, const std::string& implementation) const override {
    harness::Cost c;
    const double B = double(s_.B), H = double(s_.H), V = double(s_.V), BV = B * V, gemm = 2.0 * B * H * V;
    const double in = double(dtype_size(s_.dtype));
    const bool cap = s_.softcap > 0.0, fwd = pass != Pass::kBackward, bwd = pass != Pass::kForward;
    const auto logits = [&](const std::string& why, bool recompute) {  // GEMM plus epilogue
      c.add({why + ": logits GEMM x·W", gemm, 0, 0, recompute});
      if (s_.bias) c.add({why + ": bias add", BV, 0, 0, recompute});
      if (cap) c.add({why + ": soft cap c·tanh(z/c)", 2 * BV, 0, BV, recompute});
    };
    if (fwd) {
      logits("forward", false);
      c.add({"forward: online logsumexp", 3 * BV, 0, BV + B, false});
      if (s_.label_smoothing > 0.0) c.add({"forward: label smoothing sum of logits", BV, 0, 0, false});
      c.add({"forward: row loss", 6 * B, 0, 0, false});
    }
    // Backward alone recomputes the logits (3 GEMMs issued, 2 useful); fused issues 3 (logits once
    // per token chunk, then dx and dw), except the reference's forward + backward: 4.
    const bool ref = implementation == "reference";
    if (pass == Pass::kBackward || (pass == Pass::kFused && ref))
      logits(pass == Pass::kBackward ? "backward (recomputed)" : "fused (recomputed)", true);
    if (bwd) {
      c.add({"backward: softmax gradient dz", 4 * BV, 0, BV, false});
      if (cap) c.add({"backward: soft cap derivative", 3 * BV, 0, 0, false});
      if (!s_.skips("dx")) c.add({"backward: dx = dz·Wᵀ GEMM", gemm, 0, 0, false});
      if (!s_.skips("dw")) c.add({"backward: dw = xᵀ·dz GEMM", gemm, 0, 0, false});
      if (s_.bias && !s_.skips("dbias")) c.add({"backward: dbias column sum", BV, 0, 0, false});
    }
    c.add({"read x", 0, B * H * in, 0, false});
    c.add({"read w", 0, H * V * in, 0, false});
    c.add({"read labels", 0, B * 8, 0, false});
    if (s_.bias) c.add({"read bias", 0, V * in, 0, false});
    if (fwd) c.add({"write loss", 0, 4, 0, false}), c.add({"write lse", 0, B * 4, 0, false});
    if (pass == Pass::kBackward) c.add({"read lse", 0, B * 4, 0, false});
    if (bwd) {
      c.add({"read grad_loss", 0, 4, 0, false});
      if (!s_.skips("dx")) c.add({"write dx", 0, B * H * in, 0, false});
      if (!s_.skips("dw")) c.add({"write dw", 0, H * V * in, 0, false});
      if (s_.bias && !s_.skips("dbias")) c.add({"write dbias", 0, V * in, 0, false});
    }
    if (pass == Pass::kFused)
      c.assumptions.push_back(ref ? "reference fused = forward + backward with recomputation: 4 GEMMs issued"
                                  : "fused assumed to issue 3 GEMMs (logits once per token chunk, then dx and dw); if '" +
                                        implementation + "' recomputes, issued is 4");
    if (pass == Pass::kBackward)
      c.assumptions.push_back("backward recomputes the logits from x and W: 3 GEMMs issued, 2 useful");
    return c;
  }

  std::optional<harness::GemmFloor> gemm_floor() const override {
    harness::GemmFloor g;
    g.M = s_.B, g.N = s_.V, g.K = s_.H, g.dtype = s_.dtype;
    g.b_transposed = s_.layout == WLayout::kVH;
    const int left = int(s_.skips("dx")) + int(s_.skips("dw"));  // gradient GEMMs skipped
    g.count = [left](Pass p) { return p == Pass::kForward ? 1 : (p == Pass::kBackward ? 2 : 3) - left; };  // the useful GEMMs
    return g;
  }

  CallData call_data() const override {
    Tensor one = Tensor::empty(DType::kF32, {});
    one.data_as<float>()[0] = 1.0f;
    CallData c{{{"x", x_}, {"w", w_}, {"labels", labels_}, {"grad_loss", one}}, {}};
    if (s_.bias) c.tensors.push_back({"bias", bias_});
    if (s_.class_weights) c.tensors.push_back({"class_weights", class_weights_});
    c.options.set("w_layout", w_layout_name(s_.layout));
    c.options.set("softcap", kernels::option_text(s_.softcap));
    c.options.set("label_smoothing", kernels::option_text(s_.label_smoothing));
    c.skip = s_.skip;
    return c;
  }

  // The materialized baseline computes the plain loss (with the soft cap and ignored rows); with
  // label smoothing, class weights or skipped gradients it would time a different function, so it
  // is left out.
  std::vector<harness::BaselineCall> baselines(const std::vector<Pass>& passes, int threads) override {
    if (s_.label_smoothing > 0 || s_.class_weights || !s_.skip.empty()) return {};
    BaselineInputs bin;
    bin.B = s_.B, bin.H = s_.H, bin.V = s_.V, bin.dtype = s_.dtype, bin.layout = s_.layout;
    bin.x = x_.data(), bin.w = w_.data(), bin.bias = s_.bias ? bias_.data() : nullptr;
    bin.bias_dtype = s_.dtype, bin.labels = labels_.data_as<int64_t>(), bin.softcap = s_.softcap;
    bin.threads = threads;
    std::vector<harness::BaselineCall> out;
    for (Pass pass : passes) {
      std::shared_ptr<Baseline> m = make_materialized_baseline(bin, pass);
      out.push_back({.name = "blas-materialized",
                     .pass = pass,
                     .description = m->description(),
                     .cost = cost(pass, "blas-materialized"),
                     .run = [m] { m->run(); },
                     .loss = [m]() -> std::optional<double> { return m->loss(); }});
    }
    return out;
  }

 private:
  Settings s_;
  Tensor x_, w_, bias_, labels_, class_weights_;
};

}  // namespace

std::vector<harness::OptionSpec> bench_options() {
  using K = harness::OptionSpec::Kind;
  return {{"layout", K::kString, "memory layout of w: hv ([H, V]) or vh ([V, H], lm_head.weight)", "hv", {"hv", "vh"}},
          {"bias", K::kFlag, "add a bias [V]", "false", {}},
          {"soft-cap", K::kFloat, "logit soft cap c (0 disables)", "0", {}},
          {"ignored", K::kFloat, "fraction of tokens labelled ignore_index (-100), in [0, 1]", "0", {}},
          {"label-smoothing", K::kFloat, "label smoothing ε in [0, 1] (no materialized baseline then)", "0", {}},
          {"class-weights", K::kFlag, "random per-class weights [V] in [0.5, 1.5) (no materialized baseline then)",
           "false", {}},
          {"skip-grads", K::kString,
           "gradients the backward and fused passes leave out, a comma list of dx, dw, dbias (a frozen w: dw; no "
           "materialized baseline then)",
           "", {}}};
}

std::unique_ptr<harness::BenchProblem> make_bench_problem(const harness::GridShape& shape, DType dtype,
                                                          const harness::OptionValues& o, uint64_t seed,
                                                          bool with_data) {
  Settings s;
  s.B = shape.dim("B"), s.H = shape.dim("H"), s.V = shape.dim("V");
  s.dtype = dtype;
  s.layout = parse_w_layout(o.str("layout"));
  check(s.layout != WLayout::kAuto, ErrorCode::kInvalidArgument, "--layout must be hv or vh");
  s.bias = o.flag("bias");
  s.softcap = o.real("soft-cap");
  s.ignored = o.real("ignored");
  check(s.ignored >= 0.0 && s.ignored <= 1.0, ErrorCode::kInvalidArgument, "--ignored must be in [0, 1]");
  s.label_smoothing = o.real("label-smoothing");
  check(s.label_smoothing >= 0.0 && s.label_smoothing <= 1.0, ErrorCode::kInvalidArgument,
        "--label-smoothing must be in [0, 1]");
  s.class_weights = o.flag("class-weights");
  s.skip = kernels::parse_skip(spec().call, o.str("skip-grads"), "--skip-grads");
  return std::make_unique<LceBench>(s, seed, with_data);
}

}  // namespace tessera::linear_cross_entropy
