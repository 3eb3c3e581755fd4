// Tessera internal (tuning): a kernel whose block sizes are integer options of its call
// (mlstm's chunk_size, mla_decode's num_splits), its tuning declared once as data.
//
// What a kernel declares (no traits struct, no Sizes type, no adapter code): the option names,
// shape buckets over its dims, the tunable implementations, the candidates and a work estimate.
// From the declaration derive
//   - the call-time choice, choose_declared(): an explicit option (> 0) is used as given; 0 asks
//     for the tuned table, then autotune-on-miss with the persistent cache (timing the call
//     itself through `run_once`), then the first candidate (the default);
//   - `tessera tune KERNEL` (kernels/declared_tune.h): the sweep over the buckets, with inputs
//     from the kernel's bench problem bound through its CallSpec signature.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/error.h"
#include "tessera/exec.h"
#include "tessera/tensor.h"
#include "tune/bucket.h"
#include "tune/choose.h"
#include "tune/params.h"
#include "tune/sweep.h"
#include "tune/table.h"

namespace tessera::tune {

struct Declared {
  std::string kernel = {};  // "mlstm"
  std::vector<std::string> options = {};  // the tuned call options, each an int: 0 = choose
  std::vector<Bucket> buckets = {};  // over every dim of the kernel, in its dims order
  // Dims that change from call to call in one job (a decode's growing cache, a serving batch's
  // size, a packing's sequence count): the autotune cache keys them by their power-of-two class,
  // so that a decode sweeps once per doubling of its cache, not at every step.
  std::vector<std::string> ragged_dims = {};
  std::vector<std::string> implementations = {};  // the tunable ones ("cpu"); others get the default
  // The candidates for a shape (the kernel's dims, in order) on `threads` CPU threads, the default
  // first. Each names every tuned option with a value > 0 (0 in a call means "choose").
  std::function<std::vector<Params>(const std::vector<int64_t>& dims, int threads)> candidates = {};
  // "": each option is a call option of its own name (mlstm's chunk_size); "block_sizes": they
  // travel together as that call option's text ("split_keys=1024"), as for mla_decode.
  std::string carrier = {};
  // Optional: the joint check of a full set of options at a shape (a pipeline's stages tuned
  // together: stage 1's split count and stage 2's combine width must agree). Throws
  // Error(kInvalidArgument) naming the broken constraint. It runs on options a caller gives
  // (the call fails before anything runs) and on tuned-table rows (a row that breaks it is
  // ignored with a warning); candidates that break it fail when timed.
  std::function<void(const Params&, const std::vector<int64_t>& dims)> validate = {};
  // Optional: the tolerance between candidates' outputs for inputs of this dtype, as a fraction
  // of the largest |value| (tune::Output::rtol), where block sizes change rounding, not only the
  // order of sums (mla_decode rounds P to bf16 against each split's own running max). Unset or
  // 0: the output dtype's default (tune/verify.h).
  std::function<double(DType)> rtol = {};
  // Optional: the default of an implementation that is not tuned, where each has its own (a
  // device backend's fixed tiles: attention's cuda and cudnn). Unset: the first candidate.
  std::function<Params(const std::string& implementation)> default_of = {};
  // Multiply-adds of one call at this shape: autotune-on-miss runs only from min_work on.
  std::function<double(const std::vector<int64_t>& dims)> work = {};
  double min_work = double(int64_t{1} << 30);
  const std::vector<TableEntry>& (*table)() = nullptr;  // the checked-in tuned table
  // Where the table lives, for `tessera tune --emit-table`: "" means the convention,
  // src/kernels/<kernel>/tuned_table.cc defining tessera::<kernel>::tuned_table() and including
  // tune/table.h (table_source()).
  std::string table_include = {}, table_namespace = {}, table_path = {};
  std::string table_file() const { return table_path.empty() ? "src/kernels/" + kernel + "/tuned_table.cc" : table_path; }
  std::string table_ns() const { return table_namespace.empty() ? "tessera::" + kernel : table_namespace; }
  std::string table_header() const { return table_include.empty() ? "tune/table.h" : table_include; }

