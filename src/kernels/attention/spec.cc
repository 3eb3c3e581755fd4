// attention: its registration with the kernel registry (src/kernels/registry.h) — the only
// place the generic tools (CLI, parity suite, bench, tune) learn about this kernel.
#include <cstdio>

#include "core/random.h"
#include "kernels/attention/baseline.h"
#include "kernels/attention/impl.h"
#include "kernels/attention/testing.h"
#include "kernels/declared_signature.h"
#include "kernels/registry.h"
#include "kernels/declared_tune.h"
#include "tessera/attention.h"
#include "tessera/error.h"

namespace tessera::attention {

const kernels::KernelSpec& spec();

namespace {

using harness::OptionSpec;
using K = OptionSpec::Kind;

// ---- call (Python bindings) ----
BlockSizes from_params(const tune::Params& p) { return {tune::param(p, "q").value_or(0), tune::param(p, "kv").value_or(0)}; }
tune::Params to_params(const BlockSizes& b) { return {{"q", b.q}, {"kv", b.kv}}; }

// Option names are the C++ Options fields; scale 0 means the default 1/sqrt(D).
const kernels::DeclaredOptions<Options>& options() {
  static const kernels::DeclaredOptions<Options> d{
      kKernelName,
      {kernels::softmax_scale_field(&Options::scale),
       kernels::softcap_field(&Options::softcap),
       kernels::field(&Options::causal, "causal", "causal mask, bottom-right aligned when Sq != Sk"),
       kernels::field(&Options::window_left, "window_left", "sliding window: keys left of i + Sk - Sq; -1 unbounded"),
       kernels::field(&Options::window_right, "window_right",
                      "sliding window: keys right of i + Sk - Sq; -1 unbounded"),
       kernels::field(&Options::deterministic, "deterministic",
                      "backward: bitwise-repeatable gradients; off (--no-deterministic) lets cudnn take its faster "
                      "non-deterministic engine"),
       kernels::field(&Options::dropout_p, "dropout_p",
                      "dropout on the attention probabilities, in [0, 1); > 0 needs dropout_seed"),
       kernels::block_sizes_field(&Options::block_sizes, "q=128,kv=256", from_params, to_params)}};
  return d;
}

const TensorView& need(const kernels::CallArgs& a, const char* name) { return kernels::required(a, kKernelName, name); }

const kernels::DeclaredInputs<Inputs>& inputs() {
  using kernels::input;
  static const kernels::DeclaredInputs<Inputs> d{
      kKernelName,
      {input(&Inputs::q, {"q", "queries [B, Sq, Hq, D] (or [T, Hq, D] with cu_seqlens); f32, bf16 or f16", true, true, {}, false, true}),
       input(&Inputs::k, {"k", "keys [B, Sk, Hkv, D] (or [T, Hkv, D]); Hq a multiple of Hkv", true, true, {}, false, true}),
       input(&Inputs::v, {"v", "values [B, Sk, Hkv, Dv] (or [T, Hkv, Dv])", true, true, {}, false, true}),
       input(&Inputs::alibi_slopes, {"alibi_slopes", "ALiBi slopes [Hq] or [B, Hq] (f32); no gradient"}),
       input(&Inputs::segment_ids_q, {"segment_ids_q", "segment ids of the queries [B, Sq] (i32); with segment_ids_k",
                                      false, false, {"q-segment-ids"}}),
       input(&Inputs::segment_ids_k,
             {"segment_ids_k", "segment ids of the keys [B, Sk] (i32)", false, false, {"kv-segment-ids"}}),
       input(&Inputs::cu_seqlens_q,
             {"cu_seqlens_q", "varlen: cumulative query lengths [N + 1] (i32, host)", false, false, {}, true}),
       input(&Inputs::cu_seqlens_k,
             {"cu_seqlens_k", "varlen: cumulative key lengths [N + 1] (i32, host)", false, false, {}, true}),
       input(&Inputs::dropout_seed, {"dropout_seed", "dropout: the Philox key of the mask [2] (i32), a new one per step; "
                                     "the PyTorch front end draws it from torch's generator when not given",
                                     false, false, {}, false, false, false, "dropout_p"}),
       input(&Inputs::bias, {"bias", "additive bias [B|1, Hq|1, Sq|1, Sk|1] (f32 or q's dtype; a dim of 1 is "
                             "broadcast; -inf masks), added after softcap and ALiBi; dense form", false, true})}};
  return d;
}

// Shapes only (data may be absent under jit and fake tensors); the call validates the rest.
std::vector<kernels::OutputDesc> call_outputs(const kernels::CallArgs& a) {
  const Inputs in = inputs().parse(a);
  const dispatch::Dims d = bind_tensors(in, dispatch::BindMode::kShapesOnly);
  const bool varlen = in.cu_seqlens_q.has_value();
  std::vector<kernels::OutputDesc> out;
  if (a.pass != Pass::kBackward)
    out = {kernels::output_of(d, "o", o_dims(varlen), "=q"), kernels::output_of(d, "lse", lse_dims(varlen), "f32")};
  if (a.pass != Pass::kForward)  // gradients like their inputs
    for (const auto& [name, t] : {std::pair<const char*, TensorView>{"dq", in.q}, {"dk", in.k}, {"dv", in.v},
                                  {"dbias", in.bias.value_or(TensorView{})}})
      if (dispatch::given(t)) out.push_back({name, t.dtype, t.shape, contiguous_strides(t.shape)});
  return out;
}

// Backward takes the forward's o and lse when the caller kept them (the Python wrappers do);
// without them it runs the forward again first.
std::string call_backward(const Inputs& in, const kernels::CallArgs& a, const Gradients& g, const Options& opt) {
  const TensorView& grad_o = need(a, "grad_o");
  const TensorView *o = a.tensor("o"), *lse = a.tensor("lse");
  if (o && lse) return backward(in, {*o, *lse, grad_o}, g, opt);
  const Result r = compute(in, opt);
  return backward(in, {r.o.view(), r.lse.view(), grad_o}, g, opt);
}

std::string call(const kernels::CallArgs& a, const std::vector<TensorView>& out) {
  const Options opt = options().parse(a);
  const Inputs in = inputs().parse(a);
  const kernels::CallOutputs o(call_outputs(a), out, a, kKernelName);
  Gradients g{o["dq"], o["dk"], o["dv"], {}};
  if (dispatch::given(o["dbias"])) g.dbias = o["dbias"];  // a skipped dbias is an empty view
  switch (a.pass) {
    case Pass::kForward: return forward(in, {o["o"], o["lse"]}, opt);
    case Pass::kBackward: return call_backward(in, a, g, opt);
    case Pass::kFused: return forward_backward(in, need(a, "grad_o"), {o["o"], o["lse"]}, g, opt);
  }
  throw Error(ErrorCode::kInternal, std::string(kKernelName) + ": unknown pass");
}

// ---- bench: B, S, H, D with Hkv = H / (--gqa) and Sq = Sk = S ----
struct Settings {
  int64_t B = 0, S = 0, H = 0, D = 0, Hkv = 0;
  DType dtype = DType::kF32;
  bool causal = false;
  double dropout = 0.0;  // dropout_p (a fixed seed: the bench times the mask's cost, not its bits)
  bool bias = false;     // an f32 bias [1, H, S, S] (T5's relative position bias), dbias in backward
};

class AttentionBench final : public kernels::CallBenchProblem {
 public:
  AttentionBench(const Settings& s, uint64_t seed, bool with_data = true) : CallBenchProblem(spec), s_(s) {
    seed_ = Tensor::zeros(DType::kI32, {2});
    seed_.data_as<int32_t>()[0] = static_cast<int32_t>(seed);
    if (!with_data) return;  // cost model only (`tessera bench --predict`)
    q_ = random_uniform(s.dtype, {s.B, s.S, s.H, s.D}, 1.0f, seed * 5 + 1);
    k_ = random_uniform(s.dtype, {s.B, s.S, s.Hkv, s.D}, 1.0f, seed * 5 + 2);
    v_ = random_uniform(s.dtype, {s.B, s.S, s.Hkv, s.D}, 1.0f, seed * 5 + 3);
    do_ = random_uniform(s.dtype, {s.B, s.S, s.H, s.D}, 1.0f, seed * 5 + 4);
    if (s.bias) bias_ = random_uniform(DType::kF32, {1, s.H, s.S, s.S}, 1.0f, seed * 5 + 5);
  }

