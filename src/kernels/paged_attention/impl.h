// Tessera internal: the contract between the paged_attention API and its implementations.
//
// api.cc validates the user's views (page ids, lengths, offsets: every one, before anything runs)
// and hands every implementation the same Problem: flat sizes, raw pointers and the resolved options.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "dispatch/registry.h"
#include "dispatch/tensor_rules.h"
#include "tessera/paged_attention.h"

namespace tessera::paged_attention {

using dispatch::Availability;

struct Problem {
  int64_t N = 0, T = 0;                     // sequences, query rows
  int64_t Hq = 1, Hkv = 1, D = 1, Dv = 1;
  int64_t P = 0, page_size = 1, max_pages = 0;
  DType dtype = DType::kF32;                // of q (and o unless o_f32)
  DType cache_dtype = DType::kF32;          // of k_cache and v_cache: dtype, or kF8E4M3
  bool o_f32 = false;                       // o stored as f32 (else in dtype)
  Device device;

  const void* q = nullptr;        // [T, Hq, D]
  const void* k = nullptr;        // [P, page_size, Hkv, D]
  const void* v = nullptr;        // [P, page_size, Hkv, Dv]
  const int32_t* page_table = nullptr;  // [N, max_pages] (host)
  const int32_t* kv_lens = nullptr;     // [N] (host)
  const int32_t* cu_q = nullptr;        // [N+1] (host)
  const float* sinks = nullptr;         // [Hq] or nullptr (q's device)
  void* o = nullptr;              // [T, Hq, Dv]
  float* lse = nullptr;           // [T, Hq]

  double scale = 1.0;     // the softmax scale times Options::k_scale (k_scale folded in here)
  double v_scale = 1.0;   // o = v_scale · Σ p·v_cache: applied with the softmax's 1/l
  double softcap = 0.0;
  bool causal = false;
  int64_t window = -1;

  int num_threads = 1;
  void* stream = nullptr;

  int64_t group() const { return Hq / Hkv; }
  int64_t q_len(int64_t s) const { return cu_q[s + 1] - cu_q[s]; }
  int64_t kv_len(int64_t s) const { return kv_lens[s]; }
  // The cache row (page · page_size + slot) of key position j of sequence s.
  int64_t cache_row(int64_t s, int64_t j) const {
    return static_cast<int64_t>(page_table[s * max_pages + j / page_size]) * page_size + j % page_size;
  }
  // The visible key positions [lo, hi) of the query at position pos of sequence s.
  int64_t key_lo(int64_t pos) const { return window >= 0 ? std::max<int64_t>(0, pos - window) : 0; }
  int64_t key_hi(int64_t s, int64_t pos) const { return causal ? std::min<int64_t>(kv_len(s), pos + 1) : kv_len(s); }
};

class Implementation : public dispatch::ImplementationBase {
 public:
  virtual Availability supports(const Problem& p) const = 0;
  virtual void forward(const Problem& p) const = 0;
};

using Registry = dispatch::Registry<Implementation>;
Registry& registry();

// q, k_cache, v_cache and sinks bound to their declared dims (api.cc): the API's checks and the
// call's output shapes (spec.cc) come from this one declaration.
dispatch::Dims bind_tensors(const Inputs& in, dispatch::BindMode mode);

std::unique_ptr<Implementation> make_reference_implementation();
std::unique_ptr<Implementation> make_cpu_implementation();
std::unique_ptr<Implementation> make_cuda_implementation();
std::unique_ptr<Implementation> make_cuda_v2_implementation();

}  // namespace tessera::paged_attention
