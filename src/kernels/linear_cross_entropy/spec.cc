// linear_cross_entropy: its registration with the kernel registry (src/kernels/registry.h) —
// the only place the generic tools (CLI, parity suite, bench, tune) learn about this kernel.
#include "kernels/linear_cross_entropy/impl.h"
#include "kernels/linear_cross_entropy/testing.h"
#include "dispatch/arg_check.h"
#include "kernels/declared_signature.h"
#include "kernels/registry.h"
#include "kernels/declared_tune.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy {

const kernels::KernelSpec& spec();
// bench.cc
std::vector<harness::OptionSpec> bench_options();
std::unique_ptr<harness::BenchProblem> make_bench_problem(const harness::GridShape& shape, DType dtype,
                                                          const harness::OptionValues& o, uint64_t seed, bool with_data);

namespace {

// ---- call (Python bindings) ----
// Option names are the C++ Options fields, so Python keywords read like the C++ API.
const kernels::DeclaredOptions<Options>& options() {
  using kernels::field;
  static const kernels::DeclaredOptions<Options> d{
      kKernelName,
      {kernels::choice(&Options::reduction, "reduction", "none, sum or mean", {"none", "sum", "mean"}, parse_reduction,
                       reduction_name),
       field(&Options::ignore_index, "ignore_index", "label value whose rows are ignored"),
       field(&Options::label_smoothing, "label_smoothing", "label smoothing ε in [0, 1]"),
       field(&Options::z_loss_weight, "z_loss_weight", "z-loss weight λ (adds λ·lse² per token)", {"z-loss"}),
       field(&Options::softcap, "softcap", "logit soft cap c (z = c·tanh(z/c)); 0 disables (the attention kernels' "
             "name; soft_cap before 2026-11-29)", {"soft-cap"}),
       kernels::choice(&Options::w_layout, "w_layout",
                       "auto (from the shape; an error when H == V), vh ([V, H]) or hv ([H, V])", {"auto", "vh", "hv"},
                       parse_w_layout, w_layout_name),
       field(&Options::return_argmax, "return_argmax", "also return the argmax of the logits per token (i64)",
             {"argmax"}),
       field(&Options::return_z_loss, "return_z_loss",
             "also return the z-loss part alone (f32, the loss's shape; a metric: no gradient, the loss contains it)"),
       field(&Options::return_token_accuracy, "return_token_accuracy",
             "also return the share of non-ignored tokens whose argmax is the label (f32, 0-d; a metric)",
             {"token-accuracy"}),
       field(&Options::vocab_total, "vocab_total",
             "vocab-parallel partial form: the number of classes of all slices (w holds V of them, labels are "
             "relative to the slice; forward returns the slice's statistics, backward takes the combined lse); "
             "0 = off"),
       kernels::block_sizes_field(&Options::block_sizes, "b=1024,h=512,v=2048", from_params, to_params),
       // Last: declared after the others existed (positions in torch's op schema stay).
       field(&Options::skip_ignored, "skip_ignored",
             "skip ignored tokens before any GEMM (host inputs, >= 1/16 of them ignored; their lse is then 0); "
             "off (--no-skip-ignored): every row computed, the lse of ignored rows their logsumexp")}};
  return d;
}

const TensorView& need(const kernels::CallArgs& a, const char* name) { return kernels::required(a, kKernelName, name); }

const kernels::DeclaredInputs<Inputs>& inputs() {
  using kernels::input;
  static const kernels::DeclaredInputs<Inputs> d{
      kKernelName,
      {input(&Inputs::x, {"x", "hidden states [..., H] (f32, bf16 or f16)", true, true, {}, false, true}),
       input(&Inputs::w, {"w", "classifier [V, H] (PyTorch lm_head.weight) or [H, V], same dtype as x", true, true, {},
                                false, true, true}),
       input(&Inputs::labels, {"labels", "labels [...] (i32 or i64), ignore_index rows are ignored", true, false}),
       input(&Inputs::bias, {"bias", "bias [V] (float)", false, true, {}, false, true}),
       input(&Inputs::token_weights, {"token_weights", "per-token loss weights [...] (f32); no gradient"}),
       input(&Inputs::class_weights, {"class_weights",
                                      "per-class loss weights [V] (f32, >= 0, host): PyTorch's weight, Liger's "
                                      "ce_weight; no gradient",
                                      false, false, {}, true})}};
  return d;
}

std::vector<kernels::OutputDesc> call_outputs(const kernels::CallArgs& a) {
  const Options opt = options().parse(a);
  const Inputs in = inputs().parse(a);
  validate_metadata(in, opt);
  const Shape lead(in.x.shape.begin(), in.x.shape.end() - 1);
  std::vector<kernels::OutputDesc> out;
  auto add = [&](const char* name, DType dt, const Shape& shape) {
    out.push_back({name, dt, shape, contiguous_strides(shape)});
  };
  if (a.pass == Pass::kForward && opt.vocab_total > 0) {  // the partial form's statistics
    for (const char* name : {"lse", "label_logit", "logit_sum"}) add(name, DType::kF32, lead);
    if (opt.return_argmax) {
      add("argmax", DType::kI64, lead);
      add("max_logit", DType::kF32, lead);
    }
    return out;
  }
  if (a.pass != Pass::kBackward) {
    add("loss", DType::kF32, opt.reduction == Reduction::kNone ? lead : Shape{});
    add("lse", DType::kF32, lead);
    if (opt.return_argmax) add("argmax", DType::kI64, lead);
    if (opt.return_z_loss) add("z_loss", DType::kF32, opt.reduction == Reduction::kNone ? lead : Shape{});
    if (opt.return_token_accuracy) add("accuracy", DType::kF32, Shape{});
  }
  if (a.pass != Pass::kForward) {
    add("dx", in.x.dtype, in.x.shape);
    out.push_back({"dw", in.w.dtype, in.w.shape, in.w.strides});  // w's layout (a transposed view stays one)
    if (in.bias) add("dbias", in.bias->dtype, in.bias->shape);
  }
  return out;
}

std::string call(const kernels::CallArgs& a, const std::vector<TensorView>& out) {
  const Options opt = options().parse(a);
  const Inputs in = inputs().parse(a);
  const kernels::CallOutputs o(call_outputs(a), out, a, kKernelName);
  const auto find = [&o](const char* name) -> std::optional<TensorView> {
    if (dispatch::given(o[name])) return o[name];
    return std::nullopt;
  };
  if (a.pass == Pass::kForward && opt.vocab_total > 0) {
    PartialOutputs po{*find("lse"), *find("label_logit"), *find("logit_sum"), find("argmax"), find("max_logit")};
    return forward_partial(in, po, opt);
  }
  ForwardOutputs fo;
  if (a.pass != Pass::kBackward) {
    fo = {*find("loss"), *find("lse"), find("argmax")};
    fo.z_loss = find("z_loss");
    fo.accuracy = find("accuracy");
  }
  Gradients g;
  if (a.pass != Pass::kForward) g = {o["dx"], o["dw"], find("dbias")};  // a skipped one is an empty view
  switch (a.pass) {
    case Pass::kForward: return forward(in, fo, opt);
    case Pass::kBackward: {
      if (const TensorView* l = a.tensor("lse")) return backward(in, need(a, "grad_loss"), *l, g, opt);
      return backward(in, need(a, "grad_loss"), g, opt);
    }
    case Pass::kFused: return forward_backward(in, need(a, "grad_loss"), fo, g, opt);
  }
  throw Error(ErrorCode::kInternal, std::string(kKernelName) + ": unknown pass");
}

// ---- tune: the host backends' declaration and cuda's (tuning.cc), one table ----
kernels::TuneSpec tune_spec() {
  kernels::TuneSpec t = kernels::declared_tune_spec(tuning("cpu"), spec);
  t.tunable = [](const std::string& impl) { return tuning(impl).tunable(impl); };
  t.job = [host = t.job, cuda = kernels::declared_tune_spec(tuning("cuda"), spec).job](
              const std::string& impl, const std::vector<int64_t>& shape, DType dt, Pass pass, bool with_data) {
    return (impl == "cuda" ? cuda : host)(impl, shape, dt, pass, with_data);
  };
  return t;
}

}  // namespace

const kernels::KernelSpec& spec() {
  static const kernels::KernelSpec s{
      .name = kKernelName,
      .description = "fused linear + softmax cross-entropy (LM head): never materializes B×V logits",
      .dims = {"B", "H", "V"},
      .passes = {Pass::kForward, Pass::kBackward, Pass::kFused},
      .dtypes = {DType::kF32, DType::kBF16, DType::kF16},
      .implementations = registry,
      .check_grid = kernels::check_grid_of(testing::check_grid, testing::check_parity),
      .bench = kernels::bench_spec_of(bench_options(), make_bench_problem),
      .tune = tune_spec(),
      .call = {.inputs = inputs().specs(),
               .grad_inputs = {{"grad_loss", "upstream gradient of loss (f32; 0-d for sum/mean, per token for none)",
                                true, false},
                               {"lse", "the forward's lse (f32 [...]); spares recomputing it", false, false}},
               .options = options().specs(),
               .forward_outputs = {"loss"},
               .saved_outputs = {"lse"},
               .outputs = call_outputs,
               .call = call,
               .skippable = {"dx", "dw", "dbias"}}};
  return s;
}

}  // namespace tessera::linear_cross_entropy
