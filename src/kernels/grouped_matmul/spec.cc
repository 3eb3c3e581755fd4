// grouped_matmul: its registration with the kernel registry (src/kernels/registry.h) — the only
// place the generic tools (CLI, parity suite, bench) learn about this kernel.
#include <functional>

#include "core/random.h"
#include "dispatch/host_f32.h"
#include "harness/blas.h"
#include "kernels/grouped_matmul/impl.h"
#include "kernels/grouped_matmul/testing.h"
#include "kernels/declared_tune.h"
#include "kernels/declared_signature.h"
#include "kernels/registry.h"
#include "tessera/error.h"
#include "tessera/grouped_matmul.h"

namespace tessera::grouped_matmul {

const kernels::KernelSpec& spec();
// baseline.cc: the dense floor on the cpu implementation (G = 1) and the OpenBLAS loops.
std::function<void()> one_group_baseline(const Tensor& lhs, const Tensor& rhs, int64_t N, int threads);
std::function<void()> blas_baseline(const Tensor& lhs, const Tensor& rhs, std::vector<int64_t> sizes, bool dense);

namespace {

using harness::OptionSpec;
using K = OptionSpec::Kind;

// ---- call (Python bindings) ----
BlockSizes from_params(const tune::Params& p) { return {tune::param(p, "m").value_or(0), tune::param(p, "n").value_or(0)}; }
tune::Params to_params(const BlockSizes& b) { return {{"m", b.m}, {"n", b.n}}; }

// group_offset -1 means unset.
const kernels::DeclaredOptions<Options>& options() {
  static const kernels::DeclaredOptions<Options> d{
      kKernelName,
      {kernels::field(&Options::transpose_rhs, "transpose_rhs", "rhs (and drhs) are [G, N, K]"),
       kernels::field(&Options::group_offset, "group_offset",
                      "expert parallelism: rhs holds groups [offset, offset + G) of group_sizes; -1: unset", "-1"),
       kernels::block_sizes_field(&Options::block_sizes, "m=512,n=512", from_params, to_params)}};
  return d;
}

// The options, with group_offset's own check first: outputs() (jit, fake tensors) refuses it too.
Options call_options(const kernels::CallArgs& a) {
  const int64_t off = a.options.integer("group_offset");
  check(off >= -1, ErrorCode::kInvalidArgument,
        std::string(kKernelName) + ": group_offset must be >= 0 (or -1: unset), got " + std::to_string(off));
  return options().parse(a);
}

const TensorView& need(const kernels::CallArgs& a, const char* name) { return kernels::required(a, kKernelName, name); }

const kernels::DeclaredInputs<Inputs>& inputs() {
  using kernels::input;
  static const kernels::DeclaredInputs<Inputs> d{
      kKernelName,
      {input(&Inputs::lhs, {"lhs", "tokens sorted by group [M, K] (f32, bf16 or f16)", true, true, {}, false, true}),
       input(&Inputs::rhs,
             {"rhs", "one matrix per local group [G, K, N] ([G, N, K] with transpose_rhs), lhs's dtype", true, true, {}, false, true}),
       input(&Inputs::group_sizes,
             {"group_sizes", "rows per group [G_total] (int32 or int64, host memory); rows past the sum are zero", true,
              false, {}, true})}};
  return d;
}

// Shapes only (the data may be absent: outputs() is asked with metadata under jit and fake
// tensors); the call itself validates everything else.
std::vector<kernels::OutputDesc> call_outputs(const kernels::CallArgs& a) {
  const Options opt = call_options(a);
  const dispatch::Dims d = bind_tensors({need(a, "lhs"), need(a, "rhs"), {}}, opt, dispatch::BindMode::kShapesOnly);
  std::vector<kernels::OutputDesc> out;
  if (a.pass != Pass::kBackward) out.push_back(kernels::output_of(d, "out", "M,N", "=lhs"));
  if (a.pass != Pass::kForward) {
    out.push_back(kernels::output_of(d, "dlhs", "M,K", "=lhs"));
    out.push_back(kernels::output_of(d, "drhs", opt.transpose_rhs ? "G,N,K" : "G,K,N", "=lhs"));
  }
  return out;
}

std::string call(const kernels::CallArgs& a, const std::vector<TensorView>& out) {
  const Options opt = call_options(a);
  const Inputs in = inputs().parse(a);
  const kernels::CallOutputs checked(call_outputs(a), out, a, kKernelName);  // the count
  // The kernel takes dout in the inputs' dtype (the gradient of a bf16 output is bf16 in autograd
  // too): an f32 one from a framework is rounded once here.
  Tensor dout_copy;
  const TensorView dout =
      a.pass == Pass::kForward ? TensorView{} : dispatch::in_dtype(need(a, "grad_out"), in.lhs.dtype, dout_copy);
  switch (a.pass) {
    case Pass::kForward: return gmm(in, out[0], opt);
    case Pass::kBackward: return backward(in, dout, checked["dlhs"], checked["drhs"], opt);  // empty when skipped
    case Pass::kFused: return forward_backward(in, dout, out[0], checked["dlhs"], checked["drhs"], opt);
  }
  throw Error(ErrorCode::kInternal, std::string(kKernelName) + ": unknown pass");
}

// ---- bench: M rows, K, N, G groups; routing balanced or skewed ----
std::vector<int64_t> route(int64_t M, int64_t G, const std::string& routing) {
  std::vector<int64_t> sizes(static_cast<size_t>(G), 0);
  if (routing == "balanced") {
    for (int64_t g = 0; g < G; ++g) sizes[static_cast<size_t>(g)] = M * (g + 1) / G - M * g / G;
    return sizes;
  }
  check(routing == "skewed", ErrorCode::kInvalidArgument,
        "--routing must be balanced or skewed, got '" + routing + "'");
  // One group with 70 % of the rows, the last two empty (G >= 4), the rest shared evenly.
  const int64_t big = M * 7 / 10, rest = M - big;
  sizes[0] = big;
  const int64_t others = G >= 4 ? G - 3 : G - 1;
  if (others == 0) {
    sizes[0] = M;
    return sizes;
  }
  for (int64_t i = 0; i < others; ++i) sizes[static_cast<size_t>(1 + i)] = rest * (i + 1) / others - rest * i / others;
  return sizes;
}

struct Settings {
  int64_t M = 0, K = 0, N = 0, G = 0;
  DType dtype = DType::kF32;
  std::string routing = "balanced";
  std::vector<int64_t> sizes;
};

class GmmBench final : public kernels::CallBenchProblem {
 public:
  GmmBench(Settings s, uint64_t seed, bool with_data = true) : CallBenchProblem(spec), s_(std::move(s)) {
    if (!with_data) return;  // cost model only (`tessera bench --predict`)
    lhs_ = random_uniform(s_.dtype, {s_.M, s_.K}, 1.0f, seed * 4 + 1);
    rhs_ = random_uniform(s_.dtype, {s_.G, s_.K, s_.N}, 1.0f, seed * 4 + 2);
    dout_ = random_uniform(s_.dtype, {s_.M, s_.N}, 1.0f, seed * 4 + 3);
    sizes_ = Tensor::empty(DType::kI64, {s_.G});
    for (int64_t g = 0; g < s_.G; ++g) sizes_.data_as<int64_t>()[g] = s_.sizes[static_cast<size_t>(g)];
  }

