// linear_cross_entropy: its registration with the kernel registry (src/kernels/registry.h) —
// the only place the generic tools (CLI, parity suite, bench, tune) learn about this kernel.
#include <filesystem>

#include "kernels/linear_cross_entropy/bench.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "kernels/linear_cross_entropy/testing.h"
#include "kernels/linear_cross_entropy/tuning.h"
#include "kernels/registry.h"
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

// ---- tune ----
Problem shape_only(const std::vector<int64_t>& s, DType dtype, const Implementation& impl) {
  Problem p;
  p.B = s.at(0), p.H = s.at(1), p.V = s.at(2);
  p.dtype = dtype;
  p.device = Device{impl.device_type(), 0};
  p.num_threads = resolve_num_threads(0);
  return p;
}

kernels::TuneJob tune_job(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                          Pass pass, bool with_data) {
  const Implementation* impl = find_implementation(name);
  check(impl != nullptr, ErrorCode::kNotFound, std::string(kKernelName) + ": unknown implementation '" + name + "'");
  std::shared_ptr<OwnedProblem> owned;
  if (with_data)
    owned = std::make_shared<OwnedProblem>(
        make_random_problem(shape.at(0), shape.at(1), shape.at(2), dtype, Device{impl->device_type(), 0}));
  const Problem p = owned ? owned->problem : shape_only(shape, dtype, *impl);
  kernels::TuneJob job;
  job.device_kind = impl->device_kind(p);
  for (const BlockSizes& c : tuning_candidates(*impl, p)) job.candidates.push_back(to_params(c));
  job.support = impl->supports(p);
  job.make_run = [owned, impl, pass]() -> tune::RunFn {
    check(owned != nullptr, ErrorCode::kInternal, "tune job built without data");
    return make_timed_run(*impl, owned->problem, pass);
  };
  return job;
}

kernels::TuneSpec tune_spec() {
  kernels::TuneSpec t;
  t.buckets = [] () -> const std::vector<tune::Bucket>& { return tuning_buckets(); };
  t.table = [] () -> const std::vector<tune::TableEntry>& { return tuned_table(); };
  t.tunable = [](const std::string& n) {
    const Implementation* impl = find_implementation(n);
    return impl && impl->tunable();
  };
  t.job = tune_job;
  t.source.kernel = kKernelName;
  t.source.include = "kernels/linear_cross_entropy/tuning.h";
  t.source.cpp_namespace = "tessera::linear_cross_entropy";
  t.source.function = "tuned_table";
  t.source.regenerate = "tessera tune linear_cross_entropy --emit-table   (from the repository root, "
                        "on the machine to tune; rebuild first: rows of other machines are kept)";
  t.source.empty_note = "No rows: no tunable implementation was measured yet. Every lookup misses and "
                        "falls to autotune-on-miss or the backend defaults.";
  t.table_path = "src/kernels/linear_cross_entropy/tuned_table.cc";
  return t;
}

// ---- run ----
// Gradients are written as f32 whatever the inputs' dtype (no second rounding for the user).
Tensor as_f32(const Tensor& t) {
  if (t.dtype() == DType::kF32) return t;
  Tensor o = Tensor::empty(DType::kF32, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) o.data_as<float>()[i] = load_as_f32(t.data(), t.dtype(), i);
  return o;
}

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
  return opt;
}

kernels::RunOutput run(const kernels::RunRequest& r) {
  const Options opt = run_options(r);
  Inputs in{r.tensor("x")->view(), r.tensor("w")->view(), std::nullopt, r.tensor("labels")->view(), std::nullopt};
  if (const Tensor* b = r.tensor("bias")) in.bias = b->view();
  if (const Tensor* t = r.tensor("token-weights")) in.token_weights = t->view();
  Result res = r.grad ? compute_with_grad(in, opt) : compute(in, opt);
  kernels::RunOutput out;
  out.implementation = res.implementation;
  out.outputs = {{"loss", res.loss}, {"lse", res.lse}};
  if (res.argmax.defined()) out.outputs.push_back({"argmax", res.argmax});
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
              {"token-weights", "per-token loss weights [...] (.npy, f32); not per-class weights", false}};
  s.options = {
      {"w-layout", K::kString, "hv, vh or auto (from the shape; an error when H == V)", "auto", {"hv", "vh", "auto"}},
      {"reduction", K::kString, "none, sum or mean", "mean", {"none", "sum", "mean"}},
      {"z-loss", K::kFloat, "z-loss weight λ (adds λ·lse² per token)", "0", {}},
      {"soft-cap", K::kFloat, "logit soft cap c (z = c·tanh(z/c)); 0 disables", "0", {}},
      {"label-smoothing", K::kFloat, "label smoothing ε in [0, 1]", "0", {}},
      {"ignore-index", K::kInt, "label value whose rows are ignored", "-100", {}},
      {"argmax", K::kFlag, "also write argmax.npy (i64)", "false", {}}};
  s.outputs_help = "loss.npy, lse.npy (f32), argmax.npy (i64) with --argmax; with --grad dx.npy, dw.npy "
                   "(w's shape) and dbias.npy, as f32, for an upstream gradient of 1 (ones per token for none)";
  s.run = run;
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
  k.tune = tune_spec();
  k.run = run_spec();
  return k;
}

}  // namespace

const kernels::KernelSpec& spec() {
  static const kernels::KernelSpec s = make_spec();
  return s;
}

}  // namespace tessera::linear_cross_entropy
