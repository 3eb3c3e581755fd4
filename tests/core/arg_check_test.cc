// dispatch::ArgCheck: the one-line argument errors every kernel's API raises before it writes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/arg_check.h"
#include "dispatch/host_f32.h"
#include "core/invalid_argument.h"
#include "tessera/error.h"

namespace tessera::dispatch {
namespace {

template <class F>
std::string message_of(F&& f) {
  return testing_errors::invalid_argument_message(std::forward<F>(f));
}

TEST(ArgCheck, EachCheckNamesTheKernelAndTheArgument) {
  const ArgCheck a{"foo", "x"};
  Tensor x = Tensor::zeros(DType::kF32, {2, 3});
  const Device cpu = Device::cpu();
  EXPECT_EQ((message_of([&] { a.tensor(x.view(), cpu, {2, 3}, DType::kF32, "x"); })), "");
  EXPECT_EQ((message_of([&] { a.shape(x.view(), {3, 2}, "y"); })), "foo: y must have shape [3, 2], got [2, 3]");
  EXPECT_EQ((message_of([&] { a.dtype(x.view(), DType::kBF16, "y"); })), "foo: y must be bf16, got f32");
  EXPECT_EQ((message_of([&] { a.device(x.view(), Device{DeviceType::kCUDA, 0}, "y"); })),
            "foo: y is on " + cpu.str() + " but x is on " + (Device{DeviceType::kCUDA, 0}).str());
  const Tensor t = x.as_strided({3, 2}, {1, 3});
  EXPECT_EQ((message_of([&] { a.plain(t.view(), cpu, "y"); })),
            "foo: y must be contiguous (row-major), got strides [1, 3] for shape [3, 2]");
  TensorView null = x.view();
  null.data = nullptr;
  EXPECT_EQ((message_of([&] { a.plain(null, cpu, "y"); })), "foo: y has no data (null pointer)");
  EXPECT_EQ((message_of([&] { a.need(false, "no"); })), "foo: no");
}

TEST(ArgCheck, DtypeKindsAndHostTensors) {
  const ArgCheck a{"foo", "x"};
  const Tensor f = Tensor::zeros(DType::kBF16, {2}), i = Tensor::zeros(DType::kI64, {2});
  EXPECT_EQ((message_of([&] { a.floating(f.view(), "x"); })), "");
  EXPECT_EQ((message_of([&] { a.floating(i.view(), "x"); })), "foo: x must be f32, bf16 or f16, got i64");
  EXPECT_EQ((message_of([&] { a.integer(i.view(), "s"); })), "");
  EXPECT_EQ((message_of([&] { a.integer(f.view(), "s"); })), "foo: s must be int32 or int64, got bf16");
  EXPECT_EQ((message_of([&] { a.host(i.view(), "s"); })), "");
  TensorView dev = i.view();
  dev.device = Device{DeviceType::kCUDA, 0};
  EXPECT_EQ((message_of([&] { a.host(dev, "s"); })), "foo: s must be in host memory (also for device inputs), got cuda:0");
}

// dispatch/host_f32.h: f32 views of host tensors (the caller's buffer when f32), and back.
TEST(HostF32, InputsOutputsAndRoundedGradients) {
  Tensor f = Tensor::empty(DType::kF32, {3}), b = Tensor::empty(DType::kBF16, {3});
  for (int i = 0; i < 3; ++i) f.data_as<float>()[i] = 1.0f + 0x1p-12f * float(i), store_from_f32(b.data(), DType::kBF16, i, 1.5f * float(i));
  EXPECT_EQ(as_f32(f.view()).ptr, f.data_as<float>());
  const F32In in = as_f32(b.view());
  EXPECT_EQ(in.ptr[2], 3.0f);
  EXPECT_EQ(as_f32(TensorView{}).ptr, nullptr);
  const F32Out out = as_f32_out(b.view());
  out.ptr[1] = 2.0f;
  out.finish();
  EXPECT_EQ(load_as_f32(b.data(), DType::kBF16, 1), 2.0f);
  EXPECT_EQ(as_f32_out(f.view()).ptr, f.data_as<float>());
  Tensor keep;
  const TensorView r = in_dtype(f.view(), DType::kBF16, keep);
  EXPECT_EQ(r.dtype, DType::kBF16);
  EXPECT_EQ(load_as_f32(r.data, DType::kBF16, 2), 1.0f);  // 1 + 2^-11 rounds to 1 in bf16
  EXPECT_EQ(in_dtype(b.view(), DType::kBF16, keep).data, b.data());  // already in the dtype
}

TEST(ArgCheck, OutputsAreF32OrTheInputsDtype) {
  const ArgCheck a{"foo", "x"};
  Tensor bf = Tensor::zeros(DType::kBF16, {2}), f16 = Tensor::zeros(DType::kF16, {2});
  EXPECT_EQ((message_of([&] { a.output(bf.view(), DType::kBF16, {2}, Device::cpu(), "o"); })), "");
  EXPECT_EQ((message_of([&] { a.output(f16.view(), DType::kBF16, {2}, Device::cpu(), "o"); })),
            "foo: o must be f32 or bf16, got f16");
  EXPECT_EQ((message_of([&] { a.output(f16.view(), DType::kF32, {2}, Device::cpu(), "o"); })), "foo: o must be f32, got f16");
}

TEST(ArgCheck, FiniteLooksAtHostDataOnly) {
  const ArgCheck a{"foo", "x"};
  Tensor x = Tensor::zeros(DType::kF32, {3});
  EXPECT_TRUE(all_finite(x.view()));
  x.data_as<float>()[1] = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(all_finite(x.view()));
  EXPECT_TRUE(all_finite(x.view(), /*allow_neg_inf=*/true));
  EXPECT_EQ((message_of([&] { a.finite(x.view(), "x"); })), "foo: x contains NaN or Inf");
  x.data_as<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(all_finite(x.view(), true));
  EXPECT_TRUE(given(x.view()));
  EXPECT_FALSE(given(TensorView{}));
}

TEST(ArgCheck, TogetherAndExactlyWithNameEveryTensorOfTheGroup) {
  const ArgCheck a{"foo", "x"};
  Tensor t = Tensor::zeros(DType::kF32, {2});
  const TensorView v = t.view(), none{};
  bool all = false;
  EXPECT_EQ((message_of([&] { all = a.together({{"c0", v}, {"n0", v}, {"m0", v}}); })), "");
  EXPECT_TRUE(all);
  EXPECT_EQ((message_of([&] { all = a.together({{"c0", none}, {"n0", none}}); })), "");
  EXPECT_FALSE(all);
  EXPECT_EQ((message_of([&] { a.together({{"c0", v}, {"n0", none}, {"m0", v}}); })),
            "foo: c0, n0 and m0 go together: give all or none, got 2 of 3");
  EXPECT_EQ((message_of([&] { a.exactly_with(true, "a state", {{"dc0", v}, {"dn0", none}}); })),
            "foo: dc0 and dn0 are required with a state");
  EXPECT_EQ((message_of([&] { a.exactly_with(false, "a state", {{"dc0", none}, {"dn0", v}}); })),
            "foo: dc0 and dn0 are written only with a state");
  EXPECT_EQ((message_of([&] { EXPECT_TRUE(a.exactly_with(true, "a state", {{"dc0", v}, {"dn0", v}})); })), "");
  EXPECT_EQ((message_of([&] { EXPECT_FALSE(a.exactly_with(false, "a state", {{"dc0", none}})); })), "");
}

TEST(ArgCheck, PositiveNamesTheFirstElementThatIsNot) {
  const ArgCheck a{"foo", "x"};
  Tensor n = Tensor::zeros(DType::kBF16, {3});
  for (int i = 0; i < 3; ++i) store_from_f32(n.data(), DType::kBF16, i, 1.0f);
  EXPECT_EQ((message_of([&] { a.positive(n.view(), "n0", "a normalizer"); })), "");
  store_from_f32(n.data(), DType::kBF16, 2, -0.0f);
  EXPECT_EQ((message_of([&] { a.positive(n.view(), "n0", "a normalizer"); })),
            "foo: n0 must be > 0 everywhere (a normalizer), got n0[2] = -0.000000");
  store_from_f32(n.data(), DType::kBF16, 1, std::numeric_limits<float>::quiet_NaN());
  EXPECT_NE((message_of([&] { a.positive(n.view(), "n0", "a normalizer"); })).find("got n0[1] = "), std::string::npos);
  Tensor counts = Tensor::zeros(DType::kI32, {2});
  counts.data_as<int32_t>()[0] = 3;
  EXPECT_EQ((message_of([&] { a.positive(counts.view(), "lens", "a count"); })),
            "foo: lens must be > 0 everywhere (a count), got lens[1] = 0.000000");
  counts.data_as<int32_t>()[1] = 1;
  EXPECT_EQ((message_of([&] { a.positive(counts.view(), "lens", "a count"); })), "");
  TensorView on_device = n.view();
  on_device.device = Device{DeviceType::kCUDA, 0};  // device data is not inspected
  EXPECT_EQ((message_of([&] { a.positive(on_device, "n0", "a normalizer"); })), "");
}

TEST(HostF32, FlagsAreZeroOrOneBytesOfAnIntegerMask) {
  Tensor m = Tensor::zeros(DType::kI64, {4});
  m.data_as<int64_t>()[1] = 7, m.data_as<int64_t>()[3] = -1;
  std::vector<uint8_t> keep;
  const uint8_t* f = as_flags(m.view(), keep);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(std::vector<uint8_t>(f, f + 4), (std::vector<uint8_t>{0, 1, 0, 1}));
  EXPECT_EQ(as_flags(TensorView{}, keep), nullptr);
}

}  // namespace
}  // namespace tessera::dispatch

