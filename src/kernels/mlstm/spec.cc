// mlstm: its registration with the kernel registry — the only place the CLI, the parity suite,
// the bench and the Python bindings learn about this kernel (docs/ADDING_A_KERNEL.md).
#include "kernels/mlstm/impl.h"
#include "kernels/mlstm/testing.h"
#include "kernels/declared_tune.h"
#include "kernels/declared_signature.h"
#include "kernels/registry.h"

namespace tessera::mlstm {

std::unique_ptr<harness::BenchProblem> make_bench_problem(const harness::GridShape& shape, DType dtype,
                                                          const harness::OptionValues&, uint64_t seed,
                                                          bool with_data);  // bench.cc
const dispatch::DeclaredTensors<Inputs>& tensors();  // api.cc

namespace {

const kernels::DeclaredOptions<Options>& options() {
  static const kernels::DeclaredOptions<Options> d{
      kKernelName,
      {kernels::field(&Options::eps, "eps", "added to the denominator max(|nᵀq̂|, e^{-m})"),
       kernels::field(&Options::chunk_size, "chunk_size",
                      "chunk length of the chunkwise backends; 0: tuned (table, autotune on a miss) or the "
                      "default (64)"),
       kernels::flag<Options>("return_last_states",
                              "also return the last state c_last, n_last, m_last (f32; gradients flow through c_last "
                              "and n_last with m held, as into a next call's c0, n0)")}};
  return d;
}

const kernels::DeclaredInputs<Inputs>& inputs() { return kernels::inputs_of(tensors()); }

// Shapes only (data may be absent under jit and fake tensors); the call validates everything.
std::vector<kernels::OutputDesc> call_outputs(const kernels::CallArgs& a) {
  return kernels::declared_outputs(inputs().shapes(a), tensors().rules(),
                                   {{{"h"}},
                                    {{"c_last", "n_last", "m_last"}, true, kernels::if_flag("return_last_states")},
                                    {{"dq", "dk", "dv", "di", "df"}, false},
                                    {{"dc0", "dn0"}, false, kernels::if_given("c0")}},
                                   a);
}

std::string call(const kernels::CallArgs& a, const std::vector<TensorView>& out) {
  const Options opt = options().parse(a);
  const Inputs in = inputs().parse(a);
  const kernels::CallOutputs o(call_outputs(a), out, a, kKernelName);
  const TensorView h = o["h"];
  const LastStates last{o["c_last"], o["n_last"], o["m_last"]};
  if (a.pass == Pass::kForward) return forward(in, h, last, opt);
  const Grads g{o["dq"], o["dk"], o["dv"], o["di"], o["df"], o["dc0"], o["dn0"]};
  const TensorView dh = kernels::required(a, kKernelName, "grad_h");
  const TensorView dcl = a.tensor_or_empty("grad_c_last"), dnl = a.tensor_or_empty("grad_n_last");
  if (a.pass == Pass::kFused) return forward_backward(in, h, last, dh, g, opt, dcl, dnl);  // cpu: states formed once
  return backward(in, dh, g, opt, dcl, dnl);
}

}  // namespace

const kernels::KernelSpec& spec() {
  static const kernels::KernelSpec s{
      .name = kKernelName,
      .description = "mLSTM (xLSTM matrix-memory cell): chunkwise forward and backward with resets",
      .dims = {"B", "NH", "S", "DHQK", "DHV"},
      .passes = {Pass::kForward, Pass::kBackward, Pass::kFused},
      .dtypes = {DType::kF32, DType::kBF16, DType::kF16},
      .implementations = registry,
      .check_grid = kernels::check_grid_of(testing::check_grid, testing::check_parity),
      .bench = kernels::bench_spec_of({}, make_bench_problem),
      .tune = kernels::declared_tune_spec(tuning(), spec),
      .call = {.inputs = inputs().specs(),
               .grad_inputs = {{"grad_h", "upstream gradient of h [B, NH, S, DHV] (f32 or q's dtype)", true, false, {"dh"}},
                               {"grad_c_last", "upstream gradient of the last C [B, NH, DHQK, DHV] (f32)", false, false},
                               {"grad_n_last", "upstream gradient of the last n [B, NH, DHQK] (f32)", false, false}},
               .options = options().specs(),
               .forward_outputs = {"h"},
               .outputs = call_outputs,
               .call = call}};
  return s;
}

}  // namespace tessera::mlstm
