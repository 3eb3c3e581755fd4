// grouped_matmul: the reference implementation (the oracle).
//
// Plain loops with double accumulation, one output element at a time, straight from the
// definitions in impl.h. Obviously correct rather than fast; never edited to make a fast path
// pass: it changes only when the math changes.
#include <vector>

#include "kernels/grouped_matmul/impl.h"

namespace tessera::grouped_matmul {
namespace {

double at(const void* base, DType t, int64_t i) { return load_as_f32(base, t, i); }

class Reference final : public Implementation {
 public:
  std::string name() const override { return "reference"; }
  std::string description() const override { return "plain loops in double precision; the oracle (slow)"; }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU)
      return Availability::no("inputs are on " + p.device.str() + ", reference runs on host memory");
    return Availability::yes();
  }
  void validate_block_sizes(const BlockSizes&) const override {}  // unblocked: ignores them

  // c[r, n] = Σ_k a[r, k] · b[g][k, n] for rows r of local group g; 0 for every other row.
  void gmm(const Problem& p, const BlockSizes&, const GmmArgs& x) const override {
    for (int64_t r = 0; r < p.M; ++r)
      for (int64_t n = 0; n < p.N; ++n) store_from_f32(x.c, x.c_dtype, r * p.N + n, 0.0f);
    for (int64_t g = 0; g < p.G; ++g)
      for (int64_t r = p.begin[g]; r < p.begin[g + 1]; ++r)
        for (int64_t n = 0; n < p.N; ++n) {
          double s = 0.0;
          for (int64_t k = 0; k < p.K; ++k) s += at(x.a, p.dtype, r * p.K + k) * at(x.b, p.dtype, p.b_index(g, k, n));
          store_from_f32(x.c, x.c_dtype, r * p.N + n, static_cast<float>(s));
        }
  }

  // c[g][k, n] = Σ_{rows r of g} a[r, k] · d[r, n]; zero for an empty group.
  void tgmm(const Problem& p, const BlockSizes&, const TgmmArgs& x) const override {
    for (int64_t g = 0; g < p.G; ++g)
      for (int64_t k = 0; k < p.K; ++k)
        for (int64_t n = 0; n < p.N; ++n) {
          double s = 0.0;
          for (int64_t r = p.begin[g]; r < p.begin[g + 1]; ++r)
            s += at(x.a, p.dtype, r * p.K + k) * at(x.d, p.dtype, r * p.N + n);
          store_from_f32(x.c, x.c_dtype, p.b_index(g, k, n), static_cast<float>(s));
        }
  }
};

}  // namespace

std::unique_ptr<Implementation> make_reference_implementation() { return std::make_unique<Reference>(); }

}  // namespace tessera::grouped_matmul
