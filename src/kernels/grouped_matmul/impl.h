// Tessera internal: the contract between the grouped_matmul API and its implementations.
//
// api.cc validates the user's views and normalizes them into one Problem: flat sizes, the row
// ranges of the local groups, resolved options. Implementations compute two operations on it:
//   gmm   c[M, N]      = rows of group g of a[M, K] times b[g] ([K, N], or [N, K] transposed);
//                        rows outside every local group are zero
//   tgmm  c[g] [K, N]  = a[rows of g]ᵀ · d[rows of g] ([N, K] when transpose_rhs); zero for an
//                        empty group
// The backward's dlhs is a gmm with K and N swapped and transpose_rhs flipped (api.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/registry.h"
#include "dispatch/tensor_rules.h"
#include "tessera/grouped_matmul.h"
#include "tune/fwd.h"

namespace tessera::grouped_matmul {

using dispatch::Availability;

struct Problem {
  int64_t M = 0, K = 0, N = 0;  // a [M, K]; gmm: c [M, N]; tgmm: d [M, N], c [G, K, N]
  int64_t G = 0;                // local groups (rhs.shape[0])
  std::vector<int64_t> begin;   // G + 1 absolute row offsets: group g is rows [begin[g], begin[g+1])
  bool transpose_rhs = false;   // b / c per group stored [N, K] instead of [K, N]
  DType dtype = DType::kF32;    // of a, b, d
  Device device;

  int num_threads = 1;  // resolved by the API: >= 1
  void* stream = nullptr;
  size_t memory_budget = 0;

  int64_t rows(int64_t g) const { return begin[g + 1] - begin[g]; }
  int64_t row_lo() const { return begin.front(); }  // rows outside [row_lo, row_hi) are zero
  int64_t row_hi() const { return begin.back(); }
  // Element offset of (k, n) in group g's [K, N] (or [N, K]) matrix.
  int64_t b_index(int64_t g, int64_t k, int64_t n) const {
    return g * K * N + (transpose_rhs ? n * K + k : k * N + n);
  }
};

struct GmmArgs {
  const void* a = nullptr;  // [M, K], Problem::dtype
  const void* b = nullptr;  // [G, K, N] or [G, N, K], Problem::dtype
  void* c = nullptr;        // [M, N]
  DType c_dtype = DType::kF32;
};

struct TgmmArgs {
  const void* a = nullptr;  // [M, K], Problem::dtype
  const void* d = nullptr;  // [M, N], Problem::dtype
  void* c = nullptr;        // [G, K, N] or [G, N, K]
  DType c_dtype = DType::kF32;
};

// name, description, device type, availability and version status come from the generic base.
class Implementation : public dispatch::ImplementationBase {
 public:
  virtual Availability supports(const Problem& p) const = 0;  // cheap: device, dtypes, dims
  // Throws Error(kInvalidArgument) naming the broken constraint.
  virtual void validate_block_sizes(const BlockSizes& bs) const = 0;
  virtual void gmm(const Problem& p, const BlockSizes& bs, const GmmArgs& args) const = 0;
  virtual void tgmm(const Problem& p, const BlockSizes& bs, const TgmmArgs& args) const = 0;
};

// The registry of this kernel, in default dispatch order (implementations.cc).
using Registry = dispatch::Registry<Implementation>;
Registry& registry();
const Implementation* find_implementation(const std::string& name);  // nullptr if unknown

// The block sizes' tuning (tuning.cc) and its checked-in table (tuned_table.cc, generated).
const tune::Declared& tuning();
const std::vector<tune::TableEntry>& tuned_table();

// lhs and rhs bound to their declared dims M, K, N, G (api.cc): the API's checks and the call's
// output shapes (spec.cc) come from this one declaration.
dispatch::Dims bind_tensors(const Inputs& in, const Options& opt, dispatch::BindMode mode);

std::unique_ptr<Implementation> make_reference_implementation();  // reference.cc
// Optimized CPU backend (cpu.cc); built when TESSERA_CPU_BACKEND is on.
std::unique_ptr<Implementation> make_cpu_implementation();
// CUDA backend (cuda.cu, in the CUDA device module): registered by the module when it loads.
std::unique_ptr<Implementation> make_cuda_implementation();

}  // namespace tessera::grouped_matmul
