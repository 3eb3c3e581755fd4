// grouped_matmul: deterministic test cases, the built-in check grid, and parity of an
// implementation against the reference — shared by the GoogleTest suites and `tessera check`, so
// that all judge with the same cases and the same tolerances.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/parity.h"
#include "tessera/grouped_matmul.h"

namespace tessera::grouped_matmul::testing {

struct CaseSpec {
  std::string label = "case";
  int64_t M = 24, K = 16, N = 12;
  std::vector<int64_t> sizes{10, 0, 9};  // group_sizes (all groups; Σ may be < M)
  std::optional<int64_t> offset;         // expert parallelism: rhs holds groups [offset, offset + G_local)
  int64_t local_groups = -1;             // G_local with an offset (-1: every group)
  bool transpose_rhs = false;
  DType dtype = DType::kF32;             // lhs, rhs, dout
  bool f32_outputs = false;              // out, dlhs, drhs stored as f32, else in the input dtype
  DType sizes_dtype = DType::kI32;
  Options opt;                           // block sizes, threads, ...
  uint64_t seed = 1;
  int64_t G_local() const;
  std::string name() const;              // label plus shape, dtype and options
};

// Inputs made from a CaseSpec (host memory), rounded to the case's dtype when generated so that
// every implementation sees the very same numbers.
struct CaseData {
  Tensor lhs, rhs, group_sizes, dout;
  Inputs inputs() const { return {lhs.view(), rhs.view(), group_sizes.view()}; }
};
CaseData make_case(const CaseSpec& spec);
Options options_of(const CaseSpec& spec);  // spec.opt plus transpose_rhs and group_offset

// Tolerance of every output (justified in testing.cc).
harness::Tolerance tolerance(const CaseSpec& spec);

// Runs `implementation` and the reference on the same case for `pass` (forward: out; backward:
// dlhs, drhs; fused: all three) and compares every output. Never throws for an implementation's
// failure: it is reported.
// `device`: where the implementation's inputs and outputs live (group sizes stay in host
// memory); the reference always runs on host copies.
harness::ParityReport check_parity(const CaseSpec& spec, const std::string& implementation, Pass pass,
                                   Device device = Device{});

// The built-in grid: even, ragged, empty groups, all empty, one group, rows past the sum,
// transpose_rhs, many tiny groups, the group offset, every dtype, f32 outputs, tail tiles.
// `quick` keeps one dtype sweep small.
std::vector<CaseSpec> check_grid(bool quick);

}  // namespace tessera::grouped_matmul::testing
