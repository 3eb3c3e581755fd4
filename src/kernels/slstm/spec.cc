// slstm: the registration — the only place the CLI, the parity suite and the bindings learn
// about this kernel (docs/ADDING_A_KERNEL.md).
#include "kernels/declared_tune.h"
#include "kernels/registry.h"
#include "kernels/slstm/impl.h"
#include "kernels/slstm/testing.h"
#include "tessera/error.h"

namespace tessera::slstm {
namespace {

using K = harness::OptionSpec::Kind;

const TensorView& need(const kernels::CallArgs& a, const char* name) { return kernels::required(a, kKernelName, name); }

Inputs call_inputs(const kernels::CallArgs& a) {
  Inputs in;
  in.wx = need(a, "wx"), in.r = need(a, "r"), in.b = need(a, "b");
  in.resets = a.tensor_or_empty("resets");
  in.h0 = a.tensor_or_empty("h0"), in.c0 = a.tensor_or_empty("c0");
  in.n0 = a.tensor_or_empty("n0"), in.m0 = a.tensor_or_empty("m0");
  return in;
}

// Shapes only (data may be absent under jit and fake tensors); the call validates the rest.
std::vector<kernels::OutputDesc> call_outputs(const kernels::CallArgs& a) {
  const Inputs in = call_inputs(a);
  check(in.wx.ndim() == 5 && in.wx.shape[2] == 4, ErrorCode::kInvalidArgument,
        std::string(kKernelName) + ": wx must be [B, S, 4, NH, DH], got " + shape_str(in.wx.shape));
  const int64_t B = in.wx.shape[0], S = in.wx.shape[1], NH = in.wx.shape[3], DH = in.wx.shape[4];
  std::vector<kernels::OutputDesc> out;
  auto add = [&](const char* name, DType dt, const Shape& shape) { out.push_back({name, dt, shape, contiguous_strides(shape)}); };
  if (a.pass != Pass::kBackward) {
    add("h", DType::kF32, {B, S, NH, DH});
    if (a.options.flag("return_last_states"))
      for (const char* n : {"h_last", "c_last", "n_last", "m_last"}) add(n, DType::kF32, {B, NH, DH});
  }
  if (a.pass != Pass::kForward) {
    add("dwx", in.wx.dtype, in.wx.shape);
    add("dr", in.r.dtype, in.r.shape);
    add("db", in.b.dtype, in.b.shape);
    if (a.tensor("h0"))
      for (const char* n : {"dh0", "dc0", "dn0"}) add(n, DType::kF32, {B, NH, DH});
  }
  return out;
}

std::string call(const kernels::CallArgs& a, const std::vector<TensorView>& out) {
  Options opt = kernels::exec_options<Options>(a);
  opt.batch_block = a.options.integer("batch_block");
  const Inputs in = call_inputs(a);
  const kernels::CallOutputs o(call_outputs(a), out, a, kKernelName);
  const Outputs fo{o["h"], o["h_last"], o["c_last"], o["n_last"], o["m_last"]};
  const Grads g{o["dwx"], o["dr"], o["db"], o["dh0"], o["dc0"], o["dn0"]};
  const auto up = [&] {
    return Upstream{need(a, "grad_h"), a.tensor_or_empty("grad_h_last"), a.tensor_or_empty("grad_c_last"),
                    a.tensor_or_empty("grad_n_last")};
  };
  switch (a.pass) {
    case Pass::kForward: return forward(in, fo, opt);
    case Pass::kBackward: return backward(in, up(), g, opt);
    case Pass::kFused: return forward_backward(in, up(), fo, g, opt);
  }
  throw Error(ErrorCode::kInternal, std::string(kKernelName) + ": unknown pass");
}

kernels::CallSpec call_spec() {
  kernels::CallSpec s;
  s.inputs = {{"wx", "gate pre-activations [B, S, 4, NH, DH], gates (i, f, z, o) (f32, bf16 or f16)", true, true},
              {"r", "head-wise recurrent weights [4, NH, DH, DH] (wx's dtype)", true, true},
              {"b", "bias [4, NH, DH] (wx's dtype)", true, true},
              {"resets", "reset mask [B, S] (int32 or int64, nonzero: reset before step t >= 1; host)", false, false, {}, true},
              {"h0", "initial h [B, NH, DH] (f32; with c0, n0, m0)", false, true},
              {"c0", "initial c [B, NH, DH] (f32)", false, true},
              {"n0", "initial n [B, NH, DH] (f32)", false, true},
              {"m0", "initial stabilizer m [B, NH, DH] (f32; no gradient)", false, false}};
  s.grad_inputs = {{"grad_h", "upstream gradient of h [B, S, NH, DH] (f32)", true, false, {"dh"}},
                   {"grad_h_last", "upstream gradient of h_last [B, NH, DH] (f32)", false, false},
                   {"grad_c_last", "upstream gradient of c_last [B, NH, DH] (f32; m held)", false, false},
                   {"grad_n_last", "upstream gradient of n_last [B, NH, DH] (f32; m held)", false, false}};
  s.options = {{"batch_block", K::kInt, "batch rows per cpu thread task; 0: tuned (table, autotune on a miss) or 64",
                "0", {}},
               {"return_last_states", K::kFlag,
                "also return the last state h_last, c_last, n_last, m_last [B, NH, DH] (f32; gradients flow "
                "through h_last, c_last and n_last with m held, as into a next call's h0, c0, n0)",
                "false", {}}};
  s.forward_outputs = {"h"};
  s.outputs = call_outputs;
  s.call = call;
  return s;
}

}  // namespace

std::unique_ptr<harness::BenchProblem> make_bench_problem(const harness::GridShape& shape, DType dtype,
                                                          const harness::OptionValues&, uint64_t seed,
                                                          bool with_data);  // bench.cc

const kernels::KernelSpec& spec() {
  static const kernels::KernelSpec s = [] {
    kernels::KernelSpec k;
    k.name = kKernelName;
    k.description = "xLSTM sLSTM cell: scalar-memory recurrence with head-wise recurrent weights and resets";
    k.dims = {"B", "S", "NH", "DH"};
    k.passes = {Pass::kForward, Pass::kBackward, Pass::kFused};
    k.dtypes = {DType::kF32, DType::kBF16, DType::kF16};
    k.implementations = []() -> dispatch::RegistryView& { return registry(); };
    k.check_grid = kernels::check_grid_of(testing::check_grid, testing::check_parity);
    k.bench = kernels::bench_spec_of({}, make_bench_problem);
    k.call = call_spec();
    k.tune = kernels::declared_tune_spec(tuning(), spec);
    return k;
  }();
  return s;
}

}  // namespace tessera::slstm
