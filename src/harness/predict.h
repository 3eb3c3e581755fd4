// Tessera harness: what the cost model and the stored ceilings predict for a benchmark, without
// running it (`tessera bench KERNEL --predict`; generic).
//
// For each case × implementation × pass of a BenchConfig, the problem is built through
// BenchCase::make_cost_model (no inputs allocated when the kernel provides one) and its Cost is
// set against the ceilings of the implementation's device (harness/roofline.h):
//
//   compute_ms = flops_issued / peak GEMM rate of the row's dtype
//   memory_ms  = bytes (the cost model's minimum traffic) / bandwidth
//   predicted_ms = max(compute_ms, memory_ms)         "bound": whichever is larger
//
// the roofline's lower bound on the time of the work the implementation declares it issues
// (recomputation included). With no ceilings for the device the times are null and the row says
// why. One "gemm" row per case predicts the plain GEMM floor the same way.
#pragma once

#include <string>
#include <vector>

#include "harness/bench.h"
#include "harness/roofline.h"
#include "harness/table.h"

namespace tessera::harness {

// Rows of kind "prediction": the generic leading fields and dims of run_bench's rows, the cost
// (gflop_useful, gflop_issued, mbytes_min, transcendentals, ai), the ceilings used (peak_gflops,
// bandwidth_gbs), compute_ms, memory_ms, predicted_ms, bound, and roofline_note / note. Cases
// whose problem cannot be built are reported in `messages` and skipped.
std::vector<Row> predict(const BenchConfig& cfg, const Roofline* roofline, std::vector<std::string>* messages);

// Fills the prediction fields of `row` for cost `c` on `device` (exposed for tests).
void fill_prediction(Row& row, const Cost& c, const std::string& device, const std::string& dtype,
                     const Roofline* roofline);

}  // namespace tessera::harness
