#include "kernels/linear_cross_entropy/bench.h"

#include <cmath>

#include "core/random.h"
#include "kernels/linear_cross_entropy/baseline.h"
#include "kernels/linear_cross_entropy/cost.h"
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
  double soft_cap = 0.0;
  double ignored = 0.0;  // fraction of tokens labelled ignore_index, spread evenly
  double label_smoothing = 0.0;
  bool class_weights = false;  // random per-class weights in [0.5, 1.5)
};

class LceBench final : public harness::BenchProblem {
 public:
  LceBench(const Settings& s, uint64_t seed, bool with_data) : s_(s) {
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
    r["B"] = s_.B, r["H"] = s_.H, r["V"] = s_.V;
    r["dtype"] = dtype_name(s_.dtype);
    r["layout"] = w_layout_name(s_.layout);
    if (s_.ignored > 0) r["ignored"] = s_.ignored;
    r["bias"] = s_.bias;
    r["soft_cap"] = s_.soft_cap;
    if (s_.label_smoothing > 0) r["label_smoothing"] = s_.label_smoothing;
    if (s_.class_weights) r["class_weights"] = true;
    return r;
  }

  double work() const override { return static_cast<double>(s_.B) * s_.H * s_.V; }

  harness::Cost cost(Pass pass, const std::string& implementation) const override {
    CostShape cs;
    cs.B = s_.B, cs.H = s_.H, cs.V = s_.V, cs.dtype = s_.dtype, cs.bias = s_.bias;
    cs.bias_dtype = s_.dtype, cs.soft_cap = s_.soft_cap, cs.grad_dtype = s_.dtype;
    cs.label_smoothing = s_.label_smoothing;
    return linear_cross_entropy::cost(cs, pass, implementation);
  }

  std::optional<harness::GemmFloor> gemm_floor() const override {
    harness::GemmFloor g;
    g.M = s_.B, g.N = s_.V, g.K = s_.H, g.dtype = s_.dtype;
    g.b_transposed = s_.layout == WLayout::kVH;
    g.count = [](Pass p) { return useful_gemms(p); };
    return g;
  }

  harness::BenchCall bind(const std::string& implementation, Device dev, Pass pass,
                          const ExecOptions& exec) override {
    const CallData c = call_data();
    return kernels::bind_call(spec().call, c.tensors, c.options, implementation, dev, pass, exec);
  }

  CallData call_data() const override {
    Tensor one = Tensor::empty(DType::kF32, {});
    one.data_as<float>()[0] = 1.0f;
    CallData c{{{"x", x_}, {"w", w_}, {"labels", labels_}, {"grad_loss", one}}, {}};
    if (s_.bias) c.tensors.push_back({"bias", bias_});
    if (s_.class_weights) c.tensors.push_back({"class_weights", class_weights_});
    c.options.set("w_layout", w_layout_name(s_.layout));
    c.options.set("soft_cap", kernels::option_text(s_.soft_cap));
    c.options.set("label_smoothing", kernels::option_text(s_.label_smoothing));
    return c;
  }

  // The materialized baseline computes the plain loss (with the soft cap and ignored rows); with
  // label smoothing or class weights it would time a different function, so it is left out.
  std::vector<harness::BaselineCall> baselines(const std::vector<Pass>& passes, int threads) override {
    if (s_.label_smoothing > 0 || s_.class_weights) return {};
    BaselineInputs bin;
    bin.B = s_.B, bin.H = s_.H, bin.V = s_.V, bin.dtype = s_.dtype, bin.layout = s_.layout;
    bin.x = x_.data(), bin.w = w_.data(), bin.bias = s_.bias ? bias_.data() : nullptr;
    bin.bias_dtype = s_.dtype, bin.labels = labels_.data_as<int64_t>(), bin.soft_cap = s_.soft_cap;
    bin.threads = threads;
    std::vector<harness::BaselineCall> out;
    for (Pass pass : passes) {
      std::shared_ptr<Baseline> m = make_materialized_baseline(bin, pass);
      harness::BaselineCall c;
      c.name = "blas-materialized";
      c.pass = pass;
      c.description = m->description();
      c.cost = cost(pass, "blas-materialized");
      c.run = [m] { m->run(); };
      c.loss = [m]() -> std::optional<double> { return m->loss(); };
      out.push_back(std::move(c));
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
           "false", {}}};
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
  s.soft_cap = o.real("soft-cap");
  s.ignored = o.real("ignored");
  check(s.ignored >= 0.0 && s.ignored <= 1.0, ErrorCode::kInvalidArgument, "--ignored must be in [0, 1]");
  s.label_smoothing = o.real("label-smoothing");
  check(s.label_smoothing >= 0.0 && s.label_smoothing <= 1.0, ErrorCode::kInvalidArgument,
        "--label-smoothing must be in [0, 1]");
  s.class_weights = o.flag("class-weights");
  return std::make_unique<LceBench>(s, seed, with_data);
}

std::unique_ptr<harness::BenchProblem> make_bench_cost_model(const harness::GridShape& shape, DType dtype,
                                                             const harness::OptionValues& options) {
  return make_bench_problem(shape, dtype, options, 0, false);
}

}  // namespace tessera::linear_cross_entropy
