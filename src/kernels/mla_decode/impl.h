// Tessera internal: the contract between the mla_decode API and its implementations.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "dispatch/registry.h"
#include "dispatch/tensor_rules.h"
#include "tessera/mla_decode.h"
#include "tune/fwd.h"

namespace tessera::mla_decode {

using dispatch::Availability;

// A validated call: sizes, raw pointers (contiguous row-major), resolved options.
struct Problem {
  int64_t B = 0, Sq = 0, Hq = 0, D = 0, Dv = 0;
  int64_t P = 0, page_size = 0, max_pages = 0;
  DType dtype = DType::kF32;    // q
  DType cache_dtype = DType::kF32;  // kv_cache: dtype, or kF8E4M3
  DType o_dtype = DType::kF32;  // f32 or dtype
  Device device;
  const void* q = nullptr;         // [B, Sq, Hq, D]
  const void* kv = nullptr;        // [P, page_size, D]
  const int32_t* page_table = nullptr;  // [B, max_pages], host, every used entry in [0, P)
  const int32_t* seqlens = nullptr;     // [B], host, 0 ≤ L_b ≤ max_pages·page_size
  void* o = nullptr;               // [B, Sq, Hq, Dv]
  float* lse = nullptr;            // [B, Sq, Hq]
  double scale = 1.0;    // the softmax scale times Options::kv_scale (the keys' dequantization folded in)
  double v_scale = 1.0;  // Options::kv_scale: o = v_scale · Σ p·kv_cache[:Dv], applied with 1/l
  bool causal = false;
  std::optional<BlockSizes> block_sizes;
  int num_threads = 1;
  void* stream = nullptr;  // CUDA: cudaStream_t (nullptr: the default stream)

  int64_t rows() const { return Sq * Hq; }  // query rows per batch entry
  // Keys query row i of batch b sees: [0, visible(b, i)).
  int64_t visible(int64_t b, int64_t i) const {
    const int64_t L = seqlens[b];
    if (!causal) return L;
    const int64_t v = L - Sq + i + 1;
    return v < 0 ? 0 : v;
  }
  // The cached entry of key position j of batch b (D elements).
  int64_t entry(int64_t b, int64_t j) const {
    return (static_cast<int64_t>(page_table[b * max_pages + j / page_size]) * page_size + j % page_size) * D;
  }
};

class Implementation : public dispatch::ImplementationBase {
 public:
  virtual Availability supports(const Problem& p) const = 0;
  virtual void forward(const Problem& p) const = 0;
};

using Registry = dispatch::Registry<Implementation>;
Registry& registry();

// q, kv_cache, page_table and cache_seqlens bound to their declared dims, with dv checked as Dv
// (api.cc): the API's checks and the call's output shapes (spec.cc) come from this one declaration.
dispatch::Dims bind_tensors(const Inputs& in, int64_t dv, dispatch::BindMode mode);

// The split length's tuning (tuning.cc) and its checked-in table (tuned_table.cc, generated).
const tune::Declared& tuning();
const std::vector<tune::TableEntry>& tuned_table();

std::unique_ptr<Implementation> make_reference_implementation();
std::unique_ptr<Implementation> make_cpu_implementation();
std::unique_ptr<Implementation> make_cuda_implementation();  // in the CUDA module
std::unique_ptr<Implementation> make_cuda_v2_implementation();  // in the CUDA module

}  // namespace tessera::mla_decode
