// paged_attention cpu backend: parity with the reference across thread counts and the split-KV
// path (few sequences, long contexts: partials combined by lse), with sinks and windows; results
// do not depend on the schedule (each key block is summed in a fixed order per task).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/paged_attention/testing.h"
#include "tessera/paged_attention.h"

namespace tessera::paged_attention {
namespace {

void expect_parity(const testing::CaseSpec& c) {
  const harness::ParityReport r = testing::check_parity(c, "cpu");
  ASSERT_TRUE(r.ran) << r.error;
  for (const auto& f : r.fields) EXPECT_TRUE(f.dev.ok()) << c.name() << " " << f.field << ": " << f.dev.str();
}

TEST(PagedAttentionCpu, ThreadCounts) {
  for (int threads : {1, 2, 3, 7}) {
    testing::CaseSpec c;
    c.label = "threads", c.q_lens = {1, 9, 1, 0, 20}, c.kv_lens = {40, 9, 17, 2, 61}, c.num_threads = threads;
    c.sinks = true, c.window = 10, c.shared_pages = true;
    expect_parity(c);
  }
}

// One decoding sequence with a long context on 4 threads: one task (a decode row covers every kv
// head of its sequence), so the keys are split (kSplitKeys = 1024) and the partials combined;
// sinks carried by one split only.
TEST(PagedAttentionCpu, SplitKvDecodeAndPrefill) {
  for (bool sinks : {false, true})
    for (int64_t window : {int64_t{-1}, int64_t{3000}}) {
      testing::CaseSpec c;
      c.label = "split", c.q_lens = {1}, c.kv_lens = {9000}, c.num_threads = 4, c.sinks = sinks, c.window = window;
      c.page_size = 32, c.dtype = DType::kBF16;
      expect_parity(c);
      c.q_lens = {3}, c.causal = false;  // prefill rows split too
      expect_parity(c);
    }
}

// Every key counted exactly once across the splits: q = 0 makes every visible key's weight the
// same (scores 0), and value dim 0 of key j holds j / 8192, so o[0] is the mean position of the
// keys a row saw and lse = ln(count) (+ the sink's term) — a key lost or counted twice at a split
// boundary moves o[0] by ~1/(2·count) of itself, 50x the f32 rounding of these sums. (The grid's
// random scores hide one key in 9,000 below their tolerance.) Decode and prefill rows, windows.
TEST(PagedAttentionCpu, EverySplitKeyCountedOnce) {
  for (int64_t window : {int64_t{-1}, int64_t{3000}})
    for (int64_t q_len : {1, 3})
      for (int threads : {1, 4}) {
        testing::CaseSpec c;
        c.q_lens = {q_len}, c.kv_lens = {9000}, c.num_threads = threads, c.window = window, c.page_size = 32;
        c.Hq = 2, c.Hkv = 1;
        testing::CaseData d = testing::make_case(c);
        std::fill_n(d.q.data_as<float>(), d.q.numel(), 0.0f);
        const int32_t* pt = d.page_table.data_as<int32_t>();
        for (int64_t j = 0; j < 9000; ++j)
          d.v_cache.data_as<float>()[(pt[j / 32] * 32 + j % 32) * c.Dv] = float(j) / 8192.0f;
        Options opt = testing::options_of(c);
        opt.implementation = "cpu";
        const Result r = compute(d.inputs(), opt);
        for (int64_t i = 0; i < q_len; ++i) {
          const int64_t pos = 9000 - q_len + i, lo = window >= 0 ? std::max<int64_t>(0, pos - window) : 0;
          const double count = double(pos - lo + 1), mean = (double(lo) + double(pos)) / 2.0 / 8192.0;
          for (int64_t h = 0; h < c.Hq; ++h) {
            const std::string at = "q_len " + std::to_string(q_len) + " window " + std::to_string(window) + " threads " +
                                   std::to_string(threads) + " row " + std::to_string(i) + " head " + std::to_string(h);
            EXPECT_NEAR(r.o.data_as<float>()[(i * c.Hq + h) * c.Dv], mean, 1e-5 * mean) << at;
            EXPECT_NEAR(r.lse.data_as<float>()[i * c.Hq + h], std::log(count), 2e-6 * std::log(count)) << at;
          }
        }
      }
}

// bf16 decode rows (D, Dv multiples of 32) take the vdpbf16ps path where the CPU has it; with
// TESSERA_CPU_BF16_DOT=0 the generic f32 path. Both against the reference: head groups of 4, 8
// (two groups) and 5 (4 + 1), thread counts that split the keys (with sinks and windows), page
// sizes that cut blocks short.
TEST(PagedAttentionCpu, Bf16DecodeBothPaths) {
  for (const char* dot : {"1", "0"}) {
    ::setenv("TESSERA_CPU_BF16_DOT", dot, 1);
    for (int64_t G : {4, 8, 5})
      for (int threads : {1, 3}) {
        testing::CaseSpec c;
        c.label = std::string("bf16_dot") + dot, c.dtype = DType::kBF16, c.Hkv = 2, c.Hq = 2 * G, c.D = 32, c.Dv = 32;
        c.q_lens = {1, 1, 1}, c.kv_lens = {2100, 33, 7}, c.page_size = G == 5 ? 7 : 16, c.num_threads = threads;
        c.sinks = G == 8, c.window = G == 5 ? 1500 : -1, c.softcap = G == 4 ? 5.0 : 0.0;
        expect_parity(c);
      }
  }
  ::unsetenv("TESSERA_CPU_BF16_DOT");
}

// An f8e4m3 cache on the bf16 decode path (widened to bf16 in registers) and the generic f32 path
// (widened by cpu_convert), against the reference: every code but NaN in the slots read (the rows
// overwritten with codes cycling through all 256, scales 1/448), then only the 32 of magnitude
// below 2^-5 (the 16 subnormals and ±0 among them, scales 64: one subnormal unit is then 0.125,
// far past the tolerance); head groups of 4 and 5, pages of 16 (read in place) and 1 (gathered,
// with Dv 96: a 32-wide P·V tail), 1 and 3 threads (split at kv_len 2100).
TEST(PagedAttentionCpu, F8CacheEveryCodeOnBothPaths) {
  for (const char* dot : {"1", "0"}) {
    ::setenv("TESSERA_CPU_BF16_DOT", dot, 1);
    for (bool small : {false, true})
    for (int64_t page_size : {16, 1})
      for (int threads : {1, 3}) {
        testing::CaseSpec c;
        const double scale = small ? 64.0 : 1.0 / 448;
        c.label = "f8_codes", c.dtype = DType::kBF16, c.f8_cache = true, c.k_scale = scale, c.v_scale = scale;
        // Dv 96 on gathered pages: P·V's 32-wide tail after a chunk of 64.
        c.Hkv = 2, c.Hq = page_size == 1 ? 10 : 8, c.D = 32, c.Dv = page_size == 1 ? 96 : 64;
        c.q_lens = {1, 1, 2}, c.kv_lens = {2100, 37, 9};
        c.page_size = page_size, c.num_threads = threads, c.sinks = true;
        testing::CaseData d = testing::make_case(c);
        for (Tensor* t : {&d.k_cache, &d.v_cache}) {
          auto* b = static_cast<uint8_t*>(t->data());
          for (int64_t i = 0; i < t->numel(); ++i) {
            const int64_t code = small ? (i * 7 + 3) % 16 | ((i / 3) % 2) << 7 : (i * 7 + 3) % 256;
            if ((b[i] & 0x7f) != 0x7f) b[i] = static_cast<uint8_t>((code & 0x7f) == 0x7f ? 0 : code);  // read slots only
          }
        }
        Options opt = testing::options_of(c);
        opt.implementation = "reference";
        const Result want = compute(d.inputs(), opt);
        opt.implementation = "cpu";
        const Result got = compute(d.inputs(), opt);
        const std::string at = std::string("dot ") + dot + (small ? " small codes" : " all codes") + " page_size " +
                               std::to_string(page_size) + " threads " + std::to_string(threads);
        const auto o = harness::compare(harness::to_doubles(got.o), harness::to_doubles(want.o), testing::o_tolerance(c));
        EXPECT_TRUE(o.ok()) << at << " o: " << o.str();
        const auto l = harness::compare(harness::to_doubles(got.lse), harness::to_doubles(want.lse), testing::lse_tolerance(c));
        EXPECT_TRUE(l.ok()) << at << " lse: " << l.str();
      }
  }
  ::unsetenv("TESSERA_CPU_BF16_DOT");
}

// The bf16 decode path asks the block two ahead into L2 and gathers pages of 1 or 2 slots into
// blocks of 16 keys (v3); TESSERA_PAGED_DECODE_L2_PREFETCH=0 turns both off. Both against the
// reference; from 3 slots a page (no gathering) bitwise equal to each other: a prefetch changes no
// result. Tails: blocks cut by pages of 7 and 20 slots (the block ahead crosses a page end), of 3;
// gathered pages of 1 and 2 slots (blocks across pages, kv_len not a multiple of 16); kv_len 1
// (nothing ahead), 37 (a short last block) and 2100 (split on 3 threads); a q_len 0 sequence; one
// sequence; D ≠ Dv (K and V lines differ); head groups of 4 and 5 (4 + 1).
TEST(PagedAttentionCpu, Bf16DecodeV3ChangesNothing) {
  for (int64_t page_size : {16, 7, 20, 3, 2, 1})
    for (int threads : {1, 3}) {
      testing::CaseSpec c;
      c.label = "bf16_l2", c.dtype = DType::kBF16, c.Hkv = 2, c.Hq = page_size == 7 || page_size == 2 ? 10 : 8, c.D = 64, c.Dv = 96;
      c.q_lens = {1, 0, 1, 1}, c.kv_lens = {1, 5, 37, 2100}, c.page_size = page_size, c.num_threads = threads;
      c.sinks = page_size == 20 || page_size == 1, c.window = page_size == 7 || page_size == 2 ? 1000 : -1;
      if (page_size == 1) c.q_lens = {1}, c.kv_lens = {300};  // one sequence
      Result r[2];
      for (int on : {1, 0}) {
        ::setenv("TESSERA_PAGED_DECODE_L2_PREFETCH", on ? "1" : "0", 1);
        expect_parity(c);
        const testing::CaseData d = testing::make_case(c);
        Options opt = testing::options_of(c);
        opt.implementation = "cpu";
        r[on] = compute(d.inputs(), opt);
      }
      ::unsetenv("TESSERA_PAGED_DECODE_L2_PREFETCH");
      if (page_size < 3) continue;  // gathered: blocks of other lengths, sums in another order
      EXPECT_EQ(std::memcmp(r[0].o.data(), r[1].o.data(), r[0].o.view().nbytes()), 0) << c.name();
      EXPECT_EQ(std::memcmp(r[0].lse.data(), r[1].lse.data(), r[0].lse.view().nbytes()), 0) << c.name();
    }
}

TEST(PagedAttentionCpu, ScheduleDoesNotChangeTheResult) {
  testing::CaseSpec c;
  c.q_lens = {1, 5, 1}, c.kv_lens = {3000, 40, 2500}, c.num_threads = 3;
  const testing::CaseData d = testing::make_case(c);
  Options opt = testing::options_of(c);
  opt.implementation = "cpu";
  const Result a = compute(d.inputs(), opt), b = compute(d.inputs(), opt);
  EXPECT_EQ(std::memcmp(a.o.data(), b.o.data(), a.o.view().nbytes()), 0);
  EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.view().nbytes()), 0);
}