namespace tessera::dispatch {
namespace {

// The shared scalar checks: values the f32 backends would see as inf are refused.
TEST(ArgCheck, ScalarsMustBeFiniteInF32) {
  const ArgCheck a{"foo", "q"};
  EXPECT_DOUBLE_EQ(a.softmax_scale(std::nullopt, 16), 0.25);
  EXPECT_DOUBLE_EQ(a.softmax_scale(3.0, 16), 3.0);
  const double f32_max = std::numeric_limits<float>::max();
  EXPECT_DOUBLE_EQ(a.softmax_scale(f32_max, 16), f32_max);  // the largest that stays finite
  for (double bad : {0.0, -1.0, 1e39, std::nan(""), std::numeric_limits<double>::infinity()})
    EXPECT_NE(message_of([&] { a.softmax_scale(bad, 16); }).find("foo: scale must be finite in f32 and > 0"),
              std::string::npos)
        << bad;
  EXPECT_EQ(message_of([&] { a.nonnegative_f32(0.0, "softcap"); }), "");
  EXPECT_EQ(message_of([&] { a.nonnegative_f32(1e39, "z"); }),
            "foo: z must be finite in f32 and >= 0, got 1e+39");
  EXPECT_EQ(message_of([&] { a.softcap(1e-39, "cap"); }),
            "foo: cap must be 0 (off) or in [1.17549435e-38, 3.40282347e+38] (a normal f32), got 1e-39");
  // Just past FLT_MAX prints apart from it (6 digits printed both as 3.40282e+38).
  EXPECT_NE(message_of([&] { a.softcap(3.4028236e38, "cap"); }).find("got 3.4028236e+38"), std::string::npos);
  EXPECT_NE(message_of([&] { a.nonnegative_f32(-0.5, "eps"); }), "");
  EXPECT_NE(message_of([&] { a.nonnegative_f32(std::nan(""), "eps"); }), "");
  EXPECT_EQ(a.window(-1, "window"), -1);
  EXPECT_EQ(a.window(7, "window", 8), 7);
  EXPECT_EQ(a.window(8, "window", 8), -1);  // reaches every key: unbounded
  EXPECT_EQ(a.window(std::numeric_limits<int64_t>::max(), "window", 8), -1);
  EXPECT_EQ(message_of([&] { a.softcap(0.0, "cap"); }), "");
  EXPECT_EQ(message_of([&] { a.softcap(std::numeric_limits<float>::min(), "cap"); }), "");
  for (double bad : {-1.0, 1e-39, 1e-300, 1e39, std::nan("")})
    EXPECT_NE(message_of([&] { a.softcap(bad, "cap"); }).find("foo: cap must be 0 (off) or in ["), std::string::npos) << bad;
  EXPECT_EQ(message_of([&] { a.window(-2, "window"); }), "foo: window must be >= 0 or -1 (unbounded), got -2");
}

TEST(ArgCheck, OffsetsNameTheSequence) {
  const ArgCheck a{"foo", "q"};
  auto offsets = [&](std::vector<int32_t> v, int64_t total) {
    return message_of([&] {
      a.offsets(TensorView(v.data(), DType::kI32, {static_cast<int64_t>(v.size())}), total, "cu", "rows of q");
    });
  };
  std::vector<int32_t> ok{0, 2, 2, 7};
  EXPECT_EQ(a.offsets(TensorView(ok.data(), DType::kI32, {4}), 7, "cu", "rows of q"), 5);  // the longest
  EXPECT_EQ(offsets({0, 2, 2, 7}, 7), "");
  EXPECT_EQ(offsets({1, 2}, 2), "foo: cu[0] must be 0, got 1");
  EXPECT_EQ(offsets({0, 3, 2, 7}, 7), "foo: sequence 1: cu must be non-decreasing, got cu[1] = 3 then cu[2] = 2");
  EXPECT_EQ(offsets({0, 2, 6}, 7), "foo: sequence 1: cu[N=2] = 6 must equal the rows of q (7)");
  EXPECT_EQ(offsets({0}, 1), "foo: no sequences (N=0): cu[N=0] = 0 must equal the rows of q (1)");
  EXPECT_EQ(offsets({}, 0), "foo: cu must be [N+1] with N >= 0, got [0]");
}

TEST(ArgCheck, PagesReadOnlyWhatTheLengthsUse) {
  const ArgCheck a{"foo", "q"};
  // 2 sequences, 2 pages of 4 slots each at most, 3 pages in the cache. Sequence 1 uses one page:
  // its unused entry may hold anything.
  std::vector<int32_t> table{2, 0, 1, -7}, lens{5, 4};
  auto pages = [&] { return message_of([&] { a.pages({table.data(), lens.data(), 2, 2, 4, 3}, "pt", "lens"); }); };
  EXPECT_EQ(pages(), "");
  lens[1] = 5;
  EXPECT_EQ(pages(), "foo: sequence 1: pt[1, 1] = -7 is not a page of the cache [0, P=3)");
  lens[1] = 9;
  EXPECT_EQ(pages(), "foo: sequence 1: lens[1] = 9 is outside [0, max_pages·page_size = 2·4]");
  lens[1] = -1;
  EXPECT_EQ(pages(), "foo: sequence 1: lens[1] = -1 is outside [0, max_pages·page_size = 2·4]");
  lens = {0, 0};
  table[0] = 3;  // a length of 0 reads no page
  EXPECT_EQ(pages(), "");
  lens[0] = 1;
  EXPECT_EQ(pages(), "foo: sequence 0: pt[0, 0] = 3 is not a page of the cache [0, P=3)");
  // max_pages·page_size past INT64_MAX: compared without the product (it read as a negative bound).
  table = {0, 1, 2, 0};
  lens = {0, 5};
  EXPECT_EQ(message_of([&] { a.pages({table.data(), lens.data(), 2, 2, int64_t{1} << 62, 3}, "pt", "lens"); }), "");
  EXPECT_EQ(message_of([&] { a.pages({table.data(), lens.data(), 2, 2, 0, 3}, "pt", "lens"); }),
            "foo: page_size must be >= 1, got 0");
}

}  // namespace
}  // namespace tessera::dispatch
