// grouped_matmul: the public API. Validates every input and output before anything runs (an
// error touches no output), normalizes them into one Problem (the local groups' row ranges),
// picks block sizes and dispatches with the fallback rules of src/dispatch.
#include <cmath>
#include <utility>

#include "dispatch/arg_check.h"
#include "dispatch/tensor_rules.h"
#include "kernels/grouped_matmul/impl.h"
#include "tune/declared.h"
#include "tessera/error.h"
#include "tessera/grouped_matmul.h"

namespace tessera::grouped_matmul {
namespace {

using dispatch::num;
const dispatch::ArgCheck args{kKernelName, "lhs"};

// The tensors by their dims: rhs and its gradient are [G, K, N], or [G, N, K] with transpose_rhs.
// tgmm has no rhs: drhs gives G, K and N.
dispatch::TensorRules rules_of(const char* rhs) {
  return {kKernelName, {{"lhs", "M,K", "float"}, {"rhs", rhs, "=lhs"}, {"drhs", rhs, "=lhs|f32"}, {"dout", "M,N", "=lhs"}}};
}
const dispatch::TensorRules& rules(bool transpose_rhs) {
  static const dispatch::TensorRules plain = rules_of("G,K,N"), transposed = rules_of("G,N,K");
  return transpose_rhs ? transposed : plain;
}

// The local groups' row offsets from group_sizes (validated: host int32/int64 [G_total], sizes
// >= 0, Σ <= M, G_total = G without an offset, offset + G <= G_total with one).
std::vector<int64_t> group_rows(const TensorView& gs, int64_t G, int64_t M, const Options& opt) {
  if (!dispatch::given(gs)) args.fail("group_sizes is required");
  args.integer(gs, "group_sizes");
  if (gs.ndim() != 1) args.fail("group_sizes must be 1-D [G], got " + shape_str(gs.shape));
  args.host(gs, "group_sizes");
  const int64_t total = gs.shape[0];
  const int64_t offset = opt.group_offset.value_or(0);
  if (!opt.group_offset && total != G)
    args.fail("group_sizes has " + num(total) + " entries but rhs holds G=" + num(G) +
        " groups (set group_offset for a shard of the experts)");
  if (opt.group_offset && (offset < 0 || offset > total - G))
    args.fail("group_offset=" + num(offset) + " with G_local=" + num(G) + " local groups must lie in [0, " +
        num(total - G) + "] for " + num(total) + " groups in group_sizes");
  std::vector<int64_t> begin;
  int64_t row = 0;
  for (int64_t g = 0; g < total; ++g) {
    const int64_t s = load_as_i64(gs.data, gs.dtype, g);
    if (s < 0) args.fail("group_sizes[" + num(g) + "] = " + num(s) + " is negative");
    if (s > M - row) args.fail("group sizes sum past M=" + num(M) + " rows of lhs (at group " + num(g) + ")");
    if (g == offset) begin.push_back(row);
    row += s;
    if (g >= offset && g < offset + G) begin.push_back(row);
  }
  if (G == 0) begin = {row, row};  // no local group: every row is outside
  return begin;
}

// Every named view given: an empty one is "<name> is required" (it reached a rule as an unbound dim).
void required(std::initializer_list<std::pair<const char*, TensorView>> views) {
  for (const auto& [name, t] : views)
    if (!dispatch::given(t)) args.fail(std::string(name) + " is required");
}

}  // namespace

dispatch::Dims bind_tensors(const Inputs& in, const Options& opt, dispatch::BindMode mode) {
  required({{"lhs", in.lhs}, {"rhs", in.rhs}});  // group_sizes: make_problem (outputs() has none)
  return rules(opt.transpose_rhs).bind({{"lhs", in.lhs}, {"rhs", in.rhs}}, mode);
}

namespace {

// The common part of gmm and tgmm: lhs [M, K] and group_sizes against G local groups of
// [K, N] matrices, the dims bound from lhs and rhs (or drhs).
Problem make_problem(const dispatch::Dims& d, const TensorView& lhs, const TensorView& gs, const Options& opt) {
  Problem p;
  p.device = d.device();
  p.dtype = lhs.dtype;
  p.M = d["M"], p.K = d["K"], p.N = d["N"], p.G = d["G"];
  p.begin = group_rows(gs, p.G, p.M, opt);
  p.transpose_rhs = opt.transpose_rhs;
  // The products' work sizes the thread count (tessera/exec.h): 2·M·K·N however the groups split M.
  p.num_threads = resolve_num_threads(opt.num_threads, 2.0 * static_cast<double>(p.M) * static_cast<double>(p.K) *
                                                           static_cast<double>(p.N));
  p.stream = opt.stream;
  p.memory_budget = opt.memory_budget;
  if (opt.check_finite) args.finite(lhs, "lhs");
  return p;
}

dispatch::Dims bind(const Inputs& in, const Options& opt) { return bind_tensors(in, opt, dispatch::BindMode::kFull); }

Problem normalize(const dispatch::Dims& d, const Inputs& in, const Options& opt) {
  Problem p = make_problem(d, in.lhs, in.group_sizes, opt);
  if (opt.check_finite) args.finite(in.rhs, "rhs");
  return p;
}

void check_dout(dispatch::Dims& d, const TensorView& dout, const Options& opt) {
  d.check(dout, "dout", "M,N", "=lhs");
  if (opt.check_finite) args.finite(dout, "dout");
}

// The gradients' rules (dlhs like lhs; drhs in rhs's layout). Either may be left out (an empty
// view: a frozen weight's drhs): its product is skipped.
void check_grads(dispatch::Dims& d, const TensorView& dlhs, const TensorView& drhs, const Options& opt) {
  if (dispatch::given(dlhs)) d.check(dlhs, "dlhs", "M,K", "=lhs|f32");
  if (dispatch::given(drhs)) d.check(drhs, "drhs", opt.transpose_rhs ? "G,N,K" : "G,K,N", "=lhs|f32");
}

// The block sizes: the call's (the implementation validates them, and whatever else it is given,
// before anything runs), else
// the tuned table's, else autotune-on-miss (timing this call into `outputs`), else the default.
// tgmm alone, a gradient left out and transpose_rhs have best sizes of their own: they are part of
// the cache key (`part`: "|tgmm", "|grads=dlhs", "|grads=drhs" or "").
template <class Body>
std::string dispatch_call(const Problem& p, const Options& opt, Pass op, const std::string& part,
                          const std::vector<tune::Buffer>& outputs, Body&& body) {
  const tune::DeclaredCall c{
      .dtype = p.dtype,
      .dims = {p.M, p.K, p.N, p.G},
      .pass = op,
      .threads = p.num_threads,
      .given = opt.block_sizes ? tune::Params{{"m", opt.block_sizes->m}, {"n", opt.block_sizes->n}} : tune::Params{},
      .variant = std::string("transpose_rhs=") + (p.transpose_rhs ? "on" : "off") + part};
  const auto at = [](const tune::Params& s) { return BlockSizes{*tune::param(s, "m"), *tune::param(s, "n")}; };
  return tune::dispatch_declared(
      registry(), tuning(), opt, p, c, outputs, at,
      [&](const Implementation& impl, const BlockSizes& bs) {
        impl.validate_block_sizes(bs);  // a table row too
        body(impl, bs);
      },
      [&](const Implementation& impl) { if (opt.block_sizes) impl.validate_block_sizes(*opt.block_sizes); });
}

// dlhs is a gmm of dout against rhs transposed: K and N swap, and so does rhs's layout.
Problem transposed(const Problem& p) {
  Problem q = p;
  std::swap(q.K, q.N);
  q.transpose_rhs = !p.transpose_rhs;
  return q;
}

// The cache key's part for a gradient left out ("" with both).
std::string grads_part(const TensorView& dlhs, const TensorView& drhs) {
  if (dispatch::given(dlhs) == dispatch::given(drhs)) return dispatch::given(dlhs) ? "" : "|grads=none";
  return dispatch::given(dlhs) ? "|grads=dlhs" : "|grads=drhs";
}

void run_backward(const Implementation& impl, const BlockSizes& bs, const Problem& p, const Inputs& in,
                  const TensorView& dout, const TensorView& dlhs, const TensorView& drhs) {
  if (dispatch::given(dlhs)) impl.gmm(transposed(p), bs, {dout.data, in.rhs.data, dlhs.data, dlhs.dtype});
  if (dispatch::given(drhs)) impl.tgmm(p, bs, {in.lhs.data, dout.data, drhs.data, drhs.dtype});
}

}  // namespace

std::string BlockSizes::str() const { return "m=" + num(m) + ",n=" + num(n); }

void validate_block_sizes(const std::string& implementation, const BlockSizes& bs) {
  registry().require(implementation).validate_block_sizes(bs);
}

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

namespace {
// No output shares memory with an input, dout or another output (a backend reads its inputs after
// writing outputs; an autotune sweep writes the outputs before the call it keeps).
void check_apart(const Inputs& in, const dispatch::ArgCheck::Named& outputs, const TensorView& dout = {}) {
  args.apart(outputs, {{"lhs", in.lhs}, {"rhs", in.rhs}, {"group_sizes", in.group_sizes}, {"dout", dout}});
}
}  // namespace

std::string gmm(const Inputs& in, const TensorView& out, const Options& opt) {
  dispatch::Dims d = bind(in, opt);
  const Problem p = normalize(d, in, opt);
  d.check(out, "out", "M,N", "=lhs|f32");
  check_apart(in, {{"out", out}});
  return dispatch_call(p, opt, Pass::kForward, "", {tune::buffer_of("out", out)},
                       [&](const Implementation& impl, const BlockSizes& bs) {
    impl.gmm(p, bs, {in.lhs.data, in.rhs.data, out.data, out.dtype});
  });
}

std::string tgmm(const TensorView& lhs, const TensorView& dout, const TensorView& group_sizes, const TensorView& drhs,
                 const Options& opt) {
  required({{"lhs", lhs}, {"dout", dout}, {"group_sizes", group_sizes}, {"drhs", drhs}});
  dispatch::Dims d = rules(opt.transpose_rhs).bind({{"lhs", lhs}, {"drhs", drhs}, {"dout", dout}});
  const Problem p = make_problem(d, lhs, group_sizes, opt);
  if (opt.check_finite) args.finite(dout, "dout");
  args.apart({{"drhs", drhs}}, {{"lhs", lhs}, {"dout", dout}, {"group_sizes", group_sizes}});
  return dispatch_call(p, opt, Pass::kBackward, "|tgmm", {tune::buffer_of("drhs", drhs)},
                       [&](const Implementation& impl, const BlockSizes& bs) {
    impl.tgmm(p, bs, {lhs.data, dout.data, drhs.data, drhs.dtype});
  });
}

std::string backward(const Inputs& in, const TensorView& dout, const TensorView& dlhs, const TensorView& drhs,
                     const Options& opt) {
  dispatch::Dims d = bind(in, opt);
  const Problem p = normalize(d, in, opt);
  check_dout(d, dout, opt);
  check_grads(d, dlhs, drhs, opt);
  check_apart(in, {{"dlhs", dlhs}, {"drhs", drhs}}, dout);
  return dispatch_call(p, opt, Pass::kBackward, grads_part(dlhs, drhs),
                       {tune::buffer_of("dlhs", dlhs), tune::buffer_of("drhs", drhs)},
                       [&](const Implementation& impl, const BlockSizes& bs) {
    run_backward(impl, bs, p, in, dout, dlhs, drhs);
  });
}

std::string forward_backward(const Inputs& in, const TensorView& dout, const TensorView& out, const TensorView& dlhs,
                             const TensorView& drhs, const Options& opt) {
  dispatch::Dims d = bind(in, opt);
  const Problem p = normalize(d, in, opt);
  d.check(out, "out", "M,N", "=lhs|f32");
  check_dout(d, dout, opt);
  check_grads(d, dlhs, drhs, opt);
  check_apart(in, {{"out", out}, {"dlhs", dlhs}, {"drhs", drhs}}, dout);
  const std::vector<tune::Buffer> outs{tune::buffer_of("out", out), tune::buffer_of("dlhs", dlhs),
                                       tune::buffer_of("drhs", drhs)};
  return dispatch_call(p, opt, Pass::kFused, grads_part(dlhs, drhs), outs, [&](const Implementation& impl, const BlockSizes& bs) {
    impl.gmm(p, bs, {in.lhs.data, in.rhs.data, out.data, out.dtype});
    run_backward(impl, bs, p, in, dout, dlhs, drhs);
  });
}

namespace {

Result make_outputs(const Inputs& in, const Options& opt, bool with_grad) {
  const dispatch::Dims d = bind_tensors(in, opt, dispatch::BindMode::kShapesOnly);
  Result r;
  const Device dev = in.lhs.device;
  r.out = Tensor::empty(in.lhs.dtype, d.shape("M,N"), dev);
  if (with_grad) {
    r.dlhs = Tensor::empty(in.lhs.dtype, in.lhs.shape, dev);
    r.drhs = Tensor::empty(in.lhs.dtype, in.rhs.shape, dev);
  }
  return r;
}

}  // namespace

Result compute(const Inputs& in, const Options& opt) {
  Result r = make_outputs(in, opt, false);
  r.implementation = gmm(in, r.out.view(), opt);
  return r;
}

Result compute_with_grad(const Inputs& in, const TensorView& dout, const Options& opt) {
  Result r = make_outputs(in, opt, true);
  r.implementation = forward_backward(in, dout, r.out.view(), r.dlhs.view(), r.drhs.view(), opt);
  return r;
}

}  // namespace tessera::grouped_matmul