  harness::Row describe() const override {
    harness::Row r = harness::Row::object();
    r["kv_heads"] = s_.Hkv;
    r["causal"] = s_.causal;
    r["dropout_p"] = s_.dropout;
    r["bias"] = s_.bias;
    return r;
  }

  // Allowed (query, key) pairs: all, or the causal triangle.
  double pairs() const {
    const double S = static_cast<double>(s_.S);
    return s_.causal ? S * (S + 1) / 2 : S * S;
  }
  double work() const override { return 2.0 * s_.B * s_.H * s_.D * pairs(); }

  harness::Cost cost(Pass pass, const std::string&) const override {
    harness::Cost c;
    const double fwd = 4.0 * s_.B * s_.H * s_.D * pairs();  // QKᵀ and PV, 2 flops per MAC
    const double esz = static_cast<double>(dtype_size(s_.dtype));
    const double qkv = (2.0 * s_.H + 2.0 * s_.Hkv) * s_.B * s_.S * s_.D * esz;  // q, k, v, o
    const double bias = s_.bias ? 4.0 * s_.H * static_cast<double>(s_.S) * s_.S : 0.0;  // f32 [1, H, S, S]
    if (pass != Pass::kBackward) c.add({"forward: QKᵀ, PV", fwd, qkv + bias, s_.B * s_.H * pairs(), false});
    if (pass != Pass::kForward)  // the bias read again, dbias written
      c.add({"backward: 2.5× forward (FlashAttention convention)", 2.5 * fwd, 2 * qkv + 2 * bias,
             s_.B * s_.H * pairs(), false});
    c.assumptions.push_back("useful FLOPs 4·B·H·D·pairs forward, 2.5× that backward; bytes: each tensor once" +
                            std::string(s_.bias ? " (the bias and dbias too; a dbias pass's recomputed products "
                                                  "are not useful FLOPs)" : ""));
    return c;
  }

