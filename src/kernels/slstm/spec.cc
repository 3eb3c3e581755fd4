// slstm: the registration — the only place the CLI, the parity suite and the bindings learn
// about this kernel (docs/ADDING_A_KERNEL.md).
#include "kernels/declared_tune.h"
#include "kernels/declared_signature.h"
#include "kernels/registry.h"
#include "kernels/slstm/impl.h"
#include "kernels/slstm/testing.h"

namespace tessera::slstm {

const dispatch::DeclaredTensors<Inputs>& tensors();  // api.cc

namespace {

const kernels::DeclaredInputs<Inputs>& inputs() { return kernels::inputs_of(tensors()); }

// Shapes only; the call validates the rest.
std::vector<kernels::OutputDesc> call_outputs(const kernels::CallArgs& a) {
  return kernels::declared_outputs(inputs().shapes(a), tensors().rules(),
                                   {{{"h"}},
                                    {{"h_last", "c_last", "n_last", "m_last"}, true, kernels::if_flag("return_last_states")},
                                    {{"dwx", "dr", "db"}, false},
                                    {{"dh0", "dc0", "dn0"}, false, kernels::if_given("h0")}},
                                   a);
}

const kernels::DeclaredOptions<Options>& options() {
  static const kernels::DeclaredOptions<Options> d{
      kKernelName,
      {kernels::field(&Options::batch_block, "batch_block",
                      "batch rows per cpu thread task; 0: tuned (table, autotune on a miss) or 64"),
       kernels::flag<Options>("return_last_states",
                              "also return the last state h_last, c_last, n_last, m_last [B, NH, DH] (f32; gradients "
                              "flow through h_last, c_last and n_last with m held, as into a next call's h0, c0, n0)")}};
  return d;
}

std::string call(const kernels::CallArgs& a, const std::vector<TensorView>& out) {
  const Options opt = options().parse(a);
  const Inputs in = inputs().parse(a);
  const kernels::CallOutputs o(call_outputs(a), out, a, kKernelName);
  const Outputs fo{o["h"], o["h_last"], o["c_last"], o["n_last"], o["m_last"]};
  const Grads g{o["dwx"], o["dr"], o["db"], o["dh0"], o["dc0"], o["dn0"]};
  if (a.pass == Pass::kForward) return forward(in, fo, opt);
  const Upstream up{kernels::required(a, kKernelName, "grad_h"), a.tensor_or_empty("grad_h_last"),
                    a.tensor_or_empty("grad_c_last"), a.tensor_or_empty("grad_n_last")};
  return a.pass == Pass::kFused ? forward_backward(in, up, fo, g, opt) : backward(in, up, g, opt);
}

}  // namespace

std::unique_ptr<harness::BenchProblem> make_bench_problem(const harness::GridShape& shape, DType dtype,
                                                          const harness::OptionValues&, uint64_t seed,
                                                          bool with_data);  // bench.cc

const kernels::KernelSpec& spec() {
  static const kernels::KernelSpec s{
      .name = kKernelName,
      .description = "xLSTM sLSTM cell: scalar-memory recurrence with head-wise recurrent weights and resets",
      .dims = {"B", "S", "NH", "DH"},
      .passes = {Pass::kForward, Pass::kBackward, Pass::kFused},
      .dtypes = {DType::kF32, DType::kBF16, DType::kF16},
      .implementations = registry,
      .check_grid = kernels::check_grid_of(testing::check_grid, testing::check_parity),
      .bench = kernels::bench_spec_of({}, make_bench_problem),
      .tune = kernels::declared_tune_spec(tuning(), spec),
      .call = {.inputs = inputs().specs(),
               .grad_inputs = {{"grad_h", "upstream gradient of h [B, S, NH, DH] (f32 or the inputs' dtype)", true, false, {"dh"}},
                               {"grad_h_last", "upstream gradient of h_last [B, NH, DH] (f32)", false, false},
                               {"grad_c_last", "upstream gradient of c_last [B, NH, DH] (f32; m held)", false, false},
                               {"grad_n_last", "upstream gradient of n_last [B, NH, DH] (f32; m held)", false, false}},
               .options = options().specs(),
               .forward_outputs = {"h"},
               .outputs = call_outputs,
               .call = call}};
  return s;
}

}  // namespace tessera::slstm
