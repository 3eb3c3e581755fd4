// Tessera: the kernel registry. Each kernel registers one KernelSpec (its spec.cc); the CLI,
// the generic parity suite and the Python bindings iterate the registry and never name a
// kernel. docs/ADDING_A_KERNEL.md walks through writing a spec.
//
// A spec says, for generic tools:
//   what it is        name, one line, its dims (named: B,H,V or B,S,H,D), its passes
//   implementations   its implementation registry (dispatch/registry.h)
//   check             its check grid: cases that run an implementation against the reference
//                     and report each output's deviation (harness/parity.h)
//   bench             how to build a benchmark problem from a grid shape (harness/bench.h):
//                     inputs, cost model, GEMM floor, baselines; its extra bench flags
//   tune              its shape buckets, tuned table and how to time one candidate
//   call              its signature and one pass on the caller's own views, no copy, outputs
//                     preallocated by the caller. Written once, it serves every front end: the
//                     Python bindings (NumPy, PyTorch custom ops, JAX FFI) and `tessera run`
//                     (tools/tessera/run.cc derives the flags, .npy loading and outputs from it).
//
// One vocabulary: an input or option has one snake_case name (the C++ Options field, the Python
// keyword); its CLI flag is the same name in kebab case (z_loss_weight -> --z-loss-weight).
// Older CLI spellings stay as `aliases`. An upstream gradient is named grad_<output>.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dispatch/registry.h"
#include "dispatch/tensor_rules.h"
#include "harness/bench.h"
#include "harness/grid.h"
#include "harness/options.h"
#include "harness/parity.h"
#include "tessera/exec.h"
#include "tessera/tensor.h"
#include "tessera/error.h"
#include "tune/bucket.h"
#include "tune/params.h"
#include "tune/sweep.h"
#include "tune/table.h"

