// Tessera internal (tuning): the one block-size choice every kernel's API makes before a call.
//
// In order:
//  1. explicit sizes from the caller's options: validated, used as given (never changed);
//  2. (tunable implementations) the tuned table row for (implementation, device kind, dtype,
//     bucket), fitted to the shape and validated (unless TESSERA_TUNED_TABLE=0); a row under the
//     pre-microarch CPU key only where legacy_cpu_device_kind (device_kind.h) allows it;
//  3. autotune-on-miss (enabled, problem big enough): the disk cache, else a timed sweep that
//     is then cached. If every candidate fails, throws Error(kUnsupported) so that dispatch
//     falls back to the next implementation;
//  4. the implementation's defaults.
// Kernel-agnostic: a kernel fills a ChoiceRequest (its adapter) with its sizes as tune::Params.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tune/bucket.h"
#include "tune/params.h"
#include "tune/sweep.h"
#include "tune/table.h"

namespace tessera::tune {

struct ChoiceRequest {
  std::string kernel;          // "linear_cross_entropy"
  std::string implementation;  // "cpu"
  std::string what;            // for logs: "linear_cross_entropy cpu f32 fused B=..,H=..,V=.."
  std::optional<Params> explicit_sizes;
  Params defaults;
  bool tunable = false;
  // Throws Error(kInvalidArgument) naming the broken constraint.
  std::function<void(const Params&)> validate;
  // Fits tuned sizes to the actual shape (may return them unchanged).
  std::function<Params(const Params&)> fit_to_shape;
  // Table lookup.
  const std::vector<TableEntry>* table = nullptr;
  std::string device_kind, dtype;
  const Bucket* bucket = nullptr;
  // Autotune on miss.
  bool autotune = false;            // enabled by options and TESSERA_AUTOTUNE
  bool worth_autotuning = false;    // big enough that sizes matter
  std::string cache_key;
  std::string cache_dir;            // "" = default_cache_dir()
  std::function<std::vector<Params>()> candidates;  // the default first
  std::function<Runner()> make_run;  // allocates scratch; times one call (and its outputs)
};

struct Choice {
  Params params;
  // "options" (the caller's), "tuned table", "tuned table (legacy key)", "autotune cache",
  // "autotune", "default"
  std::string source;
};

Choice choose(const ChoiceRequest& req);

// Provenance for results (the bench records which block sizes a call used and why): while a
// ChoiceRecorder is alive, every choose() on the same thread appends what it chose (distinct
// records only). Recorders nest; the innermost one records. Costs nothing when none is alive.
struct ChoiceRecord {
  std::string kernel, implementation, device_kind, dtype, bucket;
  Params params;
  std::string source;
  bool operator==(const ChoiceRecord&) const = default;
};
class ChoiceRecorder {
 public:
  ChoiceRecorder();
  ~ChoiceRecorder();
  ChoiceRecorder(const ChoiceRecorder&) = delete;
  ChoiceRecorder& operator=(const ChoiceRecorder&) = delete;
  const std::vector<ChoiceRecord>& records() const { return records_; }
  void add(ChoiceRecord r);

 private:
  std::vector<ChoiceRecord> records_;
  ChoiceRecorder* outer_ = nullptr;
};

// The on-miss time budget: TESSERA_AUTOTUNE_BUDGET_MS (default 2000 ms) of measured run time.
double autotune_budget_seconds();

}  // namespace tessera::tune
