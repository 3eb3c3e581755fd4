// paged_attention: deterministic test cases, the built-in check grid, and parity of an
// implementation against the reference — shared by the GoogleTest suites and `tessera check`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/parity.h"
#include "tessera/paged_attention.h"

namespace tessera::paged_attention::testing {

struct CaseSpec {
  std::string label = "case";
  std::vector<int64_t> q_lens{1, 3}, kv_lens{5, 9};  // per sequence (q_len ≤ kv_len)
  int64_t Hq = 4, Hkv = 2, D = 16, Dv = 16, page_size = 4;
  DType dtype = DType::kF32;  // q and the caches
  bool f8_cache = false;      // the caches in f8e4m3 instead, raw values up to 1/k_scale and 1/v_scale
  double k_scale = 1.0, v_scale = 1.0;
  bool f32_out = false;       // o stored as f32, else in dtype
  bool causal = true;
  int64_t window = -1;
  double softcap = 0.0;
  std::optional<double> scale;
  bool sinks = false;
  bool shared_pages = false;  // every sequence's full pages before its last start with sequence 0's
  int64_t spare_pages = 3;    // pages nobody references (NaN-filled)
  int num_threads = 0;
  uint64_t seed = 1;
  std::string name() const;
};

// Host tensors. Page ids are a shuffled permutation; every cache slot no sequence reads, every
// spare page and every page-table entry past a sequence's pages hold NaN (or −7 for the ids), so
// that a read outside the contract shows.
struct CaseData {
  Tensor q, k_cache, v_cache, page_table, kv_lens, cu_q_lens, sinks;
  Inputs inputs() const;
};
CaseData make_case(const CaseSpec& spec);
Options options_of(const CaseSpec& spec);
harness::Tolerance o_tolerance(const CaseSpec& spec);
harness::Tolerance lse_tolerance(const CaseSpec& spec);

// Runs `implementation` (inputs on `device`, the index arrays in host memory) and the reference
// on the same case and compares o and lse. Never throws for an implementation's failure.
harness::ParityReport check_parity(const CaseSpec& spec, const std::string& implementation, Device device = Device{});

// Decode-only, prefill-only and mixed batches; q_len 0; kv_len not a multiple of page_size;
// shared and shuffled pages; NaN in unused slots; page_size 1 and 128; GQA/MQA/MHA; causal with
// and without window; softcap; sinks; every dtype; Dv ≠ D; long contexts (32k) on two rows.
std::vector<CaseSpec> check_grid(bool quick);

}  // namespace tessera::paged_attention::testing
