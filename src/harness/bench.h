// Tessera harness: the generic benchmark driver behind `tessera bench KERNEL`.
//
// A kernel describes one benchmark problem (a grid shape × dtype with its inputs generated) as a
// BenchProblem: the row fields its case does not carry (the case's grid dims and dtype are
// BenchCase::fields), its cost model, a way to bind a call of one
// implementation / pass / device, the plain-GEMM floor it is compared with, and optional
// baselines of the same math (a materialized BLAS version, say). The driver does the rest, the
// same way for every kernel: first-call and steady-state timing (CUDA events on a device, via
// the device hooks; wall clock on the host), tracked and RSS memory, useful and issued GFLOP/s,
// GB/s, the roofline fraction (flagged when above 100 %: stale ceilings), and the ratios to the
// GEMM floor, to the baseline and to the base version (cpu_v2 / cpu) timed in the same run. Every
// row carries the kernel's dims under their own names.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/cost.h"
#include "harness/options.h"
#include "harness/roofline.h"
#include "harness/table.h"
#include "tessera/tensor.h"
#include "harness/timer.h"
#include "tessera/exec.h"
#include "tessera/tensor.h"

namespace tessera::harness {

// One implementation / pass / device bound to its inputs and preallocated outputs.
struct BenchCall {
  std::function<void()> run;                       // one call
  std::function<void()> prepare;                   // optional, untimed, before the first call
  std::function<std::optional<double>()> loss;     // optional scalar result (a sanity value)
  std::function<std::string()> ran;                // which implementation ran (dispatch)
  // Optional: the outputs every run overwrites, by name (the tuner checks candidates with them).
  std::function<std::vector<std::pair<std::string, Tensor>>()> outputs;
};

// A baseline of the same math timed in the same run (host BLAS).
struct BaselineCall {
  std::string name = {};  // "blas-materialized"
  Pass pass = Pass::kForward;
  std::string description = {};  // what run() does
  std::string roofline_dtype = "f32";
  Cost cost = {};
  std::function<void()> run = {};
  std::function<std::optional<double>()> loss = {};
};

// The plain GEMM a pass is compared with: C[M,N] = A[M,K]·B[K,N] (B transposed when
// b_transposed), count(pass) times.
struct GemmFloor {
  int64_t M = 0, N = 0, K = 0;
  bool b_transposed = false;
  DType dtype = DType::kF32;
  std::function<int(Pass)> count = {};
};

class BenchProblem {
 public:
  virtual ~BenchProblem() = default;
  // Row fields beyond the case's own (BenchCase::fields: its grid dims and dtype): derived sizes
  // and options ({"layout": "hv"}); a field named like a case field replaces it.
  virtual Row describe() const { return Row::object(); }
  // Multiply-adds of one forward (for the "reference is too slow at this size" rule).
  virtual double work() const = 0;
  virtual Cost cost(Pass pass, const std::string& implementation) const = 0;
  // Places inputs and outputs on `device` and binds a call; throws Error when it cannot.
  virtual BenchCall bind(const std::string& implementation, Device device, Pass pass,
                         const ExecOptions& exec) = 0;
  virtual std::optional<GemmFloor> gemm_floor() const { return std::nullopt; }
  // What bind hands the kernel's CallSpec: the inputs by call-input name (upstream gradients
  // grad_<output> included) and the call's options; no tensors when bind does not go through
  // the signature. The declared tuner (kernels/declared_tune.h) binds them with each
  // candidate's options added.
  struct CallData {
    std::vector<std::pair<std::string, Tensor>> tensors;
    OptionValues options;
    std::vector<std::string> skip = {};  // gradients the backward / fused passes leave out
  };
  virtual CallData call_data() const { return {}; }
  // Host baselines for these passes (empty when the kernel has none); throws Error when they
  // cannot be built (no BLAS).
  virtual std::vector<BaselineCall> baselines(const std::vector<Pass>& passes, int threads) {
    (void)passes, (void)threads;
    return {};
  }
};

// A stage of a pipeline kernel: the trace scope that marks it in its CPU implementations
// (core/trace.h), and whether it runs concurrently with the stage before it (both on the worker
// pool at the same time, e.g. a mixed batch's decode and prefill rows: their spans overlap, and
// the total is not their sum).
struct Stage {
  std::string scope;
  bool concurrent = false;
  Stage(std::string s, bool with_previous = false) : scope(std::move(s)), concurrent(with_previous) {}  // NOLINT
  Stage(const char* s) : scope(s) {}  // NOLINT(google-explicit-constructor): {"a.x", "a.y"} lists
  bool operator==(const Stage&) const = default;
};

struct BenchCase {
  std::string shape_name;  // from the grid ("" for --shape)
  std::string label;       // "B=2048,H=1024,V=32768 f32"
  std::function<std::unique_ptr<BenchProblem>()> make;  // generates the inputs
  // Optional: the same problem without inputs, for predictions (harness/predict.h): describe,
  // work, cost and gemm_floor only (bind and baselines are never called on it). Unset: make.
  std::function<std::unique_ptr<BenchProblem>()> make_cost_model = nullptr;
  Row fields = Row::object();  // the first fields of its rows: the kernel's dims and the dtype
};

struct BenchConfig {
  std::string kernel;
  std::vector<std::string> implementations;  // resolved names, each available here
  std::vector<DeviceType> devices;           // device of each implementation
  // Versions (docs/VERSIONS.md): for each implementation, the version it is compared with
  // ("cpu" for "cpu_v2"; "" for none). When both are timed, its rows get version_base and
  // vs_version = its median / the base's median for the same shape, dtype and pass.
  std::vector<std::string> version_bases;
  std::vector<BenchCase> cases;
  std::vector<Pass> passes{Pass::kForward, Pass::kBackward, Pass::kFused};
  TimingOptions timing;
  ExecOptions exec;            // implementation is set per row
  bool gemm_baseline = true;   // time the plain GEMM floor
  bool compare = false;        // time the kernel's baselines
  double reference_max_work = 16.0 * 1024 * 1024;  // skip "reference" above this (see work())
  bool include_reference_large = false;
  // A pipeline kernel's stages (Stage), in order. Each host row then also gets
  // stage_<last dotted part of the scope>_ms: the median over stage_runs traced calls (after the
  // timed ones) of each stage's wall-clock span, and "stages" as one line ("a 3.1 ms + b 0.2 ms";
  // "||" between stages that run concurrently).
  std::vector<Stage> stages;
  int stage_runs = 5;
  const Roofline* roofline = nullptr;
  bool progress = true;
};

struct BenchResult {
  std::vector<Row> rows;
  std::vector<std::string> messages;  // skips, fallbacks, notes (also printed as they happen)
};

BenchResult run_bench(const BenchConfig& cfg);

// Column order for tables and CSV: the generic leading fields, `dims`, then the rest.
std::vector<std::string> bench_columns(const std::vector<std::string>& dims);

// How results were made (bench_machine.cc): the CPU (vendor, family / model / stepping, the
// microarchitecture and device kind of the tuned tables, ISA level, Highway's dispatched
// target), the BLAS (version string and core type) and every TESSERA_* variable in effect.
// Rows carry the short forms: device_kind, blas_core, tessera_env and, per row, the block sizes
// the call chose and where they came from (tune::ChoiceRecorder).
nlohmann::json machine_json();
std::map<std::string, std::string> tessera_env();
std::string tessera_env_line();  // "TESSERA_A=1 TESSERA_B=x", sorted; "" when none

// Fills the rate and roofline fields of `row` for a timing with cost `c`. The roof is physical
// (DeviceCeilings::peak_line: the FMA peak for f32/f16, the bf16 dot-product peak for bf16
// where measured; roofline_line names it); gemm_line_gflops / gemm_line_fraction are the same
// against the BLAS GEMM line (the practical one). A fraction above 1 marks the row "stale
// ceilings" (roofline_note says how to re-measure) instead of reporting it.
void fill_rates(Row& row, const Timing& t, const Cost& c, const std::string& device,
                const std::string& dtype, const Roofline* roofline);

}  // namespace tessera::harness
