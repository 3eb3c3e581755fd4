// Tessera internal: the contract between the attention API and its implementations.
//
// api.cc validates the user's views and normalizes the dense and varlen forms into one Problem:
// N sequences, each a range of q rows and a range of k rows of row-major [rows, H, D] arrays,
// plus resolved options (scale, masks). Every implementation receives exactly the same Problem
// and must give the same results (docs/kernels/attention.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/sized_implementation.h"
#include "dispatch/tensor_rules.h"
#include "primitives/philox.h"
#include "tessera/attention.h"
#include "tune/fwd.h"

namespace tessera::attention {

using dispatch::Availability;

struct Problem {
  int64_t N = 0;            // sequences (B in the dense form)
  bool varlen = false;
  int64_t Sq = 0, Sk = 0;   // dense: every sequence's lengths; varlen: the longest
  const int32_t* cu_q = nullptr;  // varlen: [N+1] row offsets (host memory, also for device inputs)
  const int32_t* cu_k = nullptr;
  int64_t total_q = 0, total_k = 0;  // rows of q (and o), rows of k and v
  int64_t Hq = 1, Hkv = 1, D = 1, Dv = 1;
  DType dtype = DType::kF32;  // of q, k, v
  Device device;

  const void* q = nullptr;  // [total_q, Hq, D]
  const void* k = nullptr;  // [total_k, Hkv, D]
  const void* v = nullptr;  // [total_k, Hkv, Dv]
  const float* alibi = nullptr;      // slopes, or nullptr
  int64_t alibi_seq_stride = 0;      // 0 ([Hq]) or Hq ([N, Hq])
  const int32_t* seg_q = nullptr;    // [total_q] (dense only), or nullptr
  const int32_t* seg_k = nullptr;    // [total_k]

  double scale = 1.0;
  double softcap = 0.0;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  bool deterministic = true;  // backward (Options::deterministic)
  // Dropout (Options::dropout_p, 0 = none): the Philox key, i32 [2] in the inputs' memory (host
  // or device), and the keep threshold of primitives/philox.h.
  double dropout_p = 0.0;
  const int32_t* dropout_seed = nullptr;
  uint32_t dropout_threshold = 0;
  // Additive bias (dense form), in the inputs' memory: element (n, h, i, j) at
  // n·bias_stride[0] + h·bias_stride[1] + i·bias_stride[2] + j·bias_stride[3] (0 on a broadcast
  // dim); bias_shape is the tensor's [B|1, Hq|1, Sq|1, Sk|1].
  const void* bias = nullptr;
  DType bias_dtype = DType::kF32;
  int64_t bias_shape[4] = {1, 1, 1, 1};
  int64_t bias_stride[4] = {0, 0, 0, 0};

  int num_threads = 1;  // resolved by the API: >= 1
  void* stream = nullptr;
  size_t memory_budget = 0;

  int64_t group() const { return Hq / Hkv; }
  int64_t q_begin(int64_t n) const { return varlen ? cu_q[n] : n * Sq; }
  int64_t k_begin(int64_t n) const { return varlen ? cu_k[n] : n * Sk; }
  int64_t q_len(int64_t n) const { return varlen ? cu_q[n + 1] - cu_q[n] : Sq; }
  int64_t k_len(int64_t n) const { return varlen ? cu_k[n + 1] - cu_k[n] : Sk; }
  // lse index of (sequence n, query head h, row i of the sequence): dense [B, Hq, Sq],
  // varlen [Hq, Tq].
  int64_t lse_index(int64_t n, int64_t h, int64_t i) const {
    return varlen ? h * total_q + cu_q[n] + i : (n * Hq + h) * Sq + i;
  }
  float slope(int64_t n, int64_t h) const { return alibi ? alibi[n * alibi_seq_stride + h] : 0.0f; }
  bool dropout() const { return dropout_p > 0.0; }
  // Offset of bias element (sequence n, query head h, row i, key j); bias_at reads it (host memory).
  int64_t bias_offset(int64_t n, int64_t h, int64_t i, int64_t j) const {
    return n * bias_stride[0] + h * bias_stride[1] + i * bias_stride[2] + j * bias_stride[3];
  }
  int64_t bias_numel() const { return bias_shape[0] * bias_shape[1] * bias_shape[2] * bias_shape[3]; }
  float bias_at(int64_t n, int64_t h, int64_t i, int64_t j) const {
    return load_as_f32(bias, bias_dtype, bias_offset(n, h, i, j));
  }
  // Whether dropout keeps the probability of (sequence n, query head h, row i, key j); host
  // memory only (the CUDA kernels evaluate the same rule on the device).
  bool dropout_keep(int64_t n, int64_t h, int64_t i, int64_t j) const {
    return primitives::philox::dropout_keep(static_cast<uint32_t>(dropout_seed[0]), static_cast<uint32_t>(dropout_seed[1]),
                                            dropout_threshold, static_cast<uint32_t>(n), static_cast<uint32_t>(h),
                                            static_cast<uint32_t>(i), static_cast<uint32_t>(j));
  }