  bool tunable(const std::string& implementation) const;
};

// One call, as the kernel's API sees it after validation.
struct DeclaredCall {
  std::string implementation = {};  // the implementation about to run
  DeviceType device = DeviceType::kCPU;
  DType dtype = DType::kF32;
  std::vector<int64_t> dims = {};  // the kernel's dims, in order
  Pass pass = Pass::kForward;
  int threads = 1;  // CPU: part of the cache key
  Params given = {};  // the call's options by name (0: choose)
  std::string variant = {};  // more of the call in the cache key ("transpose_rhs=on"); "" for none
  bool autotune_on_miss = true;
  // The implementation's own default for this problem where it depends on more than the dims
  // (linear_cross_entropy's cpu: another tile for bf16 on the AVX512-BF16 route). Unset: the
  // declaration's default_of, else the first candidate. Reported as the "default" choice.
  std::optional<Params> default_sizes = {};
};

// The tuned options for `call`: every option the call gave (> 0) is kept; when all are 0, the
// choice of choose.h (tuned table, autotune-on-miss, the default). Mixed given / 0 options take
// the default for the zeros.
// Autotune-on-miss times `run_once(candidate)`: one run of the call with those options into its
// own outputs, which `outputs` hands back (Tensor::borrow of the call's buffers) so that every
// candidate is checked against the default's before it can win and be cached (tune/verify.h);
// the real run writes them again afterwards. `run_once` must not call a tuned API itself (the
// tuner is serialized). Only host implementations autotune inside a call (a device one would
// need its stream synchronized): a device call takes the table or the default.
Choice choose_declared(const Declared& d, const DeclaredCall& call, const std::function<void(const Params&)>& run_once,
                       const OutputsFn& outputs);

// A call's output buffer in host memory, for choose_declared's `outputs`.
struct Buffer {
  std::string name;
  void* data = nullptr;  // null: absent (skipped)
  DType dtype = DType::kF32;
  Shape shape;
};
inline Buffer buffer_of(std::string name, const TensorView& t) { return {std::move(name), t.data, t.dtype, t.shape}; }
// The buffers as borrowed tensors (Tensor::borrow), the absent ones left out.
OutputsFn borrowed_outputs(std::vector<Buffer> buffers);

// Declared::candidates that try each value of one option, whatever the shape, the first the
// default: .candidates = tune::each("chunk_size", {64, 32, 128}).
inline auto each(std::string name, std::vector<int64_t> values) {
  return [name, values](const std::vector<int64_t>&, int) {
    std::vector<Params> out;
    for (int64_t v : values) out.push_back({{name, v}});
    return out;
  };
}

// dispatch_declared's `at` for a problem with one tuned option: a copy of `p` with `member` set to
// the candidate's `name` (0 where it has none). `p` outlives the call.
template <class Problem, class T>
auto with_param(const Problem& p, T Problem::*member, std::string name) {
  return [&p, member, name](const Params& cand) {
    Problem q = p;
    q.*member = static_cast<T>(param(cand, name).value_or(0));
    return q;
  };
}

// A call of a kernel whose tuning is declared, dispatched and tuned in one: on the implementation
// `registry` picks (its dispatch_problem), run(impl, at(params)) where `params` are the options
// choose_declared gives that implementation for `call` (whose implementation, device and
// autotune_on_miss are filled in here from impl and `opt`) and at(params) is the call's problem
// with them; autotune-on-miss times run(impl, at(candidate)) into `outputs` (the call's own
// buffers). Returns the implementation that ran.
// `check_given(impl)` first: the call's own sizes (a block_sizes option), refused by impl before
// anything is chosen or run, with impl's message alone (they are the call's, not a table's).
template <class Registry, class Problem, class At, class Run, class CheckGiven>
std::string dispatch_declared(const Registry& registry, const Declared& d, const ExecOptions& opt, const Problem& p,
                              const DeclaredCall& call, const std::vector<Buffer>& outputs, At&& at, Run&& run,
                              CheckGiven&& check_given) {
  return registry.dispatch_problem(opt.implementation, p, [&](const auto& impl) {
    check_given(impl);
    DeclaredCall c = call;
    c.implementation = impl.name();
    c.device = impl.device_type();
    c.autotune_on_miss = opt.autotune_on_miss;
    const auto once = [&](const Params& candidate) { run(impl, at(candidate)); };
    const Choice ch = choose_declared(d, c, once, borrowed_outputs(outputs));
    try {
      run(impl, at(ch.params));
    } catch (const Error& e) {  // sizes a table row or a cache file gave and the backend refuses
      if (e.code() != ErrorCode::kInvalidArgument || ch.source == "options" || ch.source == "default") throw;
      const bool table = ch.source.rfind("tuned table", 0) == 0;  // else the autotune cache or a sweep
      throw Error(e.code(), std::string(e.what()) + " [block sizes " + params_str(ch.params) + " from the " + ch.source +
                                (table ? "; TESSERA_TUNED_TABLE=0 avoids them]"
                                       : "; TESSERA_AUTOTUNE=0 or removing the autotune cache file avoids them]"));
    }
  });
}

template <class Registry, class Problem, class At, class Run>
std::string dispatch_declared(const Registry& registry, const Declared& d, const ExecOptions& opt, const Problem& p,
                              const DeclaredCall& call, const std::vector<Buffer>& outputs, At&& at, Run&& run) {
  return dispatch_declared(registry, d, opt, p, call, outputs, at, run, [](const auto&) {});
}

// The cache key: kernel, implementation, device kind, dtype, dims (ragged_dims by power-of-two
// class, the others exact), variant, pass, threads, version.
std::string declared_key(const Declared& d, const DeclaredCall& call, const std::string& device_kind);

}  // namespace tessera::tune
