// Tessera: the execution vocabulary shared by every kernel.
//
// Each kernel's Options derives from ExecOptions, so "which implementation, how many threads,
// which stream, how much scratch" is said the same way for every kernel, and generic code (the
// CLI, the bench driver, the Python bindings) can set it without knowing the kernel.
// Pass names what a call computes; the CLI's --pass flag and every report use these names.
#pragma once

#include <cstddef>
#include <string>

#include "tessera/tensor.h"

namespace tessera {

// What a call computes: the forward pass, the backward pass (gradients, given the upstream
// gradient), or both in one fused call (training).
enum class Pass : unsigned char { kForward, kBackward, kFused };
const char* pass_name(Pass p) noexcept;       // "forward", "backward", "fused"
Pass parse_pass(const std::string& s);        // throws Error(kInvalidArgument) naming the choices

struct ExecOptions {
  // "" : default order (TESSERA_IMPLEMENTATION overrides it), "cpu": that one or fail,
  // "cuda,cpu": try in order, warning on each fallback. A name that is not registered is an
  // error, never a fallback.
  std::string implementation;
  int num_threads = 0;           // CPU backends: 0 = resolve_num_threads(0, the call's work)
  bool autotune_on_miss = true;  // also disabled by TESSERA_AUTOTUNE=0
  void* stream = nullptr;        // CUDA backends: cudaStream_t; nullptr = default stream
  // Bytes of extra memory (device or host scratch) a backend may use; 0 = its default (cuda
  // backends: their documented default budget; host backends: no limit). The kernel's doc says
  // what each backend does under it (linear_cross_entropy cpu: a 16-bit dw's gradients in
  // vocabulary slices instead of a w-sized f32 accumulator).
  size_t memory_budget = 0;
  // Reject NaN/Inf in the floating-point inputs before running (host data only). Off by
  // default: a scan of every input on every call is a cost no peer library charges a
  // training loop; the CLI's `run` turns it on for users' files.
  bool check_finite = false;
};

// Versions of an implementation live side by side (cpu, cpu_v2, ...): only `current` ones are
// in the default dispatch order; experimental and retired ones run when named.
enum class VersionStatus : unsigned char { kCurrent, kExperimental, kRetired };
const char* version_status_name(VersionStatus s) noexcept;  // "current", "experimental", "retired"

// What a kernel's registry says about one implementation (tessera list, Python, reports).
struct ImplementationInfo {
  std::string name;
  std::string description;
  DeviceType device = DeviceType::kCPU;  // where its inputs and outputs live
  bool available = false;                // can run on this machine / build at all
  std::string unavailable_reason;
  VersionStatus status = VersionStatus::kCurrent;
  std::string what_changed;              // versions: one line on what this version changes
};

// The one default-thread-count rule: `requested` if > 0, else $TESSERA_NUM_THREADS if > 0,
// else the number of hardware threads (at least 1); never more than 1024 (a CPU backend keeps
// per-thread state: src/core/exec.cc).
int resolve_num_threads(int requested) noexcept;
// The same for a call whose work is known (`work`: its flops, an estimate): a count the caller
// asked for (`requested` or $TESSERA_NUM_THREADS) as given; else no more threads than one per
// kMinWorkPerThread flops (at least 1). Waking a parked helper costs more than a tiny call's
// share of the work: on a 2-core Zen 4 VM a helper's first work item started 14-23 µs into the
// call, and a 1×16×4×8 attention forward took 27 µs on 2 threads, 19 µs on 1.
inline constexpr double kMinWorkPerThread = 4e6;
int resolve_num_threads(int requested, double work) noexcept;

}  // namespace tessera
