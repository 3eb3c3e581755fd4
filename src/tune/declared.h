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
#include <string>
#include <vector>

#include "tessera/exec.h"
#include "tessera/tensor.h"
#include "tune/bucket.h"
#include "tune/choose.h"
#include "tune/params.h"
#include "tune/sweep.h"
#include "tune/table.h"

namespace tessera::tune {

struct Declared {
  std::string kernel;                        // "mlstm"
  std::vector<std::string> options;          // the tuned call options, each an int: 0 = choose
  std::vector<Bucket> buckets;               // over every dim of the kernel, in its dims order
  std::vector<std::string> implementations;  // the tunable ones ("cpu"); others get the default
  // The candidates for a shape (the kernel's dims, in order), the default first. Each names
  // every tuned option.
  std::function<std::vector<Params>(const std::vector<int64_t>& dims)> candidates;
  // Multiply-adds of one call at this shape: autotune-on-miss runs only from min_work on.
  std::function<double(const std::vector<int64_t>& dims)> work;
  double min_work = double(int64_t{1} << 30);
  const std::vector<TableEntry>& (*table)() = nullptr;  // the checked-in tuned table
  // Where the table lives, for `tessera tune --emit-table`.
  std::string table_include, table_namespace, table_path;

  bool tunable(const std::string& implementation) const;
};

// One call, as the kernel's API sees it after validation.
struct DeclaredCall {
  std::string implementation;  // the implementation about to run
  DeviceType device = DeviceType::kCPU;
  DType dtype = DType::kF32;
  std::vector<int64_t> dims;   // the kernel's dims, in order
  Pass pass = Pass::kForward;
  int threads = 1;             // CPU: part of the cache key
  Params given;                // the call's options by name (0: choose)
  bool autotune_on_miss = true;
};

// The tuned options for `call`: every option the call gave (> 0) is kept; when all are 0, the
// choice of choose.h (tuned table, autotune-on-miss timing `run_once(candidate)` — one run of the
// call with those options into its own outputs —, the default). `run_once` may be empty (no
// autotune). Mixed given / 0 options take the default for the zeros.
Choice choose_declared(const Declared& d, const DeclaredCall& call, const std::function<void(const Params&)>& run_once);

// The cache key: kernel, implementation, device kind, dtype, exact dims, pass, threads, version.
std::string declared_key(const Declared& d, const DeclaredCall& call, const std::string& device_kind);

}  // namespace tessera::tune
