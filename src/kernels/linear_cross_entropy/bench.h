// linear_cross_entropy: its benchmark problem for the generic bench driver (harness/bench.h).
//
// Inputs: x, w uniform (w scaled by 3/√H so logits have unit variance), labels uniform in
// [0, V), optional bias; no weights, mean reduction, no smoothing / z-loss (the options the
// materialized baseline shares). Calls go through the public API with
// ExecOptions::implementation = the row's name, so every registered implementation is timed
// the same way. The floor is the plain GEMM x·W of the same shape (1 per forward, 2 per
// backward, 3 fused); the baseline is the BLAS-materialized loss (baseline.h).
#pragma once

#include <memory>
#include <vector>

#include "harness/bench.h"
#include "harness/options.h"
#include "harness/grid.h"

namespace tessera::linear_cross_entropy {

// The kernel's bench flags: --layout hv|vh, --bias, --soft-cap F.
std::vector<harness::OptionSpec> bench_options();
std::unique_ptr<harness::BenchProblem> make_bench_problem(const harness::GridShape& shape, DType dtype,
                                                          const harness::OptionValues& options,
                                                          uint64_t seed, bool with_data = true);
// The same problem without inputs (cost model only: `tessera bench --predict`).
std::unique_ptr<harness::BenchProblem> make_bench_cost_model(const harness::GridShape& shape, DType dtype,
                                                             const harness::OptionValues& options);

}  // namespace tessera::linear_cross_entropy
