#include "kernels/bench_glue.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace tessera::kernels {

std::vector<harness::BaselineCall> forward_baseline(const std::vector<Pass>& passes, harness::BaselineCall c) {
  if (std::find(passes.begin(), passes.end(), Pass::kForward) == passes.end()) return {};
  c.pass = Pass::kForward;
  std::vector<harness::BaselineCall> out;
  out.push_back(std::move(c));
  return out;
}

Tensor shuffled_page_table(int64_t rows, int64_t pages, uint64_t seed) {
  Tensor t = Tensor::empty(DType::kI32, {rows, pages});
  int32_t* ids = t.data_as<int32_t>();
  std::iota(ids, ids + rows * pages, 0);
  std::shuffle(ids, ids + rows * pages, std::mt19937_64(seed));
  return t;
}

}  // namespace tessera::kernels