  harness::Row describe() const override {
    harness::Row r = harness::Row::object();
    r["routing"] = s_.routing;
    int64_t largest = 0, empty = 0;
    for (int64_t v : s_.sizes) largest = std::max(largest, v), empty += v == 0;
    r["largest_group"] = largest;
    r["empty_groups"] = empty;
    return r;
  }

  double work() const override { return 2.0 * s_.M * s_.K * s_.N; }

  harness::Cost cost(Pass pass, const std::string&) const override {
    harness::Cost c;
    const double esz = static_cast<double>(dtype_size(s_.dtype));
    const double mk = double(s_.M) * s_.K * esz, mn = double(s_.M) * s_.N * esz, gkn = double(s_.G) * s_.K * s_.N * esz;
    const double f = work();
    if (pass != Pass::kBackward) c.add({"gmm: out = lhs·rhs[g]", f, mk + gkn + mn, 0.0, false});
    if (pass != Pass::kForward) {
      c.add({"dlhs = dout·rhs[g]ᵀ", f, mn + gkn + mk, 0.0, false});
      c.add({"drhs = lhsᵀ·dout per group", f, mk + mn + gkn, 0.0, false});
    }
    c.assumptions.push_back("2·M·K·N FLOPs per product (rows past the sum are not counted as work); bytes: each operand once");
    return c;
  }

