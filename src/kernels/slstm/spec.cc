// slstm: the registration — the only place the CLI, the parity suite and the bindings learn
// about this kernel (docs/ADDING_A_KERNEL.md).
#include "kernels/declared_tune.h"
#include "kernels/declared_signature.h"
#include "kernels/registry.h"
#include "kernels/slstm/impl.h"
#include "kernels/slstm/testing.h"

namespace tessera::slstm {

const dispatch::TensorRules& rules();  // api.cc
dispatch::Dims bind_inputs(const Inputs& in, dispatch::BindMode mode);

namespace {

using K = harness::OptionSpec::Kind;

const TensorView& need(const kernels::CallArgs& a, const char* name) { return kernels::required(a, kKernelName, name); }

const kernels::DeclaredInputs<Inputs>& inputs() {
  using kernels::input;
  static const kernels::DeclaredInputs<Inputs> d{
      kKernelName,
      {input(&Inputs::wx, {"wx", "gate pre-activations [B, S, 4, NH, DH], gates (i, f, z, o) (f32, bf16 or f16)", true,
                           true}),
       input(&Inputs::r, {"r", "head-wise recurrent weights [4, NH, DH, DH] (wx's dtype)", true, true}),
       input(&Inputs::b, {"b", "bias [4, NH, DH] (wx's dtype)", true, true}),
       input(&Inputs::resets, {"resets", "reset mask [B, S] (int32 or int64, nonzero: reset before step t >= 1; host)",
                               false, false, {}, true}),
       input(&Inputs::h0, {"h0", "initial h [B, NH, DH] (f32; with c0, n0, m0)", false, true}),
       input(&Inputs::c0, {"c0", "initial c [B, NH, DH] (f32)", false, true}),
       input(&Inputs::n0, {"n0", "initial n [B, NH, DH] (f32)", false, true}),
       input(&Inputs::m0, {"m0", "initial stabilizer m [B, NH, DH] (f32; no gradient)", false, false})}};
  return d;
}

// Shapes only (data may be absent under jit and fake tensors), each output as api.cc declares it;
// the call validates the rest.
std::vector<kernels::OutputDesc> call_outputs(const kernels::CallArgs& a) {
  const Inputs in = inputs().parse(a);
  const dispatch::Dims d = bind_inputs(in, dispatch::BindMode::kShapesOnly);
  std::vector<kernels::OutputDesc> out;
  auto add = [&](const char* name) { out.push_back(kernels::declared_output(d, rules(), name)); };
  if (a.pass != Pass::kBackward) {
    add("h");
    if (a.options.flag("return_last_states")) add("h_last"), add("c_last"), add("n_last"), add("m_last");
  }
  if (a.pass != Pass::kForward) {
    add("dwx"), add("dr"), add("db");
    if (dispatch::given(in.h0)) add("dh0"), add("dc0"), add("dn0");
  }
  return out;
}

const kernels::DeclaredOptions<Options>& options() {
  static const kernels::DeclaredOptions<Options> d{
      kKernelName,
      {kernels::field(&Options::batch_block, "batch_block",
                      "batch rows per cpu thread task; 0: tuned (table, autotune on a miss) or 64"),
       kernels::plain<Options>({"return_last_states", K::kFlag,
                                "also return the last state h_last, c_last, n_last, m_last [B, NH, DH] (f32; gradients "
                                "flow through h_last, c_last and n_last with m held, as into a next call's h0, c0, n0)",
                                "false", {}})}};
  return d;
}

std::string call(const kernels::CallArgs& a, const std::vector<TensorView>& out) {
  const Options opt = options().parse(a);
  const Inputs in = inputs().parse(a);
  const kernels::CallOutputs o(call_outputs(a), out, a, kKernelName);
  const Outputs fo{o["h"], o["h_last"], o["c_last"], o["n_last"], o["m_last"]};
  const Grads g{o["dwx"], o["dr"], o["db"], o["dh0"], o["dc0"], o["dn0"]};
  if (a.pass == Pass::kForward) return forward(in, fo, opt);
  const Upstream up{need(a, "grad_h"), a.tensor_or_empty("grad_h_last"), a.tensor_or_empty("grad_c_last"),
                    a.tensor_or_empty("grad_n_last")};
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
               .grad_inputs = {{"grad_h", "upstream gradient of h [B, S, NH, DH] (f32)", true, false, {"dh"}},
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