namespace tessera::kernels {

// ---- check ----
struct CheckCase {
  std::string name;
  // Runs `implementation` on `device` for `pass` and the reference on the same inputs and
  // compares every output. Never throws for an implementation's failure: it is reported.
  std::function<harness::ParityReport(const std::string& implementation, Pass pass, Device device)> run;
};

// A kernel's check grid as CheckCases: one per case of `grid` (anything with name()), run by
// parity(case, implementation, pass, device) -> harness::ParityReport.
template <class Case, class Parity>
std::vector<CheckCase> check_cases_of(const std::vector<Case>& grid, Parity parity) {
  std::vector<CheckCase> out;
  for (const Case& c : grid)
    out.push_back({c.name(), [c, parity](const std::string& impl, Pass pass, Device dev) { return parity(c, impl, pass, dev); }});
  return out;
}

// A kernel's KernelSpec::check_grid from its testing.h: `grid(quick)` and
// `parity(case, implementation, pass, device)` (a forward-only kernel's: `parity(case,
// implementation, device)`).
template <class Case, class Parity>
std::function<std::vector<CheckCase>(bool quick)> check_grid_of(std::vector<Case> (*grid)(bool), Parity parity) {
  return [grid, parity](bool quick) {
    return check_cases_of(grid(quick), [parity](const Case& c, const std::string& impl, Pass pass, Device dev) {
      if constexpr (std::is_invocable_v<Parity, const Case&, const std::string&, Device>)
        return parity(c, impl, dev);  // a forward-only kernel's parity takes no pass
      else
        return parity(c, impl, pass, dev);
    });
  };
}

// ---- tune ----
// One (implementation, dtype, shape) to sweep.
struct TuneJob {
  std::string device_kind;                 // keys the tuned table (tune/device_kind.h)
  std::vector<tune::Params> candidates;    // the default first
  dispatch::Availability support;          // can the implementation run this shape at all
  std::function<tune::Runner()> make_run;  // allocates the inputs; times one call (and its outputs)
};

struct TuneSpec {
  std::function<const std::vector<tune::Bucket>&()> buckets;
  std::function<const std::vector<tune::TableEntry>&()> table;  // the checked-in table
  // Is this implementation's block size tunable?
  std::function<bool(const std::string& implementation)> tunable;
  // shape: the bucket's dims in order. with_data = false: candidates only (no allocation).
  std::function<TuneJob(const std::string& implementation, const std::vector<int64_t>& shape,
                        DType dtype, Pass pass, bool with_data)>
      job;
  tune::TableSource source;  // how `tessera tune --emit-table` writes tuned_table.cc
  std::string table_path;    // the checked-in table, relative to the repository root
};

// ---- call ----
// A pass on views the caller owns (NumPy / PyTorch / JAX buffers taken zero-copy). The caller
// asks `outputs` what to allocate, allocates it with its own framework and hands the views to
// `call`, which validates everything (an error touches no output) and runs the pass.
struct CallInput {
  std::string name;        // Python keyword: "x", "bias", "grad_loss"; CLI flag --x, --grad-loss
  std::string help;
  bool required = true;
  bool differentiable = false;  // has a gradient output named "d" + name (backward, fused)
  std::vector<std::string> aliases = {};  // older CLI spellings, kebab case without dashes ("do")
  bool host_only = false;                  // read on the host whatever the device (group sizes)
  // The computation's dtype: under a framework's autocast (torch.autocast) the front end casts
  // these inputs to its dtype, as it does a matmul's operands (x and w; q, k, v); gates, states,
  // weights and indices keep theirs.
  bool autocast = false;
  // A 2-D transposed view of a contiguous array is read in place (linear_cross_entropy's w); any
  // other input must be contiguous (the front ends copy a strided view once: docs/PYTHON.md).
  bool transposed = false;
  // The option whose nonzero value needs this input as a random key (attention's dropout_seed for
  // dropout_p): where the caller gives none, the PyTorch front end draws it from torch's generator
  // on the inputs' device (torch.manual_seed reproduces it); NumPy and JAX callers pass their own.
  std::string seed_of = {};
};

// A CLI flag that sets several options at once from "A,B" (attention's --window LEFT,RIGHT sets
// window_left and window_right): kept for the spellings scripts already use.
struct CompoundFlag {
  std::string flag;                  // kebab case without dashes
  std::vector<std::string> options;  // the options it sets, in order
  std::string help;
};

struct CallArgs {
  Pass pass = Pass::kForward;
  // Inputs, upstream gradients and saved forward outputs, by name (absent optional ones left out).
  std::vector<std::pair<std::string, TensorView>> tensors;
  harness::OptionValues options;  // every declared option (defaults filled in)
  ExecOptions exec;
  // Gradients the caller does not want (backward and fused: "dw" of a frozen weight), each one
  // of the kernel's CallSpec::skippable; outputs_of leaves them out and the kernel skips their work.
  std::vector<std::string> skip = {};
  bool skips(const std::string& name) const;
  const TensorView* tensor(const std::string& name) const;  // nullptr when not given
  TensorView tensor_or_empty(const std::string& name) const;  // an empty view when not given
};

// A kernel's Options with the call's ExecOptions (implementation, threads, stream, ...) filled in.
template <class Options>
Options exec_options(const CallArgs& a) {
  Options opt;
  static_cast<ExecOptions&>(opt) = a.exec;
  return opt;
}

struct OutputDesc {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  Shape strides;  // elements: row-major, or another layout to allocate (a gradient in w's layout)
};

// The tensor `name` of a call; Error(kInvalidArgument) "<kernel>: <name> is required" when absent.
const TensorView& required(const CallArgs& a, const std::string& kernel, const char* name);
// The "block_sizes" option every kernel's call declares (block_sizes_option_spec): "m=256,n=512",
// empty for the implementation's choice (tuned table, autotune, defaults). Every field of the
// kernel's BlockSizes must be given and no other; the implementation that runs validates the
// values (Error(kInvalidArgument) naming the broken constraint).
harness::OptionSpec block_sizes_option_spec(const std::string& example);
template <class Sizes>
std::optional<Sizes> block_sizes_option(const harness::OptionValues& options, const std::string& kernel,
                                        Sizes (*from)(const tune::Params&), tune::Params (*to)(const Sizes&)) {
  if (!options.has("block_sizes")) return std::nullopt;
  const tune::Params given = tune::parse_params(options.str("block_sizes"), kernel + ": block_sizes");
  std::string names;  // the fields, from a default-constructed Sizes
  for (const auto& [name, value] : to(Sizes{})) names += (names.empty() ? "" : ", ") + name;
  for (const auto& [name, value] : to(Sizes{}))
    check(tune::param(given, name).has_value(), ErrorCode::kInvalidArgument,
          kernel + ": block_sizes lacks " + name + " (fields: " + names + ")");
  for (const auto& [name, value] : given)
    check(tune::param(to(Sizes{}), name).has_value(), ErrorCode::kInvalidArgument,
          kernel + ": block_sizes has no field '" + name + "' (fields: " + names + ")");
  return from(given);
}
template <class Sizes>
std::optional<Sizes> block_sizes_option(const CallArgs& a, const std::string& kernel,
                                        Sizes (*from)(const tune::Params&), tune::Params (*to)(const Sizes&)) {
  return block_sizes_option<Sizes>(a.options, kernel, from, to);
}


// The views a CallSpec::call received, by the names its `outputs` gave them. Throws
// Error(kInvalidArgument) "<kernel>: <pass> writes N outputs, got M" when the count differs.
class CallOutputs {
 public:
  // want: the kernel's outputs for the pass, skipped ones included (they read as empty views).
  CallOutputs(const std::vector<OutputDesc>& want, const std::vector<TensorView>& out, const CallArgs& a,
              const std::string& kernel);
  TensorView operator[](const std::string& name) const;  // an empty view when `name` is not written
  const std::vector<TensorView>& all() const { return out_; }