  std::vector<harness::BaselineCall> baselines(const std::vector<Pass>& passes, int threads) override {
    BaselineInputs bin;
    bin.B = s_.B, bin.S = s_.S, bin.H = s_.H, bin.Hkv = s_.Hkv, bin.D = s_.D, bin.causal = s_.causal;
    bin.q = &q_, bin.k = &k_, bin.v = &v_, bin.d_o = &do_, bin.threads = threads;
    std::vector<harness::BaselineCall> out;
    for (Pass pass : passes) {
      if (pass == Pass::kBackward) continue;  // the baseline times forward and fused
      MaterializedBaseline m = make_materialized_baseline(bin, pass);
      out.push_back({"blas-materialized", pass, m.description, "f32", cost(pass, "blas-materialized"), m.run, {}});
    }
    return out;
  }

  CallData call_data() const override {
    CallData c{{{"q", q_}, {"k", k_}, {"v", v_}, {"grad_o", do_}}, {}};
    c.options.set("causal", s_.causal ? "true" : "false");
    if (s_.dropout > 0.0) {
      c.tensors.push_back({"dropout_seed", seed_});
      char p[32];
      std::snprintf(p, sizeof p, "%.17g", s_.dropout);  // every digit (to_string's %f rounds 1e-7 to 0)
      c.options.set("dropout_p", p);
    }
    if (s_.bias) c.tensors.push_back({"bias", bias_});
    return c;
  }

  // The floor: the two products of a forward as plain GEMMs over all heads (B·H of
  // [S, D]·[D, S]), approximated by one [B·H·S, D]·[D, S] GEMM; count 2 forward, 5 backward.
  std::optional<harness::GemmFloor> gemm_floor() const override {
    harness::GemmFloor g;
    g.M = s_.B * s_.H * s_.S, g.N = s_.S, g.K = s_.D, g.dtype = s_.dtype;
    // The floor is the full (unmasked) product; causal rows are compared against it too.
    g.count = [](Pass p) { return p == Pass::kForward ? 2 : p == Pass::kBackward ? 5 : 7; };
    return g;
  }

 private:
  Settings s_;
  Tensor q_, k_, v_, do_, seed_, bias_;
};

std::unique_ptr<harness::BenchProblem> make_bench_problem(const harness::GridShape& shape, DType dtype,
                                                          const harness::OptionValues& o, uint64_t seed,
                                                          bool with_data) {
  Settings s;
  s.B = shape.dim("B"), s.S = shape.dim("S"), s.H = shape.dim("H"), s.D = shape.dim("D");
  const int64_t groups = o.integer("gqa");
  check(groups >= 1 && s.H % groups == 0, ErrorCode::kInvalidArgument,
        "--gqa must divide H=" + std::to_string(s.H) + ", got " + std::to_string(groups));
  s.Hkv = s.H / groups;
  s.dtype = dtype;
  s.causal = o.flag("causal");
  s.dropout = o.real("dropout");
  s.bias = o.flag("bias");
  return std::make_unique<AttentionBench>(s, seed, with_data);
}

}  // namespace

const kernels::KernelSpec& spec() {
  static const kernels::KernelSpec s{
      .name = kKernelName,
      .description = "scaled dot-product attention (flash-style tiles, online softmax): never materializes S×S",
      .dims = {"B", "S", "H", "D"},
      .passes = {Pass::kForward, Pass::kBackward, Pass::kFused},
      .dtypes = {DType::kF32, DType::kBF16, DType::kF16},
      .implementations = registry,
      .check_grid = kernels::check_grid_of(testing::check_grid, testing::check_parity),
      .bench = kernels::bench_spec_of({{"causal", K::kFlag, "causal mask", "false", {}},
                                       {"gqa", K::kInt, "query heads per kv head (1 = MHA, H = MQA)", "1", {}},
                                       {"dropout", K::kFloat, "dropout_p (0 = none; a fixed seed)", "0", {}},
                                       {"bias", K::kFlag, "an f32 bias [1, H, S, S]; backward also computes dbias",
                                        "false", {}}},
                                      make_bench_problem),
      .tune = kernels::declared_tune_spec(tuning(), spec),
      .call = {.inputs = inputs().specs(),
               .grad_inputs = {{"grad_o", "upstream gradient of o (o's shape; f32 or q's dtype)", true, false, {"do"}},
                               {"o", "the forward's o; spares recomputing the forward", false, false},
                               {"lse", "the forward's lse (f32)", false, false}},
               .options = options().specs(),
               .compound_flags = {{"window", {"window_left", "window_right"},
                                   "sliding window LEFT,RIGHT around i + Sk - Sq (-1 = unbounded)"}},
               .forward_outputs = {"o"},
               .saved_outputs = {"o", "lse"},  // o is returned and kept for backward
               .outputs = call_outputs,
               .call = call,
               .skippable = {"dbias"}}};
  return s;
}

}  // namespace tessera::attention
