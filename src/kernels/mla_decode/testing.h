// mla_decode: deterministic cases, the check grid and parity of an implementation against the
// reference (shared by the GoogleTest suites, the generic parity suite and `tessera check`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/parity.h"
#include "tessera/mla_decode.h"

namespace tessera::mla_decode::testing {

struct CaseSpec {
  int64_t Sq = 1, Hq = 16, D = 64, Dv = 32, page_size = 16;
  std::vector<int64_t> seqlens = {5, 40};  // one per batch entry: B = seqlens.size()
  DType dtype = DType::kF32;
  bool f8_cache = false;  // the cache in f8e4m3, raw values up to 1/opt.kv_scale (else in dtype)
  bool o_f32 = true;      // o stored as f32, else in q's dtype
  bool shuffle = true;    // physical pages in a random order
  bool shared = false;    // every entry's first pages are entry 0's (prefix sharing)
  Options opt;            // causal, scale, block sizes (dv is set from Dv)
  uint64_t seed = 1;
  int64_t B() const { return static_cast<int64_t>(seqlens.size()); }
  std::string name() const;
};

// q, kv_cache, page_table, cache_seqlens (host). Every cache slot no entry reads is NaN, and
// the page-table entries past an entry's pages are −1: an implementation that reads them shows.
struct CaseData {
  Tensor q, kv, page_table, seqlens;
  Inputs inputs() const;
};
CaseData make_case(const CaseSpec& s);

harness::Tolerance o_tolerance(const CaseSpec& s);
harness::Tolerance lse_tolerance();

// o and lse of `implementation` (on `device`, results copied back) against the reference.
harness::ParityReport check_parity(const CaseSpec& s, const std::string& implementation, Device device = Device::cpu());

std::vector<CaseSpec> check_grid(bool quick);

}  // namespace tessera::mla_decode::testing