 private:
  std::vector<std::string> names_;
  std::vector<TensorView> out_;
};

// A contiguous output declared by its dims and dtype rule against a call's bound tensors
// (dispatch/tensor_rules.h): output_of(d, "o", "T,Hq,Dv", "=q").
OutputDesc output_of(const dispatch::Dims& d, const std::string& name, const std::string& dims, const std::string& dtype);

// The contiguous output `name` with the dims and dtype of its rule in `rules`, against a call's
// bound inputs: declared_output(d, rules(), "h").
inline OutputDesc declared_output(const dispatch::Dims& d, const dispatch::TensorRules& rules,
                                  const std::string& name) {
  const dispatch::TensorRule& r = dispatch::rule_of(rules, name);
  return output_of(d, name, r.dims, r.dtype);
}

// The tensor a caller allocates for `d` on `device` (zeros; d.strides honoured: a gradient in a
// transposed weight's layout gets that layout).
Tensor allocate_output(const OutputDesc& d, Device device);

struct CallSpec {
  std::vector<CallInput> inputs = {};  // the forward's inputs, in signature order
  // What backward (and fused) take besides the inputs: upstream gradients of the forward's
  // outputs (required) and saved forward outputs (optional, they spare a recomputation).
  std::vector<CallInput> grad_inputs = {};
  std::vector<harness::OptionSpec> options = {};  // names as the C++ Options fields
  std::vector<CompoundFlag> compound_flags = {};  // CLI only
  std::vector<std::string> forward_outputs = {};  // the forward's outputs that take an upstream gradient
  std::vector<std::string> saved_outputs = {};  // forward outputs that backward may take back
  // The outputs of `pass` for these inputs (only dtype, shape and strides of args.tensors are
  // read; data may be null). Throws Error(kInvalidArgument) like the call would. Every output size
  // must be one of the inputs' sizes (or a product of them only as they appear in an input) or a
  // constant: torch.compile's dynamic shapes map output sizes to the inputs' symbolic ones by
  // asking again at other sizes (python/tessera/torch.py, _symbolic_shapes).
  std::function<std::vector<OutputDesc>(const CallArgs& args)> outputs = {};
  // Runs args.pass writing `out` (views of what `outputs` described, in its order). Returns the
  // name of the implementation that ran.
  std::function<std::string(const CallArgs& args, const std::vector<TensorView>& out)> call = {};
  // The gradient outputs a caller may leave out (CallArgs::skip), their work skipped: none
  // unless the kernel declares them.
  std::vector<std::string> skippable = {};
};

// Error(kInvalidArgument) unless every name of args.skip is one of call.skippable: "<kernel>:
// cannot skip 'lse' (skippable: dx, dw, dbias)" ("none" when the kernel declares none), and
// unless the pass computes gradients.
void check_skip(const CallSpec& call, const CallArgs& args, const std::string& kernel);
// "dx,dw" -> {"dx", "dw"}: a comma list of gradients to skip (CLI and bench flags), each one of
// call.skippable and named once, else Error(kInvalidArgument) naming `flag`; "" -> {}.
std::vector<std::string> parse_skip(const CallSpec& call, const std::string& text, const std::string& flag);
// call.outputs(args) without the skipped ones (check_skip first): what a caller allocates.
std::vector<OutputDesc> outputs_of(const CallSpec& call, const CallArgs& args, const std::string& kernel);

// A benchmark call derived from the signature (every kernel's BenchProblem::bind): `inputs`
// (host tensors by call-input name, upstream gradients grad_<output> included) are copied to
// `device` except host_only ones; the outputs of `pass` are allocated there; a backward pass gets
// the forward's saved outputs (lse) from a forward call run in `prepare`. `options` by declared
// name (defaults for the others). `skip`: gradients a backward or fused pass leaves out
// (CallArgs::skip). `loss` reads a 0-d f32 first output (a loss) back. `call` must
// outlive the BenchCall (a registered kernel's spec does).
// `v` as option text that parses back to the same double.
std::string option_text(double v);
harness::BenchCall bind_call(const CallSpec& call, const std::vector<std::pair<std::string, Tensor>>& inputs,
                             const harness::OptionValues& options, const std::string& implementation,
                             Device device, Pass pass, const ExecOptions& exec,
                             const std::vector<std::string>& skip = {});

// ---- bench ----
struct BenchSpec {
  std::vector<harness::OptionSpec> options = {};  // the kernel's extra bench flags
  // A problem for a grid shape (which holds every dim) and dtype, inputs generated from `seed`.
  std::function<std::unique_ptr<harness::BenchProblem>(const harness::GridShape& shape, DType dtype,
                                                       const harness::OptionValues& options,
                                                       uint64_t seed)>
      make_problem = nullptr;
  // Optional (`tessera bench --predict`): the same problem without generating or allocating its
  // inputs; only describe, work, cost and gemm_floor are called on it. Unset: make_problem.
  std::function<std::unique_ptr<harness::BenchProblem>(const harness::GridShape& shape, DType dtype,
                                                       const harness::OptionValues& options)>
      make_cost_model = nullptr;
};

struct KernelSpec;

// A bench problem whose inputs are its call's (call_data()): bind() is one bind_call through the
// kernel's signature, as every Python call takes it. `kernel` returns the registered spec.
class CallBenchProblem : public harness::BenchProblem {
 public:
  explicit CallBenchProblem(const KernelSpec& (*kernel)()) : kernel_(kernel) {}
  harness::BenchCall bind(const std::string& implementation, Device dev, Pass pass, const ExecOptions& exec) override;

