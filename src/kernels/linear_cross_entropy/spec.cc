// linear_cross_entropy: its registration with the kernel registry (src/kernels/registry.h) —
// the only place the generic tools (CLI, parity suite, bench, tune) learn about this kernel.
#include <filesystem>

#include "kernels/linear_cross_entropy/bench.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "kernels/linear_cross_entropy/testing.h"
#include "kernels/linear_cross_entropy/tuning.h"
#include "kernels/registry.h"
#include "kernels/tune_spec.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::linear_cross_entropy {
namespace {

using harness::OptionSpec;
using K = OptionSpec::Kind;

// ---- check ----
std::vector<kernels::CheckCase> check_cases(bool quick) {
  std::vector<kernels::CheckCase> out;
  for (const testing::CaseSpec& spec : testing::check_grid(quick))
    out.push_back({spec.name(), [spec](const std::string& impl, Pass pass, Device dev) {
                     return testing::check_parity(spec, impl, pass, dev);
                   }});
  return out;
}

// ---- run ----
// Gradients are written as f32 whatever the inputs' dtype (no second rounding for the user).
using kernels::as_f32;

Options run_options(const kernels::RunRequest& r) {
  Options opt;
  static_cast<ExecOptions&>(opt) = r.exec;
  const harness::OptionValues& o = r.options;
  opt.reduction = parse_reduction(o.str("reduction"));
  opt.w_layout = parse_w_layout(o.str("w-layout"));
  opt.z_loss_weight = o.real("z-loss");
  opt.soft_cap = o.real("soft-cap");
  opt.label_smoothing = o.real("label-smoothing");
  opt.ignore_index = o.integer("ignore-index");
  opt.return_argmax = o.flag("argmax");
  opt.return_z_loss = o.flag("return-z-loss");
  opt.return_token_accuracy = o.flag("token-accuracy");
  return opt;
}

kernels::RunOutput run(const kernels::RunRequest& r) {
  const Options opt = run_options(r);
  Inputs in{r.tensor("x")->view(), r.tensor("w")->view(), std::nullopt, r.tensor("labels")->view(), std::nullopt};
  if (const Tensor* b = r.tensor("bias")) in.bias = b->view();
  if (const Tensor* t = r.tensor("token-weights")) in.token_weights = t->view();
  if (const Tensor* c = r.tensor("class-weights")) in.class_weights = c->view();
  Result res = r.grad ? compute_with_grad(in, opt) : compute(in, opt);
  kernels::RunOutput out;
  out.implementation = res.implementation;
  out.outputs = {{"loss", res.loss}, {"lse", res.lse}};
  if (res.argmax.defined()) out.outputs.push_back({"argmax", res.argmax});
  if (res.z_loss.defined()) out.outputs.push_back({"z_loss", res.z_loss});
  if (res.accuracy.defined()) out.outputs.push_back({"accuracy", res.accuracy});
  if (r.grad) {
    out.outputs.push_back({"dx", as_f32(res.dx)});
    out.outputs.push_back({"dw", as_f32(res.dw)});  // w's shape, as the user gave it
    if (res.dbias.defined()) out.outputs.push_back({"dbias", as_f32(res.dbias)});
  }
  const int64_t H = in.x.shape.empty() ? 0 : in.x.shape.back();
  out.summary = "B=" + std::to_string(H ? in.x.numel() / H : 0) + " H=" + std::to_string(H) +
                " dtype=" + dtype_name(in.x.dtype) + " reduction=" + reduction_name(opt.reduction);
  if (res.loss.numel() == 1 && res.loss.shape().empty())
    out.summary += " loss=" + std::to_string(res.loss.data_as<float>()[0]);
  return out;
}

kernels::RunSpec run_spec() {
  kernels::RunSpec s;
  s.inputs = {{"x", "hidden states [..., H] (.npy: f32, f16 or bf16 as <V2)", true},
              {"w", "classifier [H, V] or [V, H] (.npy, same dtype as x)", true},
              {"labels", "labels [...] (.npy: i32 or i64)", true},
              {"bias", "bias [V] (.npy, float)", false},
              {"token-weights", "per-token loss weights [...] (.npy, f32)", false},
              {"class-weights", "per-class loss weights [V] (.npy, f32, >= 0): PyTorch's weight, Liger's ce_weight", false}};
  s.options = {
      {"w-layout", K::kString, "hv, vh or auto (from the shape; an error when H == V)", "auto", {"hv", "vh", "auto"}},
      {"reduction", K::kString, "none, sum or mean", "mean", {"none", "sum", "mean"}},
      {"z-loss", K::kFloat, "z-loss weight λ (adds λ·lse² per token)", "0", {}},
      {"soft-cap", K::kFloat, "logit soft cap c (z = c·tanh(z/c)); 0 disables", "0", {}},
      {"label-smoothing", K::kFloat, "label smoothing ε in [0, 1]", "0", {}},
      {"ignore-index", K::kInt, "label value whose rows are ignored", "-100", {}},
      {"argmax", K::kFlag, "also write argmax.npy (i64)", "false", {}},
      {"return-z-loss", K::kFlag, "also write z_loss.npy: the z-loss part of the loss alone, reduced like it", "false", {}},
      {"token-accuracy", K::kFlag, "also write accuracy.npy: fraction of non-ignored tokens whose argmax is the label", "false", {}}};
  s.outputs_help = "loss.npy, lse.npy (f32), argmax.npy (i64) with --argmax, z_loss.npy with --return-z-loss, "
                   "accuracy.npy with --token-accuracy; with --grad dx.npy, dw.npy (w's shape) and dbias.npy, as f32, "
                   "for an upstream gradient of 1 (ones per token for none)";
  s.run = run;
  return s;
}

// ---- call (Python bindings) ----
// Option names are the C++ Options fields, so Python keywords read like the C++ API.
Options call_options(const kernels::CallArgs& a) {
  Options opt;
  static_cast<ExecOptions&>(opt) = a.exec;
  const harness::OptionValues& o = a.options;
  opt.reduction = parse_reduction(o.str("reduction"));
  opt.w_layout = parse_w_layout(o.str("w_layout"));
  opt.z_loss_weight = o.real("z_loss_weight");
  opt.soft_cap = o.real("soft_cap");
  opt.label_smoothing = o.real("label_smoothing");
  opt.ignore_index = o.integer("ignore_index");
  opt.return_argmax = o.flag("return_argmax");
  opt.return_z_loss = o.flag("return_z_loss");
  opt.return_token_accuracy = o.flag("return_token_accuracy");
  return opt;
}

const TensorView& need(const kernels::CallArgs& a, const char* name) { return kernels::required(a, kKernelName, name); }

Inputs call_inputs(const kernels::CallArgs& a) {
  Inputs in{need(a, "x"), need(a, "w"), std::nullopt, need(a, "labels"), std::nullopt};
  if (const TensorView* b = a.tensor("bias")) in.bias = *b;
  if (const TensorView* t = a.tensor("token_weights")) in.token_weights = *t;
  if (const TensorView* c = a.tensor("class_weights")) in.class_weights = *c;
  return in;
}

std::vector<kernels::OutputDesc> call_outputs(const kernels::CallArgs& a) {
  const Options opt = call_options(a);
  const Inputs in = call_inputs(a);
  validate_metadata(in, opt);
  const Shape lead(in.x.shape.begin(), in.x.shape.end() - 1);
  std::vector<kernels::OutputDesc> out;
  auto add = [&](const char* name, DType dt, const Shape& shape) {
    out.push_back({name, dt, shape, contiguous_strides(shape)});
  };
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
  const Options opt = call_options(a);
  const Inputs in = call_inputs(a);
  const std::vector<kernels::OutputDesc> want = call_outputs(a);
  if (out.size() != want.size())
    throw Error(ErrorCode::kInvalidArgument, std::string(kKernelName) + ": " + pass_name(a.pass) + " writes " +
                                                 std::to_string(want.size()) + " outputs, got " + std::to_string(out.size()));
  auto find = [&](const char* name) -> std::optional<TensorView> {
    for (size_t i = 0; i < want.size(); ++i)
      if (want[i].name == name) return out[i];
    return std::nullopt;
  };
  ForwardOutputs fo;
  if (a.pass != Pass::kBackward) {
    fo = {*find("loss"), *find("lse"), find("argmax")};
    fo.z_loss = find("z_loss");
    fo.accuracy = find("accuracy");
  }
  Gradients g;
  if (a.pass != Pass::kForward) g = {*find("dx"), *find("dw"), find("dbias")};
  switch (a.pass) {
    case Pass::kForward: forward(in, fo, opt); break;
    case Pass::kBackward: {
      if (const TensorView* l = a.tensor("lse"))
        backward(in, need(a, "grad_loss"), *l, g, opt);
      else
        backward(in, need(a, "grad_loss"), g, opt);
      break;
    }
    case Pass::kFused: forward_backward(in, need(a, "grad_loss"), fo, g, opt); break;
  }
  return last_implementation();
}

kernels::CallSpec call_spec() {
  kernels::CallSpec s;
  s.inputs = {{"x", "hidden states [..., H] (f32, bf16 or f16)", true, true},
              {"w", "classifier [V, H] (PyTorch lm_head.weight) or [H, V], same dtype as x", true, true},
              {"labels", "labels [...] (i32 or i64), ignore_index rows are ignored", true, false},
              {"bias", "bias [V] (float)", false, true},
              {"token_weights", "per-token loss weights [...] (f32); no gradient", false, false},
              {"class_weights", "per-class loss weights [V] (f32, >= 0, host): PyTorch's weight, Liger's ce_weight; "
                                "no gradient", false, false}};
  s.grad_inputs = {{"grad_loss", "upstream gradient of loss (f32; 0-d for sum/mean, per token for none)", true, false},
                   {"lse", "the forward's lse (f32 [...]); spares recomputing it", false, false}};
  s.options = {
      {"reduction", K::kString, "none, sum or mean", "mean", {"none", "sum", "mean"}},
      {"ignore_index", K::kInt, "label value whose rows are ignored", "-100", {}},
      {"label_smoothing", K::kFloat, "label smoothing ε in [0, 1]", "0", {}},
      {"z_loss_weight", K::kFloat, "z-loss weight λ (adds λ·lse² per token)", "0", {}},
      {"soft_cap", K::kFloat, "logit soft cap c (z = c·tanh(z/c)); 0 disables", "0", {}},
      {"w_layout", K::kString, "auto (from the shape; an error when H == V), vh ([V, H]) or hv ([H, V])", "auto",
       {"auto", "vh", "hv"}},
      {"return_argmax", K::kFlag, "also return the argmax of the logits per token (i64)", "false", {}},
      {"return_z_loss", K::kFlag,
       "also return the z-loss part alone (f32, the loss's shape; a metric: no gradient, the loss contains it)",
       "false", {}},
      {"return_token_accuracy", K::kFlag,
       "also return the share of non-ignored tokens whose argmax is the label (f32, 0-d; a metric)", "false", {}}};
  s.forward_outputs = {"loss"};
  s.saved_outputs = {"lse"};
  s.outputs = call_outputs;
  s.call = call;
  return s;
}

kernels::KernelSpec make_spec() {
  kernels::KernelSpec k;
  k.name = kKernelName;
  k.description = "fused linear + softmax cross-entropy (LM head): never materializes B×V logits";
  k.dims = {"B", "H", "V"};
  k.passes = {Pass::kForward, Pass::kBackward, Pass::kFused};
  k.dtypes = {DType::kF32, DType::kBF16, DType::kF16};
  k.implementations = []() -> dispatch::RegistryView& { return registry(); };
  k.check_grid = check_cases;
  k.bench.options = bench_options();
  k.bench.make_problem = make_bench_problem;
  k.tune = kernels::make_tune_spec<Tuning>();
  k.run = run_spec();
  k.call = call_spec();
  return k;
}

}  // namespace

const kernels::KernelSpec& spec() {
  static const kernels::KernelSpec s = make_spec();
  return s;
}

}  // namespace tessera::linear_cross_entropy
