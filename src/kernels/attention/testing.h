// attention: deterministic test cases, the built-in check grid, and parity of an implementation
// against the reference. Used by the GoogleTest suites of every backend and (once plugged in)
// by the generic parity suite / `tessera check`, so that all judge with the same cases and the
// same tolerances.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/parity.h"
#include "tessera/attention.h"

namespace tessera::attention::testing {

struct CaseSpec {
  int64_t B = 2, Sq = 7, Sk = 9;  // dense form
  int64_t Hq = 4, Hkv = 2, D = 16, Dv = 16;
  // Non-empty: the varlen form with these per-sequence lengths (same count for q and k).
  std::vector<int64_t> seqlens_q, seqlens_k;
  DType dtype = DType::kF32;  // q, k, v
  bool o_f32 = false;         // o (and grad_o) stored as f32, else in q's dtype
  bool f32_grads = false;     // dq, dk, dv stored as f32, else in the inputs' dtype
  int alibi = 0;              // 0: none, 1: slopes [Hq], 2: slopes [B, Hq]
  int segments = 0;           // > 0: segment ids (dense), that many packed segments per row
  // Non-empty: an additive bias (dense form) whose shape is spelled by dim, "1" where broadcast:
  // "BHQK" is [B, Hq, Sq, Sk], "1HQK" T5's [1, Hq, Sq, Sk], "B11K" a key padding mask.
  std::string bias;
  bool bias_f32 = false;      // bias (and dbias) stored as f32, else in q's dtype
  bool bias_masks = false;    // about one bias entry in 6 is −inf
  double logit_scale = 2.0;   // typical |scale·q·k|
  Options opt;                // scale, softcap, causal, window, block sizes, threads, ...
  uint64_t seed = 1;
  std::string name() const;   // short readable description
};

// Inputs made from a CaseSpec (host memory), rounded to the case's dtype when generated so that
// every implementation sees the very same numbers.
struct CaseData {
  Tensor q, k, v, alibi, seg_q, seg_k, cu_q, cu_k;
  Tensor dropout_seed;  // i32 [2] when the case's opt.dropout_p > 0
  Tensor bias;          // when the case has one
  Tensor grad_o;  // o's shape and dtype
  Inputs inputs() const;
  // Copies every tensor to `device`, except cu_q / cu_k: the varlen offsets are host memory
  // whatever the inputs' device (the API reads them there).
  CaseData to(Device device) const;
};
CaseData make_case(const CaseSpec& spec);

// Shapes and dtypes of the outputs of a case.
Shape o_shape(const CaseSpec& s);
Shape lse_shape(const CaseSpec& s);

// Tolerances per output, justified in testing.cc.
struct Tolerances {
  harness::Tolerance o, lse, dq, dk, dv, dbias;
};
Tolerances tolerances(const CaseSpec& spec);

using harness::ParityReport;
// "case [pass]" and each field's deviation, or why it did not run (test messages).
std::string report_str(const ParityReport& r);

// Runs `implementation` and the reference on the same case and compares every output. For
// Pass::kBackward both are given the reference forward's o and lse. The reference runs on host
// memory; the implementation on copies of the inputs on `device` (outputs copied back to be
// compared). Never throws for an implementation's failure: it is reported.
ParityReport check_parity(const CaseSpec& spec, const std::string& implementation, Pass pass,
                          Device device = Device::cpu());

// lse values as doubles for harness::compare: a −inf that matches becomes 0 on both sides, a
// −inf on one side only becomes NaN in `got` (counted as non-finite).
void lse_for_compare(std::vector<double>& got, std::vector<double>& want);

// harness::compare with the absolute tolerance taken relative to max(max|want|, floor) instead of
// max|want| (for outputs whose oracle can be ~0 by cancellation while its siblings are not).
harness::Deviation compare_with_floor(const std::vector<double>& got, const std::vector<double>& want,
                                      harness::Tolerance tol, double floor);
double max_abs(const std::vector<double>& v);

// Dropout's mask as `implementation` applies it, read back through o: q = 0 (every key has
// P = 1/Sk), v = the identity (Dv = Sk), so o[b, i, h, j] = z_ij / Sk with z_ij = 0 (dropped) or
// 1/(1 − p) (kept). Dense form, B × Sq × Hq × Sk entries in o's order: 1 kept, 0 dropped, 2 for a
// value that is neither 0 nor 1/((1 − p)·Sk) within the dtype's rounding (a wrong scale).
// `blocks` and `threads` go to the call's options (unset, 0: the defaults).
std::vector<uint8_t> dropout_mask_through_o(const std::string& implementation, Device device, DType dtype, int64_t B,
                                            int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv, double p,
                                            const int32_t seed[2], std::optional<BlockSizes> blocks = {},
                                            int threads = 0);
// The same positions by the rule of primitives/philox.h.
std::vector<uint8_t> dropout_mask_rule(int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, double p, const int32_t seed[2]);

// The built-in grid: MHA/GQA/MQA, causal (square, Sq < Sk, Sq > Sk), windows, softcap with
// scale, ALiBi, segment ids, varlen, dropout, bias (broadcast, −inf), Dv != D, D in {16, 64, 80, 128, 256}, odd lengths, every
// dtype. quick = a smaller subset (sanitizer runs).
std::vector<CaseSpec> check_grid(bool quick = false);

}  // namespace tessera::attention::testing