  std::vector<harness::BaselineCall> baselines(const std::vector<Pass>& passes, int threads) override {
    // The floor in every dtype: all rows as one group on the cpu backend's own micro-kernels
    // (dense-gemm); f32 also prints OpenBLAS beside it (dense-blas: one sgemm, the previous floor).
    std::vector<harness::BaselineCall> out;
    for (Pass pass : passes) {
      if (pass != Pass::kForward) continue;  // the baselines time the forward product
      harness::BaselineCall dense =
          baseline("dense-gemm", "all M rows as one group against rhs[0] through the cpu implementation: the floor", pass);
      dense.roofline_dtype = dtype_name(s_.dtype);  // bf16: against the bf16 dot-product peak
      dense.run = one_group_baseline(lhs_, rhs_, s_.N, threads);
      out.push_back(std::move(dense));
      if (s_.dtype != DType::kF32 || !harness::blas::available()) continue;
      out.push_back(baseline("dense-blas", "one OpenBLAS sgemm of all M rows against rhs[0]", pass));
      out.back().run = blas_baseline(lhs_, rhs_, {}, true);
      out.push_back(baseline("blas-loop", "one sgemm per non-empty group (OpenBLAS threads)", pass));
      out.back().run = blas_baseline(lhs_, rhs_, s_.sizes, false);
    }
    return out;
  }

  CallData call_data() const override {
    return {{{"lhs", lhs_}, {"rhs", rhs_}, {"group_sizes", sizes_}, {"grad_out", dout_}}, {}};
  }

  // The floor: one dense [M, K]·[K, N] GEMM (every row against one matrix), once per product.
  std::optional<harness::GemmFloor> gemm_floor() const override {
    return harness::GemmFloor{.M = s_.M, .N = s_.N, .K = s_.K, .dtype = s_.dtype, .count = [](Pass p) {
                                return p == Pass::kForward ? 1 : p == Pass::kBackward ? 2 : 3;
                              }};
  }

 private:
  harness::BaselineCall baseline(const std::string& name, const std::string& what, Pass pass) {
    return {.name = name, .pass = pass, .description = what, .cost = cost(pass, name)};
  }

  Settings s_;
  Tensor lhs_, rhs_, dout_, sizes_;
};

std::unique_ptr<harness::BenchProblem> make_bench_problem(const harness::GridShape& shape, DType dtype,
                                                          const harness::OptionValues& o, uint64_t seed,
                                                          bool with_data) {
  Settings s;
  s.M = shape.dim("M"), s.K = shape.dim("K"), s.N = shape.dim("N"), s.G = shape.dim("G");
  check(s.G >= 1, ErrorCode::kInvalidArgument, "grouped_matmul bench: G must be >= 1");
  s.dtype = dtype;
  s.routing = o.str("routing");
  s.sizes = route(s.M, s.G, s.routing);
  return std::make_unique<GmmBench>(std::move(s), seed, with_data);
}

}  // namespace

const kernels::KernelSpec& spec() {
  static const kernels::KernelSpec s{
      .name = kKernelName,
      .description = "grouped matmul for MoE (gmm, tgmm): ragged groups of rows, one matrix per group",
      .dims = {"M", "K", "N", "G"},
      .passes = {Pass::kForward, Pass::kBackward, Pass::kFused},
      .dtypes = {DType::kF32, DType::kBF16, DType::kF16},
      .implementations = registry,
      .check_grid = kernels::check_grid_of(testing::check_grid, testing::check_parity),
      .bench = kernels::bench_spec_of({{"routing", K::kString,
                                        "group sizes: balanced (M/G each) or skewed (one group 70 % of the rows, two empty)",
                                        "balanced", {}}},
                                      make_bench_problem),
      .tune = kernels::declared_tune_spec(tuning(), spec),
      .call = {.inputs = inputs().specs(),
               .grad_inputs = {{"grad_out", "upstream gradient of out [M, N] (f32 or lhs's dtype)", true, false, {"dout"}}},
               .options = options().specs(),
               .forward_outputs = {"out"},
               .outputs = call_outputs,
               .call = call,
               .skippable = {"dlhs", "drhs"}}};
  return s;
}

}  // namespace tessera::grouped_matmul