// A NaN in a key the row sees makes the row NaN, as in the reference: the online softmax must not
// mistake NaN for "masked" (−inf), which would hide a bad cache read behind a plausible result.
TEST(PagedAttentionCpu, NanInAVisibleKeyPropagates) {
  testing::CaseSpec c;
  c.q_lens = {1, 1}, c.kv_lens = {5, 7}, c.num_threads = 2;
  testing::CaseData d = testing::make_case(c);
  const int32_t page = static_cast<const int32_t*>(d.page_table.data())[0];  // sequence 0's first page
  float* k = static_cast<float*>(d.k_cache.data());
  const int64_t slot_elems = d.k_cache.view().numel() / d.k_cache.view().shape[0];
  k[page * slot_elems] = std::numeric_limits<float>::quiet_NaN();  // slot 0, kv head 0, dim 0
  for (const char* impl : {"reference", "cpu"}) {
    Options opt = testing::options_of(c);
    opt.implementation = impl;
    const Result r = compute(d.inputs(), opt);
    const float* o = static_cast<const float*>(r.o.data());
    EXPECT_TRUE(std::isnan(o[0])) << impl << ": sequence 0, head 0 saw a NaN key";
    const int64_t row = r.o.view().numel() / 2;  // sequence 1 never reads that page
    EXPECT_FALSE(std::isnan(o[row])) << impl << ": sequence 1 does not read the NaN key";
  }
}

