// std::bad_alloc from deep inside a real implementation: this test binary replaces the global
// operator new with one that can be told to fail large requests, and the reference's dw
// accumulator (a std::vector<double> of H·V) is the first allocation to hit the limit. The call
// fails with Error(kOutOfMemory), and the next call, with allocation working again, succeeds.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <string>
#include <cstdlib>
#include <new>

#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace {
std::atomic<size_t> g_fail_from{0};  // 0: never fail
}  // namespace

void* operator new(size_t n) {
  const size_t limit = g_fail_from.load(std::memory_order_relaxed);
  if (limit && n >= limit) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
// The nothrow forms too (std::stable_sort's temporary buffer uses them): every new/delete pair in
// this binary must go through the same allocator, or ASan reports a new-vs-free mismatch.
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try { return ::operator new(n); } catch (...) { return nullptr; }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  try { return ::operator new(n); } catch (...) { return nullptr; }
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace tessera {
namespace {

namespace lce = linear_cross_entropy;

TEST(MemoryReliability, BadAllocInsideTheReferenceBecomesOutOfMemory) {
  const int64_t B = 4, H = 64, V = 4096;  // the reference's dw accumulator: H·V doubles = 2 MiB
  Tensor x = Tensor::empty(DType::kF32, {B, H}), w = Tensor::empty(DType::kF32, {H, V});
  Tensor y = Tensor::empty(DType::kI64, {B});
  for (int64_t i = 0; i < B * H; ++i) x.data_as<float>()[i] = 0.01f * static_cast<float>(i % 13);
  for (int64_t i = 0; i < H * V; ++i) w.data_as<float>()[i] = 0.001f * static_cast<float>(i % 7);
  for (int64_t i = 0; i < B; ++i) y.data_as<int64_t>()[i] = i;
  lce::Inputs in{x.view(), w.view(), std::nullopt, y.view(), std::nullopt};
  lce::Options opt;
  opt.implementation = "reference";

  g_fail_from = size_t{1} << 20;
  try {
    lce::compute_with_grad(in, opt);
    g_fail_from = 0;
    FAIL() << "no error";
  } catch (const Error& e) {
    g_fail_from = 0;
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("ran out of host memory"), std::string::npos) << e.what();
  } catch (...) {
    g_fail_from = 0;
    FAIL() << "not a tessera::Error";
  }
  const lce::Result r = lce::compute_with_grad(in, opt);
  EXPECT_TRUE(std::isfinite(r.loss.data_as<float>()[0]));
}

}  // namespace
}  // namespace tessera
