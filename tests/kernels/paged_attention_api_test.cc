// paged_attention API: every bad input gives a one-line error naming the sequence it is about,
// before anything runs (no output touched); the result equals `attention` on the gathered keys;
// decode context parallelism (shards of the keys merged by lse) gives the whole result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/api_test_util.h"
#include "kernels/paged_attention/testing.h"
#include "kernels/registry.h"
#include "primitives/lse_combine.h"
#include "tessera/attention.h"
#include "tessera/error.h"
#include "tessera/paged_attention.h"

namespace tessera::paged_attention {
namespace {

using api_test::sentinel;
using api_test::untouched;

// Three sequences: q_lens 2, 3, 1; kv_lens 5, 9, 4; page_size 4 (pages 2, 3, 1).
testing::CaseSpec base() {
  testing::CaseSpec c;
  c.q_lens = {2, 3, 1}, c.kv_lens = {5, 9, 4};
  return c;
}

// Runs forward on (possibly broken) data and expects an error containing every piece of `want`.
void expect_error(const std::function<void(testing::CaseData&, Options&)>& broken, const std::vector<std::string>& want,
                  const Shape& o_shape = {6, 4, 16}, const Shape& lse_shape = {6, 4}) {
  testing::CaseData d = testing::make_case(base());
  Options opt;
  opt.causal = true;
  broken(d, opt);
  Tensor o = sentinel(DType::kF32, o_shape), lse = sentinel(DType::kF32, lse_shape);
  try {
    forward(d.inputs(), {o.view(), lse.view()}, opt);
    ADD_FAILURE() << "no error; wanted " << want[0];
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("paged_attention: ", 0), 0u) << msg;
    for (const std::string& w : want) EXPECT_NE(msg.find(w), std::string::npos) << "want '" << w << "' in: " << msg;
  }
  EXPECT_TRUE(untouched(o));
  EXPECT_TRUE(untouched(lse));
}

int32_t* i32(Tensor& t) { return t.data_as<int32_t>(); }

TEST(PagedAttentionApi, PageIdOutOfRangeNamesTheSequence) {
  expect_error([](auto& d, auto&) { i32(d.page_table)[1 * d.page_table.shape()[1] + 2] = static_cast<int32_t>(d.k_cache.shape()[0]); },
               {"sequence 1", "page_table[1, 2]", "is not a page of the cache"});
  expect_error([](auto& d, auto&) { i32(d.page_table)[2 * d.page_table.shape()[1]] = -1; }, {"sequence 2", "page_table[2, 0] = -1 is not a page of the cache [0, P="});
}

TEST(PagedAttentionApi, PageTableEntriesPastTheUsedPagesAreNotRead) {
  testing::CaseData d = testing::make_case(base());  // unused entries hold -7
  Tensor o = Tensor::empty(DType::kF32, {6, 4, 16}), lse = Tensor::empty(DType::kF32, {6, 4});
  EXPECT_NO_THROW(forward(d.inputs(), {o.view(), lse.view()}));
}

TEST(PagedAttentionApi, LengthErrorsNameTheSequence) {
  // max_pages = 4 (3 used + 1) × page_size 4 = 16 slots.
  expect_error([](auto& d, auto&) { i32(d.kv_lens)[1] = 17; }, {"sequence 1", "kv_lens[1] = 17 is outside [0, max_pages·page_size = 4·4]"});
  expect_error([](auto& d, auto&) { i32(d.kv_lens)[1] = 2; }, {"sequence 1", "q_len=3 is above kv_lens[1] = 2"});
  expect_error([](auto& d, auto&) { i32(d.kv_lens)[0] = -1; }, {"sequence 0", "kv_lens[0] = -1 is outside [0, "});
  expect_error([](auto& d, auto&) { i32(d.cu_q_lens)[2] = 1; }, {"sequence 1", "cu_q_lens must be non-decreasing"});
  expect_error([](auto& d, auto&) { i32(d.cu_q_lens)[3] = 5; }, {"sequence 2", "cu_q_lens[N=3] = 5 must equal the rows of q (6)"});
  expect_error([](auto& d, auto&) { i32(d.cu_q_lens)[0] = 1; }, {"cu_q_lens[0] must be 0"});
}

TEST(PagedAttentionApi, ShapeAndDtypeErrors) {
  expect_error([](auto& d, auto&) { d.k_cache = Tensor::empty(DType::kBF16, d.k_cache.shape()); },
               {"k_cache must be f32 (q's dtype) or f8e4m3, got bf16"});
  // An f8e4m3 cache: both caches alike; o in q's dtype or f32, never f8e4m3.
  expect_error([](auto& d, auto&) { d.k_cache = Tensor::empty(DType::kF8E4M3, d.k_cache.shape()); },
               {"v_cache must be f8e4m3 like k_cache, got f32"});
  expect_error([](auto& d, auto&) { d.v_cache = Tensor::empty(DType::kF8E4M3, d.v_cache.shape()); },
               {"v_cache must be f32 like k_cache, got f8e4m3"});
  expect_error([](auto& d, auto&) { d.q = Tensor::empty(DType::kF8E4M3, d.q.shape()); }, {"q must be f32, bf16 or f16, got f8e4m3"});
  expect_error([](auto& d, auto&) { d.q = Tensor::empty(DType::kI32, d.q.shape()); }, {"q must be f32, bf16 or f16"});
  expect_error([](auto& d, auto&) { d.page_table = Tensor::empty(DType::kI64, d.page_table.shape()); }, {"page_table must be i32"});
  expect_error([](auto& d, auto&) { d.kv_lens = Tensor::empty(DType::kI32, {2}); }, {"kv_lens must be [N=3], got [2]"});
  expect_error([](auto& d, auto&) { d.cu_q_lens = Tensor::empty(DType::kI32, {2, 2}); }, {"cu_q_lens must be [N+1=4], got [2, 2]"});
  // N binds from page_table, the first tensor that names it.
  expect_error([](auto& d, auto&) { d.page_table = Tensor::empty(DType::kI32, {2, 4}); }, {"kv_lens must be [N=2], got [3]"});
  expect_error([](auto& d, auto&) { d.q = Tensor::empty(DType::kF32, {6, 3, 16}); }, {"Hq=3 is not a multiple of Hkv=2"},
               {6, 3, 16}, {6, 3});
  expect_error([](auto& d, auto&) { d.q = Tensor::empty(DType::kF32, {6, 4, 8}); }, {"k_cache must be [P, page_size, Hkv, D=8], got [9, 4, 2, 16]"});
  expect_error([](auto& d, auto&) { d.v_cache = Tensor::empty(DType::kF32, {d.v_cache.shape()[0], 3, 2, 16}); },
               {"v_cache must be [P=9, page_size=4, Hkv=2, Dv], got [9, 3, 2, 16]"});
  expect_error([](auto& d, auto&) { d.k_cache = Tensor::empty(DType::kF32, {4, 4, 2}); }, {"k_cache must be [P, page_size, Hkv, D=16], got [4, 4, 2]"});
  expect_error([](auto& d, auto&) { d.sinks = Tensor::empty(DType::kF32, {3}); }, {"sinks must be [Hq=4]"});
  expect_error([](auto& d, auto&) { d.sinks = Tensor::empty(DType::kBF16, {4}); }, {"sinks must be f32"});
  expect_error([](auto&, auto&) {}, {"o must be [T=6, Hq=4, Dv=16], got [6, 4, 8]"}, {6, 4, 8});
  expect_error([](auto&, auto&) {}, {"lse must be [T=6, Hq=4], got [4, 6]"}, {6, 4, 16}, {4, 6});
  expect_error([](auto&, auto& o) { o.scale = 0.0; }, {"scale must be finite in f32 and > 0"});
  expect_error([](auto&, auto& o) { o.softcap = -1.0; }, {"softcap must be 0 (off) or in ["});
  expect_error([](auto&, auto& o) { o.scale = 1e39; }, {"scale must be finite in f32 and > 0"});   // inf in f32
  expect_error([](auto&, auto& o) { o.softcap = 1e39; }, {"softcap must be 0 (off) or in ["});
  expect_error([](auto&, auto& o) { o.softcap = 1e-50; }, {"softcap must be 0 (off) or in ["});  // 0 in the f32 cuda kernel
  expect_error([](auto&, auto& o) { o.window = -2; }, {"window must be >= 0 or -1"});
  expect_error([](auto&, auto& o) { o.k_scale = 0.0; }, {"k_scale must be finite in f32 and > 0, got 0"});
  expect_error([](auto&, auto& o) { o.k_scale = std::nan(""); }, {"k_scale must be finite in f32 and > 0"});
  expect_error([](auto&, auto& o) { o.v_scale = -1.0; }, {"v_scale must be finite in f32 and > 0, got -1"});
  expect_error([](auto&, auto& o) { o.v_scale = 1e39; }, {"v_scale must be finite in f32 and > 0"});
  // Each finite, the product with the softmax scale is not (inf in f32), or is 0.
  expect_error([](auto&, auto& o) { o.scale = 1e30, o.k_scale = 1e30; }, {"scale * k_scale must be finite in f32 and > 0"});
  expect_error([](auto&, auto& o) { o.scale = 1e-30, o.k_scale = 1e-300; }, {"k_scale must be finite in f32 and > 0, got 1e-300"});
  expect_error([](auto&, auto& o) { o.scale = 1e-30, o.k_scale = 1e-20; }, {"scale * k_scale must be finite in f32 and > 0"});
  expect_error([](auto&, auto& o) { o.v_scale = 1e-50; }, {"v_scale must be finite in f32 and > 0, got 1e-50"});  // 0 in f32
}

// Places: the caches, sinks and outputs on q's device, the index arrays in host memory.
TEST(PagedAttentionApi, PlaceErrors) {
  const testing::CaseData d = testing::make_case(base());
  const auto rejects = [&](const std::function<void(Inputs&, Outputs&)>& broken, const std::string& want) {
    Tensor o = sentinel(DType::kF32, {6, 4, 16}), lse = sentinel(DType::kF32, {6, 4});
    Inputs in = d.inputs();
    Outputs out{o.view(), lse.view()};
    broken(in, out);
    try {
      forward(in, out);
      ADD_FAILURE() << "no error; wanted " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    EXPECT_TRUE(untouched(o));
    EXPECT_TRUE(untouched(lse));
  };
  rejects([](Inputs& in, Outputs&) { in.v_cache.device = Device::cuda(); }, "v_cache is on cuda:0 but q is on cpu");
  rejects([](Inputs& in, Outputs&) { in.kv_lens.device = Device::cuda(); }, "kv_lens must be in host memory");
  rejects([](Inputs& in, Outputs&) { in.cu_q_lens.device = Device::cuda(); }, "cu_q_lens must be in host memory");
  rejects([](Inputs&, Outputs& out) { out.lse.device = Device::cuda(); }, "lse is on cuda:0 but q is on cpu");
}

// check_finite (the CLI's default) scans q and the sinks, never the caches (their unused slots
// may hold NaN: the contract); a −inf sink is a sink that takes nothing, not an error.
TEST(PagedAttentionApi, CheckFiniteSkipsTheCachesAndAllowsMinusInfSinks) {
  testing::CaseSpec c = base();
  c.sinks = true;  // sinks[0] = −inf; the caches hold NaN in unused slots
  testing::CaseData d = testing::make_case(c);
  Options opt;
  opt.check_finite = true;
  Tensor o = Tensor::empty(DType::kF32, {6, 4, 16}), lse = Tensor::empty(DType::kF32, {6, 4});
  EXPECT_NO_THROW(forward(d.inputs(), {o.view(), lse.view()}, opt));
  expect_error([](auto& d, auto& o) {
    d.sinks = Tensor::empty(DType::kF32, {4});
    for (int i = 0; i < 4; ++i) d.sinks.template data_as<float>()[i] = i == 2 ? NAN : 0.0f;
    o.check_finite = true;
  }, {"sinks contain NaN"});
  expect_error([](auto& d, auto& o) {
    d.q.template data_as<float>()[5] = INFINITY;
    o.check_finite = true;
  }, {"q contains NaN or Inf"});
}

TEST(PagedAttentionApi, UnknownImplementationIsAnErrorAndEmptyBatchRunsNothing) {
  testing::CaseData d = testing::make_case(base());
  Tensor o = sentinel(DType::kF32, {6, 4, 16}), lse = sentinel(DType::kF32, {6, 4});
  Options opt;
  opt.implementation = "cpuu";
  EXPECT_THROW(forward(d.inputs(), {o.view(), lse.view()}, opt), Error);
  EXPECT_TRUE(untouched(o));
  testing::CaseSpec empty = base();
  empty.q_lens = {0, 0}, empty.kv_lens = {0, 3};
  testing::CaseData z = testing::make_case(empty);
  Tensor o0 = Tensor::empty(DType::kF32, {0, 4, 16}), l0 = Tensor::empty(DType::kF32, {0, 4});
  EXPECT_EQ(forward(z.inputs(), {o0.view(), l0.view()}), "(empty)");
}

TEST(PagedAttentionApi, RegisteredWithItsSignature) {
  const kernels::KernelSpec& k = kernels::get("paged_attention");
  std::vector<std::string> names;
  for (const auto& in : k.call.inputs) names.push_back(in.name);
  EXPECT_EQ(names, (std::vector<std::string>{"q", "k_cache", "v_cache", "page_table", "kv_lens", "cu_q_lens", "sinks"}));
  EXPECT_FALSE(k.check_grid(true).empty());
}

// The same math as `attention` (varlen, bottom-right causal, left window, softcap, scale) on the
// keys gathered from the pages: every implementation of both kernels agrees within f32 rounding.
TEST(PagedAttentionApi, EqualsAttentionOnGatheredKeys) {
  for (const bool causal : {true, false}) {
    testing::CaseSpec c;
    c.q_lens = {1, 7, 0, 4}, c.kv_lens = {13, 7, 3, 30}, c.Hq = 6, c.Hkv = 2, c.Dv = 12, c.page_size = 5;
    c.causal = causal, c.window = causal ? 6 : -1, c.softcap = causal ? 0.0 : 2.5, c.scale = 0.3;
    const testing::CaseData d = testing::make_case(c);
    // Gather.
    int64_t total = 0;
    for (int64_t s : c.kv_lens) total += s;
    Tensor k = Tensor::empty(DType::kF32, {total, c.Hkv, c.D}), v = Tensor::empty(DType::kF32, {total, c.Hkv, c.Dv});
    Tensor cu_k = Tensor::empty(DType::kI32, {5});
    const int64_t mp = d.page_table.shape()[1];
    int64_t row = 0;
    cu_k.data_as<int32_t>()[0] = 0;
    for (size_t s = 0; s < c.kv_lens.size(); ++s) {
      for (int64_t j = 0; j < c.kv_lens[s]; ++j, ++row) {
        const int64_t src = d.page_table.data_as<int32_t>()[static_cast<int64_t>(s) * mp + j / c.page_size] * c.page_size + j % c.page_size;
        std::memcpy(k.data_as<float>() + row * c.Hkv * c.D, d.k_cache.data_as<float>() + src * c.Hkv * c.D, sizeof(float) * c.Hkv * c.D);
        std::memcpy(v.data_as<float>() + row * c.Hkv * c.Dv, d.v_cache.data_as<float>() + src * c.Hkv * c.Dv, sizeof(float) * c.Hkv * c.Dv);
      }
      cu_k.data_as<int32_t>()[s + 1] = static_cast<int32_t>(row);
    }
    attention::Inputs ai;
    ai.q = d.q.view(), ai.k = k.view(), ai.v = v.view(), ai.cu_seqlens_q = d.cu_q_lens.view(), ai.cu_seqlens_k = cu_k.view();
    attention::Options ao;
    ao.causal = causal, ao.window_left = c.window, ao.softcap = c.softcap, ao.scale = c.scale;
    ao.implementation = "reference";
    const attention::Result want = attention::compute(ai, ao);
    for (const auto& info : implementations()) {
      if (!info.available || info.device != DeviceType::kCPU) continue;  // host inputs here
      Options po = testing::options_of(c);
      po.implementation = info.name;
      const Result got = compute(d.inputs(), po);
      const int64_t T = d.q.shape()[0];
      for (int64_t i = 0; i < got.o.numel(); ++i)
        ASSERT_NEAR(got.o.data_as<float>()[i], want.o.data_as<float>()[i], 2e-5) << info.name << " o " << i;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < c.Hq; ++h)  // attention's varlen lse is [Hq, T]
          ASSERT_NEAR(got.lse.data_as<float>()[t * c.Hq + h], want.lse.data_as<float>()[h * T + t], 2e-5)
              << info.name << " lse " << t << "," << h;
    }
  }
}

// One shard of decode context parallelism: sequence s's pages [first, last) of the case's page
// table, its keys min(kv_len, last·page_size) − first·page_size (the rest of the row poison).
struct Shard {
  Tensor table, kv_lens;
};
Shard shard_of(const testing::CaseData& d, const testing::CaseSpec& c, bool second) {
  const int64_t N = d.kv_lens.numel(), mp = d.page_table.shape()[1], ps = c.page_size;
  Shard sh{Tensor::empty(DType::kI32, {N, mp}), Tensor::empty(DType::kI32, {N})};
  for (int64_t s = 0; s < N; ++s) {
    const int64_t kv = c.kv_lens[static_cast<size_t>(s)], pages = (kv + ps - 1) / ps, half = pages / 2;
    const int64_t first = second ? half : 0, last = second ? pages : half;
    for (int64_t j = 0; j < mp; ++j)
      i32(sh.table)[s * mp + j] = first + j < last ? d.page_table.data_as<int32_t>()[s * mp + first + j] : -7;
    i32(sh.kv_lens)[s] = static_cast<int32_t>(std::min(kv, last * ps) - first * ps);
  }
  return sh;
}

// vLLM's decode context parallelism (ANCHORS.md): each rank holds a share of every sequence's
// pages, runs the decode rows over its share, and the partial (o, lse) are merged by lse
// (primitives::lse_combine_row). Decode rows see every key of a share (causal changes nothing
// for the last position), so the merge is the whole result. The sink is one more logit of the
// softmax: it goes to exactly one shard — given to both, it counts twice (the second half).
TEST(PagedAttentionApi, DecodeContextParallelShardsMergeByLse) {
  testing::CaseSpec c;
  c.q_lens = {1, 1, 1}, c.kv_lens = {70, 33, 9}, c.page_size = 8, c.Hq = 8, c.Hkv = 2, c.D = 32, c.Dv = 24;
  c.sinks = true, c.causal = true;
  const testing::CaseData d = testing::make_case(c);
  const Shard a = shard_of(d, c, false), b = shard_of(d, c, true);
  for (const auto& info : implementations()) {
    if (!info.available || info.device != DeviceType::kCPU) continue;
    Options opt = testing::options_of(c);
    opt.implementation = info.name;
    const Result whole = compute(d.inputs(), opt);
    for (const bool sink_on_both : {false, true}) {
      Inputs ia = d.inputs(), ib = d.inputs();
      ia.page_table = a.table.view(), ia.kv_lens = a.kv_lens.view();
      ib.page_table = b.table.view(), ib.kv_lens = b.kv_lens.view();
      if (!sink_on_both) ib.sinks.reset();
      const Result ra = compute(ia, opt), rb = compute(ib, opt);
      double worst = 0.0;
      const size_t dv = static_cast<size_t>(c.Dv);
      std::vector<float> o_part(2 * dv), o(dv);
      for (int64_t r = 0; r < whole.lse.numel(); ++r) {  // (row, head) pairs
        const float lse_part[2] = {ra.lse.data_as<float>()[r], rb.lse.data_as<float>()[r]};
        float lse = 0.0f;
        std::memcpy(o_part.data(), ra.o.data_as<float>() + r * c.Dv, sizeof(float) * dv);
        std::memcpy(o_part.data() + dv, rb.o.data_as<float>() + r * c.Dv, sizeof(float) * dv);
        primitives::lse_combine_row(2, c.Dv, o_part.data(), c.Dv, lse_part, o.data(), &lse);
        worst = std::max(worst, double(std::fabs(lse - whole.lse.data_as<float>()[r])));
        for (size_t e = 0; e < dv; ++e)
          worst = std::max(worst, double(std::fabs(o[e] - whole.o.data_as<float>()[r * c.Dv + int64_t(e)])));
      }
      // Bound: the f32 sums of up to 71 exps on each side (71·2^-24 ≈ 4e-6 relative of l, so of
      // lse ≈ 4.5 absolute ~4e-6), the exps' and the combine's roundings: 2e-5, the suite's lse
      // tolerance. A dropped page or a sink counted twice moves lse by ~1e-2.
      if (sink_on_both)
        EXPECT_GT(worst, 1e-3) << info.name << ": a sink on both shards should count twice";
      else
        EXPECT_LE(worst, 2e-5) << info.name << ": merged shards differ from the whole";
    }
  }
}

}  // namespace
}  // namespace tessera::paged_attention
