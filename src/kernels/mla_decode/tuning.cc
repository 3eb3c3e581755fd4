// mla_decode: the split length of stage 1 (split-KV), declared (tune/declared.h). It sets how
// many (batch, split) items the threads share against how many partials stage 2 combines; the
// call-time choice (api.cc) and `tessera tune mla_decode` (spec.cc) derive from this.
#include <algorithm>

#include "kernels/mla_decode/cpu_stages.h"
#include "kernels/mla_decode/impl.h"
#include "tune/declared.h"

namespace tessera::mla_decode {

namespace {
using tune::kAny;

// The automatic rule's split first, then 1, 2, 4, 8 and 16 splits of the longest sequence (in
// multiples of the key chunk, at least the automatic rule's floor).
std::vector<tune::Params> candidates(const std::vector<int64_t>& d, int threads) {
  const int64_t B = d.at(0), T = d.at(3);
  std::vector<tune::Params> out{{{"split_keys", cpu::automatic_split_keys(B, T, threads)}}};
  for (int64_t s : {1, 2, 4, 8, 16}) {
    const int64_t keys = (T + s - 1) / s, rounded = (keys + cpu::kChunk - 1) / cpu::kChunk * cpu::kChunk;
    const tune::Params c{{"split_keys", std::max(cpu::kMinSplitKeys, rounded)}};
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

// Multiply-adds of a call: every (query row, key) pair against DeepSeek's D + Dv = 576 + 512
// (the tuning dims do not hold D: an estimate, used for the autotune threshold only).
double macs(const std::vector<int64_t>& d) {
  return double(d.at(0)) * double(d.at(1)) * double(d.at(2)) * double(d.at(3)) * (576.0 + 512.0);
}
}  // namespace

const tune::Declared& tuning() {
  static const tune::Declared d{
      .kernel = kKernelName,
      .options = {"split_keys"},
      .buckets = {
          {"decode", "Sq·Hq <= 32: memory-bound rows (one token, few heads)",
           {{"B", 1, kAny, 32}, {"Sq", 1, 2, 1}, {"Hq", 1, 16, 16}, {"T", 1, kAny, 4096}}},
          {"wide", "more query rows per entry (speculative decode, 128 heads): compute-bound",
           {{"B", 1, kAny, 32}, {"Sq", 1, kAny, 16}, {"Hq", 1, kAny, 16}, {"T", 1, kAny, 4096}}},
      },
      .ragged_dims = {"B", "T"},  // a serving batch's size; the longest cache grows each step
      .implementations = {"cpu"},
      .candidates = candidates,
      .carrier = "block_sizes",  // the call's block_sizes option: "split_keys=1024"
      // bf16 inputs: stage 1 rounds P to bf16 for P·V against each split's own running max, so
      // another split length rounds P differently: errors of 2^-9 of each weight, up to ~2^-9 of
      // the values' scale in o (measured 1.5e-3 of o's largest |value|). The bf16 output
      // tolerance (2^-6, tune/verify.h) covers that, as if o were stored in bf16; f32 and f16
      // inputs keep the f32 sums and the default.
      .rtol = [](DType inputs) { return inputs == DType::kBF16 ? 0x1p-6 : 0.0; },
      // The GPU implementations plan their own splits (split_keys = 0); without this they got the
      // cpu rule's split, sized by the host's threads (found in review, 2026-11-27).
      .default_of = [](const std::string&) { return tune::Params{{"split_keys", 0}}; },
      .work = macs,
      .table = tuned_table};
  return d;
}

}  // namespace tessera::mla_decode
