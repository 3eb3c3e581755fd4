// Tessera internal (tuning): the one block-size choice every kernel's API makes before a call.
//
// In order:
//  1. explicit sizes from the caller's options: validated, used as given (never changed);
//  2. (tunable implementations) the tuned table row for (implementation, device kind, dtype,
//     bucket), fitted to the shape and validated (unless TESSERA_TUNED_TABLE=0);
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
  std::string source;  // "options", "tuned table", "autotune cache", "autotune", "default"
};

Choice choose(const ChoiceRequest& req);

// The on-miss time budget: TESSERA_AUTOTUNE_BUDGET_MS (default 2000 ms) of measured run time.
double autotune_budget_seconds();

}  // namespace tessera::tune
