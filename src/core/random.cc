#include "core/random.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "tessera/error.h"
#include "tessera/exec.h"

namespace tessera {
namespace {

// Fills [0, n) in chunks on up to resolve_num_threads(0) threads (values depend on the index).
template <class Body>
void for_chunks(int64_t n, Body&& body) {
  constexpr int64_t kMinChunk = int64_t{1} << 16;
  const int threads = static_cast<int>(std::clamp<int64_t>(n / kMinChunk, 1, resolve_num_threads(0)));
  if (threads == 1) return body(0, n);
  std::vector<std::thread> pool;
  const int64_t per = (n + threads - 1) / threads;
  for (int t = 1; t < threads; ++t)
    pool.emplace_back([&, t] { body(std::min(n, t * per), std::min(n, (t + 1) * per)); });
  body(0, std::min(n, per));
  for (auto& th : pool) th.join();
}

}  // namespace

uint64_t random_bits(uint64_t seed, uint64_t i) noexcept {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + (i + 1) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double random_unit(uint64_t seed, uint64_t i) noexcept {
  return static_cast<double>(random_bits(seed, i) >> 11) * 0x1.0p-53;
}

void fill_uniform(Tensor& t, double lo, double hi, uint64_t seed) {
  check((is_float(t.dtype()) || t.dtype() == DType::kF8E4M3) && t.device().type == DeviceType::kCPU,
        ErrorCode::kInvalidArgument, "fill_uniform wants a host float tensor (f32, bf16, f16, f8e4m3)");
  void* data = t.data();
  const DType dt = t.dtype();
  for_chunks(t.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      store_from_f32(data, dt, i, static_cast<float>(lo + (hi - lo) * random_unit(seed, static_cast<uint64_t>(i))));
  });
}

Tensor random_uniform(DType dtype, Shape shape, float scale, uint64_t seed) {
  Tensor t = Tensor::empty(dtype, std::move(shape));
  fill_uniform(t, -scale, scale, seed);
  return t;
}

Tensor random_indices(DType dtype, Shape shape, int64_t n, uint64_t seed) {
  check(dtype == DType::kI32 || dtype == DType::kI64, ErrorCode::kInvalidArgument,
        "random_indices wants i32 or i64");
  check(n > 0, ErrorCode::kInvalidArgument, "random_indices wants n > 0");
  Tensor t = Tensor::empty(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t v = static_cast<int64_t>(random_bits(seed, static_cast<uint64_t>(i)) % static_cast<uint64_t>(n));
    if (dtype == DType::kI32) t.data_as<int32_t>()[i] = static_cast<int32_t>(v);
    else t.data_as<int64_t>()[i] = v;
  }
  return t;
}

}  // namespace tessera