  // Keys [*lo, *hi) of sequence n that row i may see by position (causal, window); segment ids
  // are not included (allowed() is the full rule). Empty when *lo >= *hi.
  void key_range(int64_t n, int64_t i, int64_t* lo, int64_t* hi) const {
    const int64_t sk = k_len(n), c = i + sk - q_len(n);
    int64_t a = 0, b = sk;
    if (window_left >= 0) a = std::max(a, c - window_left);
    if (causal) b = std::min(b, c + 1);
    if (window_right >= 0) b = std::min(b, c + window_right + 1);
    *lo = a;
    *hi = std::max(a, b);
  }
  bool allowed(int64_t n, int64_t i, int64_t j) const {
    int64_t lo, hi;
    key_range(n, i, &lo, &hi);
    if (j < lo || j >= hi) return false;
    return !seg_q || seg_q[q_begin(n) + i] == seg_k[k_begin(n) + j];
  }
};

struct ForwardOut {
  void* o = nullptr;  // [total_q, Hq, Dv]
  DType o_dtype = DType::kF32;
  float* lse = nullptr;  // see Problem::lse_index
};

struct BackwardIn {
  const void* o = nullptr;  // the forward's output
  DType o_dtype = DType::kF32;
  const float* lse = nullptr;
  const void* grad_o = nullptr;  // [total_q, Hq, Dv]
  DType grad_o_dtype = DType::kF32;
};

struct GradOut {
  void* dq = nullptr;  // like q
  DType dq_dtype = DType::kF32;
  void* dk = nullptr;  // like k
  DType dk_dtype = DType::kF32;
  void* dv = nullptr;  // like v
  DType dv_dtype = DType::kF32;
  void* dbias = nullptr;  // Problem::bias_shape, contiguous; nullptr: not asked for
  DType dbias_dtype = DType::kF32;
};

// name, description, device type, availability and version status come from the generic base;
// supports, block sizes, device kind and synchronize from dispatch/sized_implementation.h.
class Implementation : public dispatch::SizedImplementation<Problem, BlockSizes> {
 public:
  virtual void forward(const Problem& p, const BlockSizes& bs, const ForwardOut& out) const = 0;
  virtual void backward(const Problem& p, const BlockSizes& bs, const BackwardIn& in,
                        const GradOut& out) const = 0;
};

// The inputs bound to their form's rules (api.cc; dims named as in tessera/attention.h, varlen
// Tq, Tk and N+1); o's and lse's dims in that form.
dispatch::Dims bind_tensors(const Inputs& in, dispatch::BindMode mode);
inline const char* o_dims(bool varlen) { return varlen ? "Tq,Hq,Dv" : "B,Sq,Hq,Dv"; }
inline const char* lse_dims(bool varlen) { return varlen ? "Hq,Tq" : "B,Hq,Sq"; }

// The registry of this kernel, in default dispatch order (implementations.cc).
using Registry = dispatch::Registry<Implementation>;
Registry& registry();
const Implementation* find_implementation(const std::string& name);  // nullptr if unknown

// The block sizes' tuning (tuning.cc) and its checked-in table (tuned_table.cc, generated); the
// sizes a call runs with, never larger than its lengths (rounded up to 16) nor below 1.
const tune::Declared& tuning();
const std::vector<tune::TableEntry>& tuned_table();
BlockSizes sanitize_for_shape(const BlockSizes& bs, const Problem& p);
// What else than the dims (B, S, H, D) sets the best tiles, for the autotune key: the exact
// lengths, heads and head dims, varlen, causal, window, softcap, ALiBi, segments.
std::string autotune_variant(const Problem& p);

std::unique_ptr<Implementation> make_reference_implementation();  // reference.cc
// Optimized CPU backend (cpu.cc); built when TESSERA_CPU_BACKEND is on.
std::unique_ptr<Implementation> make_cpu_implementation();
// CUDA backend (cuda.cu), in the CUDA module: registered by the module when it is loaded.
std::unique_ptr<Implementation> make_cuda_implementation();

}  // namespace tessera::attention
