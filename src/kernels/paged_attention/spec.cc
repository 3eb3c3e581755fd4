// paged_attention: its registration with the kernel registry (src/kernels/registry.h) — the only
// place the CLI, the parity suite and the bindings learn about this kernel.
#include "kernels/paged_attention/impl.h"
#include "kernels/paged_attention/testing.h"
#include "kernels/declared_signature.h"
#include "kernels/registry.h"
#include "tessera/error.h"
#include "tessera/paged_attention.h"

namespace tessera::paged_attention {

// bench.cc
std::vector<harness::OptionSpec> bench_options();
std::unique_ptr<harness::BenchProblem> make_bench_problem(const harness::GridShape& shape, DType dtype,
                                                          const harness::OptionValues& o, uint64_t seed, bool with_data);

namespace {

// ---- call: the signature `tessera run` and the Python functions are derived from ----
const kernels::DeclaredOptions<Options>& options() {
  static const kernels::DeclaredOptions<Options> d{
      kKernelName,
      {kernels::softmax_scale_field(&Options::scale),
       kernels::softcap_field(&Options::softcap),
       kernels::field(&Options::causal, "causal", "a query sees keys at positions <= its own (kv_len - q_len + i)"),
       kernels::field(&Options::window, "window",
                      "sliding window: keys at positions >= own - window only; -1 unbounded"),
       kernels::field(&Options::k_scale, "k_scale", "k = k_scale * k_cache (an f8e4m3 cache's dequantization scale)"),
       kernels::field(&Options::v_scale, "v_scale", "v = v_scale * v_cache (an f8e4m3 cache's dequantization scale)")}};
  return d;
}

const kernels::DeclaredInputs<Inputs>& inputs() {
  using kernels::input;
  static const kernels::DeclaredInputs<Inputs> d{
      kKernelName,
      {input(&Inputs::q, {"q", "new tokens of the N sequences, concatenated [T, Hq, D]; f32, bf16 or f16"}),
       input(&Inputs::k_cache, {"k_cache", "key pages [P, page_size, Hkv, D], q's dtype or f8e4m3; Hq a multiple of Hkv"}),
       input(&Inputs::v_cache, {"v_cache", "value pages [P, page_size, Hkv, Dv], k_cache's dtype"}),
       input(&Inputs::page_table,
             {"page_table", "pages of each sequence [N, max_pages] (i32, host)", true, false, {}, true}),
       input(&Inputs::kv_lens,
             {"kv_lens", "tokens of each sequence in the cache, its new ones included [N] (i32, host)", true, false,
              {}, true}),
       input(&Inputs::cu_q_lens,
             {"cu_q_lens", "cumulative new-token counts [N + 1], from 0 to T (i32, host)", true, false, {}, true}),
       input(&Inputs::sinks,
             {"sinks", "per-head attention sink logits [Hq] (f32): an extra softmax term carrying no value"})}};
  return d;
}

// Shapes only (data may be absent under jit and fake tensors); the call validates the rest.
std::vector<kernels::OutputDesc> call_outputs(const kernels::CallArgs& a) {
  const dispatch::Dims d = bind_tensors(inputs().parse(a), dispatch::BindMode::kShapesOnly);
  return {kernels::output_of(d, "o", "T,Hq,Dv", "=q"), kernels::output_of(d, "lse", "T,Hq", "f32")};
}

std::string call(const kernels::CallArgs& a, const std::vector<TensorView>& out) {
  check(a.pass == Pass::kForward, ErrorCode::kUnsupported, std::string(kKernelName) + ": forward only");
  const kernels::CallOutputs o(call_outputs(a), out, a, kKernelName);
  return forward(inputs().parse(a), {o["o"], o["lse"]}, options().parse(a));
}

}  // namespace

const kernels::KernelSpec& spec() {
  static const kernels::KernelSpec s{
      .name = kKernelName,
      .description = "ragged paged attention for serving (prefill and decode rows in one batch), forward",
      .dims = {"N", "S", "Q", "H", "D"},
      .passes = {Pass::kForward},
      .dtypes = {DType::kF32, DType::kBF16, DType::kF16},
      .implementations = registry,
      .check_grid = kernels::check_grid_of(testing::check_grid, testing::check_parity),
      .bench = kernels::bench_spec_of(bench_options(), make_bench_problem),
      .call = {.inputs = inputs().specs(),
               .options = options().specs(),
               .forward_outputs = {"o"},
               .saved_outputs = {"o", "lse"},  // forward only: this gives the Python functions return_lse
               .outputs = call_outputs,
               .call = call}};
  return s;
}

}  // namespace tessera::paged_attention