 private:
  const KernelSpec& (*kernel_)();
};

// A BenchSpec from one factory make(shape, dtype, options, seed, with_data): with_data false is
// the cost model of `tessera bench --predict` (no inputs generated).
using BenchFactory = std::unique_ptr<harness::BenchProblem> (*)(const harness::GridShape& shape, DType dtype,
                                                                const harness::OptionValues& options, uint64_t seed,
                                                                bool with_data);
BenchSpec bench_spec_of(std::vector<harness::OptionSpec> options, BenchFactory make);

struct KernelSpec {
  std::string name = {};
  std::string description = {};  // one line
  std::vector<std::string> dims = {};  // named dims of its bench shapes and tune buckets
  std::vector<Pass> passes = {};
  std::vector<DType> dtypes = {};  // input dtypes it takes
  // A pipeline (split-KV partial attention, then the lse combine): the trace scope that marks
  // each stage in its CPU implementations (core/trace.h), in order, each sequential or
  // concurrent with the one before (harness::Stage); `tessera bench` reports each stage's time
  // beside the total. Empty: one stage. The stages' block sizes are options of the call, tuned
  // and validated together by the kernel's tune::Declared (its `validate` sees them all).
  std::vector<harness::Stage> stages = {};
  std::function<dispatch::RegistryView&()> implementations = {};
  std::function<std::vector<CheckCase>(bool quick)> check_grid = {};
  BenchSpec bench = {};
  TuneSpec tune = {};
  CallSpec call = {};
};

// The kernels, in a fixed order (registry.cc lists them).
const std::vector<const KernelSpec*>& all();
// Throws Error(kNotFound) listing the known kernels.
const KernelSpec& get(const std::string& name);
std::string names();  // "linear_cross_entropy, attention"

// Parses "a,b,c" against a kernel's implementations: unknown names (after trimming) are an
// error listing the known ones, never skipped. Empty: every implementation but the reference.
std::vector<std::string> pick_implementations(const KernelSpec& k, const std::string& list,
                                              bool include_reference = false);

// Versions (docs/VERSIONS.md): "cpu_v2" and "cpu_v3" are versions of the family "cpu".
std::string version_family(const std::string& implementation);
// The version `implementation` is compared with in benchmarks: its family's current version
// (when it is not that one itself), else the family's first version; "" when it has no sibling.
std::string version_base(const dispatch::RegistryView& registry, const std::string& implementation);

// A benchmark configuration for `k`: the named implementations (empty: all, the reference
// included) that are available here (the others are reported in `messages`), one case per
// shape × dtype, and the kernel's bench options (defaults where not given).
harness::BenchConfig bench_config(const KernelSpec& k, const std::string& implementations,
                                  const std::vector<harness::GridShape>& shapes,
                                  const std::vector<DType>& dtypes,
                                  const harness::OptionValues& options, uint64_t seed,
                                  std::vector<std::string>* messages);

}  // namespace tessera::kernels
