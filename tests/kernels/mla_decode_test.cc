// mla_decode: the reference against hand values, and the API's error paths (each rejected call
// leaves every output untouched).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tessera/error.h"
#include "tessera/mla_decode.h"

namespace tessera {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// A hand-made cache: D = 2, page_size 1, three pages; page 1 is never read (NaN). Key j = 0 is
// page 2 = [10, 0], key j = 1 is page 0 = [20, ln 3]. With q = [0, 1] and scale 1 the scores are
// s = [0, ln 3]: lse = ln 4, weights [1/4, 3/4], and with dv = 1 (values = first dim)
// o = 10/4 + 20·3/4 = 17.5. A head with q = [0, 0] weighs both keys equally: lse = ln 2, o = 15.
struct Hand {
  std::vector<float> kv = {20.f, std::log(3.f), kNaN, kNaN, 10.f, 0.f};  // [3, 1, 1, 2]
  std::vector<int32_t> pt = {2, 0};                                     // [1, 2]
  std::vector<int32_t> L = {2};
  std::vector<float> q;
  std::vector<float> o, lse;
  int64_t Sq = 1, Hq = 1;
  Hand(std::vector<float> qv, int64_t sq, int64_t hq) : q(std::move(qv)), Sq(sq), Hq(hq) {
    o.assign(static_cast<size_t>(Sq * Hq), -7.f);
    lse.assign(static_cast<size_t>(Sq * Hq), -7.f);
  }
  std::string run(mla_decode::Options opt, const std::string& impl = "reference") {
    opt.implementation = impl;
    opt.dv = 1;
    const mla_decode::Inputs in{TensorView(q.data(), DType::kF32, {1, Sq, Hq, 2}),
                                TensorView(kv.data(), DType::kF32, {3, 1, 1, 2}),
                                TensorView(pt.data(), DType::kI32, {1, 2}), TensorView(L.data(), DType::kI32, {1})};
    return mla_decode::forward(in, {TensorView(o.data(), DType::kF32, {1, Sq, Hq, 1}),
                                    TensorView(lse.data(), DType::kF32, {1, Sq, Hq})},
                               opt);
  }
};

mla_decode::Options scale_one() {
  mla_decode::Options opt;
  opt.scale = 1.0;
  return opt;
}

TEST(MlaDecodeReference, MatchesHandValues) {
  Hand h({0.f, 1.f, 0.f, 0.f}, 1, 2);
  EXPECT_EQ(h.run(scale_one()), "reference");
  EXPECT_NEAR(h.o[0], 17.5f, 1e-5);
  EXPECT_NEAR(h.lse[0], std::log(4.f), 1e-6);
  EXPECT_NEAR(h.o[1], 15.f, 1e-5);
  EXPECT_NEAR(h.lse[1], std::log(2.f), 1e-6);
}

// An f8e4m3 cache dequantized by kv_scale 2.5: raw key 0 (page 2) = [4, 0], key 1 (page 0) =
// [8, 0.5], page 1 NaN: c = [10, 0] and [20, 1.25]. With q = [0, 1], scale 1: s = [0, 1.25], and
// dv = 1: o = (10 + 20·e^1.25) / (1 + e^1.25). Without the scale (1): s = [0, 0.5], o from 4 and 8.
// The reference and cpu alike.
TEST(MlaDecodeReference, F8CacheIsDequantizedByKvScale) {
  std::vector<uint8_t> kv = {0x50, 0x30, 0x7f, 0x7f, 0x48, 0x00};  // [3, 1, 1, 2]
  std::vector<int32_t> pt = {2, 0}, L = {2};
  std::vector<float> q = {0.f, 1.f};
  for (const char* impl : {"reference", "cpu"}) {
    const auto run = [&](double kv_scale) {
      float o = -7.f, lse = -7.f;
      mla_decode::Options opt = scale_one();
      opt.implementation = impl, opt.dv = 1, opt.kv_scale = kv_scale;
      mla_decode::forward({TensorView(q.data(), DType::kF32, {1, 1, 1, 2}), TensorView(kv.data(), DType::kF8E4M3, {3, 1, 1, 2}),
                           TensorView(pt.data(), DType::kI32, {1, 2}), TensorView(L.data(), DType::kI32, {1})},
                          {TensorView(&o, DType::kF32, {1, 1, 1, 1}), TensorView(&lse, DType::kF32, {1, 1, 1})}, opt);
      return std::pair<double, double>{o, lse};
    };
    const double e = std::exp(1.25), h = std::exp(0.5);
    const auto [o, lse] = run(2.5);
    EXPECT_NEAR(o, (10 + 20 * e) / (1 + e), 1e-5) << impl;
    EXPECT_NEAR(lse, std::log(1 + e), 1e-6) << impl;
    const auto [o1, lse1] = run(1.0);
    EXPECT_NEAR(o1, (4 + 8 * h) / (1 + h), 1e-5) << impl;
    EXPECT_NEAR(lse1, std::log(1 + h), 1e-6) << impl;
  }
}

TEST(MlaDecodeReference, DefaultScaleIsOneOverSqrtD) {
  Hand h({0.f, 1.f}, 1, 1);
  h.run({});
  const double e = std::pow(3.0, 1.0 / std::sqrt(2.0));  // exp(ln 3 / √2)
  EXPECT_NEAR(h.lse[0], std::log(1.0 + e), 1e-6);
  EXPECT_NEAR(h.o[0], (10.0 + 20.0 * e) / (1.0 + e), 1e-5);
}

// Causal, Sq = 2, L = 2: query 0 sits at position 0 and sees key 0 only (lse 0, o 10); query 1
// at position 1 sees both.
TEST(MlaDecodeReference, CausalQueriesSitAtTheEnd) {
  mla_decode::Options opt = scale_one();
  opt.causal = true;
  Hand h({0.f, 1.f, 0.f, 1.f}, 2, 1);
  h.run(opt);
  EXPECT_NEAR(h.o[0], 10.f, 1e-6);
  EXPECT_NEAR(h.lse[0], 0.f, 1e-6);
  EXPECT_NEAR(h.o[1], 17.5f, 1e-5);
  EXPECT_NEAR(h.lse[1], std::log(4.f), 1e-6);
}

// Causal, Sq = 2, L = 1: query 0 sits at position −1 and sees nothing (o 0, lse −inf).
TEST(MlaDecodeReference, RowThatSeesNothingIsZeroAndMinusInf) {
  mla_decode::Options opt = scale_one();
  opt.causal = true;
  Hand h({0.f, 1.f, 0.f, 1.f}, 2, 1);
  h.L = {1};
  h.run(opt);
  EXPECT_EQ(h.o[0], 0.f);
  EXPECT_EQ(h.lse[0], -kInf);
  EXPECT_NEAR(h.o[1], 10.f, 1e-6);
  EXPECT_NEAR(h.lse[1], 0.f, 1e-6);
  Hand e({0.f, 1.f}, 1, 1);  // L = 0, not causal
  e.L = {0};
  e.run(scale_one());
  EXPECT_EQ(e.o[0], 0.f);
  EXPECT_EQ(e.lse[0], -kInf);
}

// ---- errors: thrown before anything is written, naming the fault ----
void expect_rejected(Hand& h, const mla_decode::Options& opt, const std::string& needle) {
  try {
    h.run(opt);
    ADD_FAILURE() << "accepted; wanted an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  for (float v : h.o) EXPECT_EQ(v, -7.f);
  for (float v : h.lse) EXPECT_EQ(v, -7.f);
}

TEST(MlaDecodeApi, BadPageIdNamesTheBatch) {
  Hand h({0.f, 1.f}, 1, 1);
  h.pt = {2, 3};
  expect_rejected(h, {}, "page_table[0, 1] = 3");
  h.pt = {-1, 0};
  expect_rejected(h, {}, "page_table[0, 0] = -1");
  h.pt = {2, 7};  // unused entry (L = 1): never read, so accepted
  h.L = {1};
  EXPECT_NO_THROW(h.run(scale_one()));
}

TEST(MlaDecodeApi, BadLengthNamesTheBatch) {
  Hand h({0.f, 1.f}, 1, 1);
  h.L = {3};
  expect_rejected(h, {}, "cache_seqlens[0] = 3");
  h.L = {-1};
  expect_rejected(h, {}, "cache_seqlens[0] = -1");
}

// INT_MAX threads (resolve_num_threads caps them): the cpu backend's per-thread work lists once
// took 9 GB and hung on this 2-key problem.
TEST(MlaDecodeApi, AHugeThreadCountRuns) {
  Hand h({0.f, 1.f}, 1, 1);
  mla_decode::Options opt = scale_one();
  opt.num_threads = std::numeric_limits<int>::max();
  h.run(opt, "");  // the default order: cpu where built
  EXPECT_NEAR(h.o[0], 17.5f, 1e-4f);
}

// check_finite (the CLI's default) scans q; a NaN there came back as o = 0, lse = -inf.
TEST(MlaDecodeApi, CheckFiniteScansQ) {
  Hand h({0.f, 1.f}, 1, 1);
  h.q[0] = NAN;
  mla_decode::Options opt = scale_one();
  opt.check_finite = true;
  expect_rejected(h, opt, "q contains NaN or Inf");
}

// An output that shares memory with an input (o written into the cache that later rows read) or
// with the other output is refused before anything is written.
TEST(MlaDecodeApi, OutputsThatAliasInputsAreRefused) {
  Hand h({0.f, 1.f}, 1, 1);
  const std::vector<float> kv = h.kv;
  const mla_decode::Inputs in{TensorView(h.q.data(), DType::kF32, {1, 1, 1, 2}),
                              TensorView(h.kv.data(), DType::kF32, {3, 1, 1, 2}),
                              TensorView(h.pt.data(), DType::kI32, {1, 2}), TensorView(h.L.data(), DType::kI32, {1})};
  mla_decode::Options opt = scale_one();
  opt.dv = 1;
  const TensorView o(h.o.data(), DType::kF32, {1, 1, 1, 1}), lse(h.lse.data(), DType::kF32, {1, 1, 1});
  const auto refused = [&](const TensorView& oo, const TensorView& ll, const std::string& needle) {
    for (const char* impl : {"reference", ""}) {
      opt.implementation = impl;
      try {
        mla_decode::forward(in, {oo, ll}, opt);
        ADD_FAILURE() << "accepted; wanted '" << needle << "'";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    }
  };
  refused(TensorView(h.kv.data() + 4, DType::kF32, {1, 1, 1, 1}), lse, "o shares memory with kv_cache");
  refused(o, TensorView(h.o.data(), DType::kF32, {1, 1, 1}), "o shares memory with lse: outputs must not alias each other");
  refused(o, TensorView(h.q.data() + 1, DType::kF32, {1, 1, 1}), "lse shares memory with q");
  EXPECT_EQ(std::memcmp(kv.data(), h.kv.data(), kv.size() * sizeof(float)), 0) << "the cache was written";
  EXPECT_EQ(h.o[0], -7.f);
  EXPECT_EQ(h.lse[0], -7.f);
  opt.implementation = "reference";
  mla_decode::forward(in, {o, lse}, opt);  // apart: it runs
  EXPECT_NEAR(h.o[0], 17.5f, 1e-5f);
}

TEST(MlaDecodeApi, DvAndScale) {
  Hand h({0.f, 1.f}, 1, 1);
  // Hand::run sets dv = 1; through the public call directly for dv = 3 > D = 2.
  mla_decode::Options opt;
  opt.dv = 3;
  opt.implementation = "reference";
  std::vector<float> o(3, -7.f), lse(1, -7.f);
  const mla_decode::Inputs in{TensorView(h.q.data(), DType::kF32, {1, 1, 1, 2}),
                              TensorView(h.kv.data(), DType::kF32, {3, 1, 1, 2}),
                              TensorView(h.pt.data(), DType::kI32, {1, 2}), TensorView(h.L.data(), DType::kI32, {1})};
  EXPECT_THROW(mla_decode::forward(in, {TensorView(o.data(), DType::kF32, {1, 1, 1, 3}),
                                        TensorView(lse.data(), DType::kF32, {1, 1, 1})},
                                   opt),
               Error);
  EXPECT_EQ(o[0], -7.f);
  mla_decode::Options bad;
  bad.scale = -1.0;
  expect_rejected(h, bad, "scale");
  bad.scale = std::nan("");
  expect_rejected(h, bad, "scale");
  bad.scale = 1e39;  // finite as a double, inf in the f32 backends
  expect_rejected(h, bad, "scale must be finite in f32 and > 0");
  mla_decode::Options kv = scale_one();
  kv.kv_scale = 0.0;
  expect_rejected(h, kv, "kv_scale must be finite in f32 and > 0, got 0");
  kv.kv_scale = 1e-50;  // 0 in f32
  expect_rejected(h, kv, "kv_scale must be finite in f32 and > 0");
  kv.kv_scale = 1e20, kv.scale = 1e20;  // each finite in f32, the product not
  expect_rejected(h, kv, "scale * kv_scale must be finite in f32 and > 0");
}

TEST(MlaDecodeApi, ShapesAndDtypes) {
  Hand h({0.f, 1.f}, 1, 1);
  const mla_decode::Options opt;
  auto call = [&](TensorView q, TensorView kv, TensorView pt, TensorView L, TensorView o, TensorView lse) {
    mla_decode::Options o2 = opt;
    o2.dv = 1;
    o2.implementation = "reference";
    mla_decode::forward({q, kv, pt, L}, {o, lse}, o2);
  };
  const TensorView q(h.q.data(), DType::kF32, {1, 1, 1, 2}), kv(h.kv.data(), DType::kF32, {3, 1, 1, 2});
  const TensorView pt(h.pt.data(), DType::kI32, {1, 2}), L(h.L.data(), DType::kI32, {1});
  const TensorView o(h.o.data(), DType::kF32, {1, 1, 1, 1}), lse(h.lse.data(), DType::kF32, {1, 1, 1});
  auto rejects = [&](auto f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(h.o[0], -7.f);
    EXPECT_EQ(h.lse[0], -7.f);
  };
  rejects([&] { call(TensorView(h.q.data(), DType::kF32, {1, 1, 2}), kv, pt, L, o, lse); }, "q must be");
  rejects([&] { call(q, TensorView(h.kv.data(), DType::kF32, {3, 1, 2}), pt, L, o, lse); }, "kv_cache must be");
  rejects([&] { call(q, TensorView(h.kv.data(), DType::kF32, {1, 3, 2, 1}), pt, L, o, lse); }, "kv_cache must be");
  rejects([&] { call(q, TensorView(h.kv.data(), DType::kBF16, {3, 1, 1, 2}), pt, L, o, lse); },
          "kv_cache must be f32 (q's dtype) or f8e4m3, got bf16");
  rejects([&] { call(TensorView(h.q.data(), DType::kF8E4M3, {1, 1, 1, 2}), kv, pt, L, o, lse); },
          "q must be f32, bf16 or f16, got f8e4m3");
  rejects([&] { call(q, TensorView(h.kv.data(), DType::kF32, {6, 1, 1, 1}), pt, L, o, lse); }, "D=2]");
  rejects([&] { call(q, kv, TensorView(h.pt.data(), DType::kI64, {1, 1}), L, o, lse); }, "page_table must be");
  rejects([&] { call(q, kv, pt, TensorView(h.pt.data(), DType::kI32, {2}), o, lse); }, "cache_seqlens must be");
  rejects([&] { call(q, kv, pt, L, TensorView(h.o.data(), DType::kF32, {1, 1, 1, 2}), lse); }, "o must be");
  rejects([&] { call(q, kv, pt, L, TensorView(h.o.data(), DType::kF16, {1, 1, 1, 1}), lse); }, "o must be f32");
  rejects([&] { call(q, kv, pt, L, o, TensorView(h.lse.data(), DType::kF32, {1, 1})); }, "lse must be");
  // Places: kv_cache, o and lse on q's device; page_table and cache_seqlens in host memory.
  const auto on_cuda = [](TensorView t) {
    t.device = Device::cuda();
    return t;
  };
  rejects([&] { call(q, on_cuda(kv), pt, L, o, lse); }, "kv_cache is on cuda:0 but q is on cpu");
  rejects([&] { call(q, kv, on_cuda(pt), L, o, lse); }, "page_table must be in host memory");
  rejects([&] { call(q, kv, pt, on_cuda(L), o, lse); }, "cache_seqlens must be in host memory");
  rejects([&] { call(q, kv, pt, L, on_cuda(o), lse); }, "o is on cuda:0 but q is on cpu");
}

}  // namespace
}  // namespace tessera