// Inf in a value row that some rows of a prefill see and others do not (past a row's causal
// position, or left of its window): only the rows that see it go non-finite, as in the reference
// (cpu multiplied the masked rows' 0 weights by Inf: NaN). The caches are not scanned, and an f16
// cache overflows to Inf. Decode-sized blocks (a few query vectors) and GEMM-sized ones (48).
TEST(PagedAttentionCpu, InfInAKeyARowDoesNotSeeStaysOutOfThatRow) {
  struct Shape {
    int64_t q_len, kv_len, Hq, window, bad_key;
  };
  // causal: key kv_len - 1 is seen by the last row only; window 1: key q_len... seen by the first rows only.
  for (const Shape sh : {Shape{3, 6, 4, -1, 5}, Shape{3, 6, 4, 1, 3}, Shape{12, 20, 8, -1, 19}, Shape{12, 20, 8, 2, 9}})
    for (DType dt : {DType::kF32, DType::kF16}) {
      testing::CaseSpec c;
      c.q_lens = {sh.q_len}, c.kv_lens = {sh.kv_len}, c.Hq = sh.Hq, c.Hkv = 2, c.window = sh.window, c.dtype = dt;
      testing::CaseData d = testing::make_case(c);
      const int32_t page = static_cast<const int32_t*>(d.page_table.data())[sh.bad_key / c.page_size];
      const int64_t base = ((page * c.page_size + sh.bad_key % c.page_size) * c.Hkv) * c.Dv;  // kv head 0, dim 0
      if (dt == DType::kF32) static_cast<float*>(d.v_cache.data())[base] = INFINITY;
      else static_cast<uint16_t*>(d.v_cache.data())[base] = 0x7c00;  // f16 +Inf
      std::vector<Result> r;
      for (const char* impl : {"reference", "cpu"}) {
        Options opt = testing::options_of(c);
        opt.implementation = impl;
        r.push_back(compute(d.inputs(), opt));
      }
      int64_t finite_rows = 0, bad_rows = 0;
      std::vector<float> want(size_t(r[0].o.numel())), got(want.size());  // o in the inputs' dtype
      for (int64_t i = 0; i < r[0].o.numel(); ++i)
        want[size_t(i)] = load_as_f32(r[0].o.data(), r[0].o.dtype(), i), got[size_t(i)] = load_as_f32(r[1].o.data(), r[1].o.dtype(), i);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(std::isfinite(got[i]), std::isfinite(want[i]))
            << dtype_name(dt) << " q_len " << sh.q_len << " window " << sh.window << " element " << i << ": cpu "
            << got[i] << ", reference " << want[i];
        if (!std::isfinite(want[i])) {
          ++bad_rows;
          continue;
        }
        ++finite_rows;
        EXPECT_NEAR(got[i], want[i], dt == DType::kF16 ? 2e-3 : 2e-5) << i;  // f16 o: a unit 2^-11 of |o| < 1
      }
      EXPECT_GT(bad_rows, 0) << "some row sees the Inf";
      EXPECT_GT(finite_rows, bad_rows) << "most rows do not";
    }
}

