// Size limits and allocation failure: a request that cannot fit fails before anything is
// allocated, with an error that names the size; std::bad_alloc anywhere becomes
// Error(kOutOfMemory); an element count past int64 is an error, not an overflow.
#include <gtest/gtest.h>

#include <new>
#include <string>

#include "core/memory.h"
#include "dispatch/dispatch.h"
#include "reliability/test_util.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera {
namespace {

namespace lce = linear_cross_entropy;
using reliability::ScopedEnv;

ErrorCode code_of(const std::function<void()>& f, std::string* msg = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (msg) *msg = e.what();
    return e.code();
  }
  ADD_FAILURE() << "no error";
  return ErrorCode::kInternal;
}

TEST(MemoryReliability, TensorLargerThanTheMachineNamesItsSize) {
  std::string m;
  EXPECT_EQ(code_of([] { Tensor::empty(DType::kF32, {int64_t{1} << 40}); }, &m), ErrorCode::kOutOfMemory);
  EXPECT_NE(m.find("4398046511104 bytes (4096.0 GiB)"), std::string::npos) << m;
  EXPECT_NE(m.find("f32[1099511627776]"), std::string::npos) << m;
  EXPECT_NE(m.find("nothing was allocated"), std::string::npos) << m;
}

TEST(MemoryReliability, ElementCountPastInt64IsAnError) {
  EXPECT_EQ(code_of([] { Tensor::empty(DType::kF32, {int64_t{1} << 40, int64_t{1} << 30}); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { (void)shape_numel({int64_t{1} << 62, 4}); }), ErrorCode::kInvalidArgument);
  // Fits in int64 elements, not in a 64-bit byte count.
  EXPECT_EQ(code_of([] { Tensor::empty(DType::kI64, {int64_t{1} << 62}); }), ErrorCode::kOutOfMemory);
}

TEST(MemoryReliability, LimitCanBeLowered) {
  ScopedEnv env("TESSERA_HOST_MEMORY_LIMIT", "1000000");
  EXPECT_EQ(memory::host_memory_limit(), 1000000u);
  std::string m;
  EXPECT_EQ(code_of([] { Tensor::empty(DType::kF32, {500000}); }, &m), ErrorCode::kOutOfMemory);
  EXPECT_NE(m.find("2000000 bytes"), std::string::npos) << m;
  EXPECT_EQ(code_of([] { memory::host_alloc(2000000); }, &m), ErrorCode::kOutOfMemory);
  EXPECT_NE(m.find("host scratch"), std::string::npos) << m;
  EXPECT_NO_THROW(Tensor::empty(DType::kF32, {1000}));
}

// std::bad_alloc from inside an implementation (a std::vector, a library) is a Tessera error,
// and falls back like any other out-of-memory failure.
TEST(MemoryReliability, BadAllocInAnImplementationBecomesAnError) {
  dispatch::Callbacks cb;
  cb.exists = [](const std::string&) { return true; };
  cb.supports = [](const std::string&) { return dispatch::Availability::yes(); };
  cb.run = [](const std::string& n) {
    if (n == "big") throw std::bad_alloc();
  };
  std::string m;
  EXPECT_EQ(code_of([&] { dispatch::run("k", dispatch::make_plan("big", {"big", "small"}), cb); }, &m),
            ErrorCode::kOutOfMemory);  // a single named implementation: fails at once
  EXPECT_NE(m.find("ran out of host memory"), std::string::npos) << m;
  EXPECT_EQ(dispatch::run("k", dispatch::make_plan("", {"big", "small"}), cb), "small");
  cb.run = [](const std::string&) { throw std::bad_alloc(); };
  EXPECT_EQ(code_of([&] { dispatch::run("k", dispatch::make_plan("", {"big", "small"}), cb); }, &m),
            ErrorCode::kUnsupported);
  EXPECT_NE(m.find("ran out of host memory"), std::string::npos) << m;
}

// A linear_cross_entropy problem whose gradient cannot fit: dw like w would be 1 TiB. The call
// fails with the size before any output is allocated past the small ones, and w's memory
// (which is not really there) is never read.
TEST(MemoryReliability, LceProblemThatCannotFitFailsBeforeRunning) {
  const int64_t B = 4, H = 1 << 16, V = int64_t{1} << 22;
  Tensor x = Tensor::empty(DType::kF32, {B, H});
  Tensor labels = Tensor::empty(DType::kI64, {B});
  for (int64_t i = 0; i < B; ++i) labels.data_as<int64_t>()[i] = i;
  Tensor w_small = Tensor::empty(DType::kF32, {16});
  lce::Inputs in;
  in.x = x.view();
  in.w = TensorView(w_small.data(), DType::kF32, {H, V});  // a view of 1 TiB that is not there
  in.labels = labels.view();
  lce::Options opt;
  opt.implementation = "reference";
  std::string m;
  EXPECT_EQ(code_of([&] { lce::compute_with_grad(in, opt); }, &m), ErrorCode::kOutOfMemory);
  EXPECT_NE(m.find("1099511627776 bytes (1024.0 GiB)"), std::string::npos) << m;
}

}  // namespace
}  // namespace tessera
