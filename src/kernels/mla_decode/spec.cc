// mla_decode: the registration — the only place the CLI, the parity suite and the bindings learn
// about this kernel (docs/ADDING_A_KERNEL.md): its signature (call), check grid and bench.
#include "kernels/mla_decode/impl.h"
#include "kernels/mla_decode/testing.h"
#include "kernels/declared_tune.h"
#include "kernels/declared_signature.h"
#include "kernels/registry.h"
#include "tessera/error.h"

namespace tessera::mla_decode {

kernels::BenchSpec bench_spec();  // bench.cc
const dispatch::DeclaredTensors<Inputs>& tensors();  // api.cc

namespace {

BlockSizes from_params(const tune::Params& p) { return {tune::param(p, "split_keys").value_or(0)}; }
tune::Params to_params(const BlockSizes& b) { return {{"split_keys", b.split_keys}}; }

const kernels::DeclaredOptions<Options>& options() {
  static const kernels::DeclaredOptions<Options> d{
      kKernelName,
      {kernels::field(&Options::dv, "dv", "value dims: the first dv of the D cached dims"),
       kernels::field(&Options::causal, "causal", "query i sits at position L_b − Sq + i and sees keys up to it"),
       kernels::softmax_scale_field(&Options::scale),
       kernels::block_sizes_field(&Options::block_sizes, "split_keys=0", from_params, to_params),
       kernels::field(&Options::kv_scale, "kv_scale", "c = kv_scale * kv_cache (an f8e4m3 cache's dequantization scale)")}};
  return d;
}

const kernels::DeclaredInputs<Inputs>& inputs() { return kernels::inputs_of(tensors()); }

// Shapes only (data may be absent under jit / fake tensors); the call validates everything.
std::vector<kernels::OutputDesc> call_outputs(const kernels::CallArgs& a) {
  const dispatch::Dims d = bind_tensors(inputs().parse(a), a.options.integer("dv"), dispatch::BindMode::kShapesOnly);
  return {kernels::output_of(d, "o", "B,Sq,Hq,Dv", "f32"), kernels::output_of(d, "lse", "B,Sq,Hq", "f32")};
}

std::string call(const kernels::CallArgs& a, const std::vector<TensorView>& out) {
  check(a.pass == Pass::kForward, ErrorCode::kInvalidArgument, std::string(kKernelName) + ": forward only");
  const kernels::CallOutputs o(call_outputs(a), out, a, kKernelName);
  return forward(inputs().parse(a), {o["o"], o["lse"]}, options().parse(a));
}

}  // namespace

const kernels::KernelSpec& spec() {
  static const kernels::KernelSpec s{
      .name = kKernelName,
      .description = "DeepSeek multi-head latent attention decode over a paged latent cache (FlashMLA contract)",
      .dims = {"B", "Sq", "Hq", "T"},
      .passes = {Pass::kForward},
      .dtypes = {DType::kF32, DType::kBF16, DType::kF16},
      .stages = {"mla_decode.split_kv", "mla_decode.combine"},  // cpu.cc's trace scopes
      .implementations = registry,
      .check_grid = kernels::check_grid_of(testing::check_grid, testing::check_parity),
      .bench = bench_spec(),
      .tune = kernels::declared_tune_spec(tuning(), spec),
      .call = {.inputs = inputs().specs(), .options = options().specs(), .outputs = call_outputs, .call = call}};
  return s;
}

}  // namespace tessera::mla_decode