// Inf in a key that rows see (the caches are not scanned; an f16 cache overflows to Inf): those
// rows come back NaN, o and lse, as in the reference. cpu wrote o = 0, lse = −inf — "saw
// nothing" — where a +Inf score made the softmax sum NaN. Decode (q_len 1), and a prefill tile
// whose last rows alone see the key.
TEST(PagedAttentionCpu, NonFiniteKeyARowSeesMakesThatRowNaN) {
  for (const int64_t q_len : {1, 12})
    for (DType dt : {DType::kF32, DType::kF16}) {
      testing::CaseSpec c;
      c.q_lens = {q_len, 1}, c.kv_lens = {20, 9}, c.Hq = 8, c.Hkv = 2, c.dtype = dt;
      testing::CaseData d = testing::make_case(c);
      const int64_t bad_key = 19;  // the last key of sequence 0: its last row sees it
      const int32_t page = static_cast<const int32_t*>(d.page_table.data())[bad_key / c.page_size];
      for (int64_t g = 0; g < c.Hkv; ++g)
        for (int64_t e = 0; e < c.D; e += 7) {  // +Inf and −Inf across q's signs: +Inf scores on some heads
          const int64_t at = ((page * c.page_size + bad_key % c.page_size) * c.Hkv + g) * c.D + e;
          store_from_f32(d.k_cache.data(), dt, at, e % 2 ? -INFINITY : INFINITY);
        }
      Result r[2];
      for (int i = 0; i < 2; ++i) {
        Options opt = testing::options_of(c);
        opt.implementation = i ? "cpu" : "reference";
        r[i] = compute(d.inputs(), opt);
      }
      int64_t nan_rows = 0;
      for (int64_t i = 0; i < r[0].lse.numel(); ++i) {
        const float want = r[0].lse.data_as<float>()[i], got = r[1].lse.data_as<float>()[i];
        ASSERT_EQ(std::isnan(got), std::isnan(want)) << dtype_name(dt) << " q_len " << q_len << " lse " << i << ": cpu " << got << ", reference " << want;
        nan_rows += std::isnan(want);
        if (!std::isnan(want)) EXPECT_NEAR(got, want, 1e-4) << i;
      }
      for (int64_t i = 0; i < r[0].o.numel(); ++i)
        ASSERT_EQ(std::isfinite(load_as_f32(r[1].o.data(), dt, i)), std::isfinite(load_as_f32(r[0].o.data(), dt, i))) << i;
      EXPECT_GT(nan_rows, 0) << "some row sees the Inf";
      EXPECT_LE(nan_rows, c.Hq) << "only sequence 0's last row sees it";
    }
}

}  // namespace
}  // namespace tessera::paged_attention
