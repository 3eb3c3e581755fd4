// mla_decode cpu: the split-KV pipeline (cpu_stages.h) on the shared bf16 GEMM (bf16 inputs on
// AVX512-BF16) or OpenBLAS sgemm, and the shared lse combine. Threads over (batch, split) items
// in stage 1 and over rows in stage 2.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/trace.h"
#include "kernels/mla_decode/cpu_stages.h"
#include "primitives/cpu_bf16_gemm.h"
#include "primitives/cpu_blas.h"
#include "primitives/cpu_convert.h"
#include "primitives/cpu_threads.h"
#include "primitives/lse_combine.h"
#include "tessera/error.h"

namespace tessera::mla_decode::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// n values of `t` starting at element `at` as f32.
void to_f32(const void* src, DType t, int64_t at, int64_t n, float* dst) {
  if (t == DType::kF32) {
    std::memcpy(dst, static_cast<const float*>(src) + at, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  if (t == DType::kF8E4M3) return cpu_convert::f8e4m3_to_f32(static_cast<const uint8_t*>(src) + at, dst, n);
  cpu_convert::half_to_f32(static_cast<const uint16_t*>(src) + at, t == DType::kBF16, dst, n);
}

// A tracked f32 buffer of n values.
struct Floats {
  memory::HostBuffer buf;
  explicit Floats(int64_t n) : buf(memory::host_alloc(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float))) {}
  float* data() const { return memory::as<float>(buf); }
  float& operator[](size_t i) const { return data()[i]; }
};

// One worker's buffers for stage 1. f32 path: q and the chunk c as f32 for sgemm. bf16 path:
// the chunk's keys (entry pointers), packed once as the B of both products (pk: Cᵀ, pv:
// C[:, :Dv]), and the weights P as bf16 (pb, [R, n]); an f8e4m3 cache's entries widened to bf16
// first (wide, [kChunk, D]: the keys point there).
struct Work {
  Floats q, c, s, acc, m, l;
  std::vector<const uint16_t*> keys;
  memory::HostBuffer pk, pv, pb, wide;
  Work(const Problem& p, bool bf16_dot)
      : q(bf16_dot ? 0 : p.rows() * p.D), c(bf16_dot ? 0 : kChunk * p.D), s(p.rows() * kChunk),
        acc(p.rows() * p.Dv), m(p.rows()), l(p.rows()) {
    if (!bf16_dot) return;
    keys.resize(static_cast<size_t>(kChunk));
    if (p.cache_dtype == DType::kF8E4M3) wide = memory::host_alloc(static_cast<size_t>(kChunk * p.D) * sizeof(uint16_t));
    pk = memory::host_alloc(static_cast<size_t>(cpu_bf16_gemm::packed_words(p.D, kChunk)) * sizeof(uint32_t));
    pv = memory::host_alloc(static_cast<size_t>(cpu_bf16_gemm::packed_words(kChunk, p.Dv)) * sizeof(uint32_t));
    pb = memory::host_alloc(static_cast<size_t>(p.rows() * kChunk) * sizeof(uint16_t));
  }
};

// Online-softmax update of row r with the chunk's scores s[0, n) of which the first `valid`
// are visible: s becomes the weights P (0 where masked), acc is rescaled.
void softmax_update(float* s, int64_t n, int64_t valid, float& m, float& l, float* acc, int64_t dv) {
  if (valid <= 0) {
    std::fill(s, s + n, 0.0f);
    return;
  }
  const float mx = row_max(s, valid, m);
  const float alpha = m == kNegInf ? 0.0f : std::exp(m - mx);
  const float sum = exp_shifted(s, valid, mx);
  std::fill(s + valid, s + n, 0.0f);
  if (alpha != 1.0f)
    for (int64_t d = 0; d < dv; ++d) acc[d] *= alpha;
  l = l * alpha + sum;
  m = mx;
}

// The softmax of every row of the chunk's scores w.s [R, n] (keys j0 .. j0 + n).
void softmax_rows(const Problem& p, const Split& sp, int64_t j0, int64_t n, Work& w) {
  for (int64_t r = 0; r < p.rows(); ++r) {
    const int64_t valid = std::min(n, p.visible(sp.b, r / p.Hq) - j0);
    softmax_update(w.s.data() + r * n, n, valid, w.m[static_cast<size_t>(r)], w.l[static_cast<size_t>(r)],
                   w.acc.data() + r * p.Dv, p.Dv);
  }
}

// acc += P·C[:, :Dv] over each row's visible keys only: `pv(r0, rows, k)` adds the product of
// rows r0 .. r0 + rows and the chunk's first k keys. A key a row does not see (causal, Sq > 1) is
// never read for it, so a non-finite entry there cannot turn the row's 0 weight into NaN, as in
// the reference. The rows of one query position see the same keys (Hq rows each, in order); every
// row sees the whole chunk but where it straddles a causal boundary (the last Sq keys).
template <class PV>
void accumulate_visible(const Problem& p, const Split& sp, int64_t j0, int64_t n, PV&& pv) {
  const int64_t Sq = p.rows() / p.Hq;
  if (p.visible(sp.b, 0) - j0 >= n) return pv(0, p.rows(), n);  // query 0 sees the least
  for (int64_t i = 0; i < Sq; ++i) {
    const int64_t k = std::clamp<int64_t>(p.visible(sp.b, i) - j0, 0, n);
    if (k > 0) pv(i * p.Hq, p.Hq, k);
  }
}

// One chunk on the f32 path: gather and widen, S = scale·Q·Cᵀ and acc += P·C[:, :Dv] on sgemm.
void chunk_f32(const Problem& p, const Split& sp, int64_t j0, int64_t n, Work& w) {
  const int64_t R = p.rows(), D = p.D;
  for (int64_t j = 0; j < n; ++j) to_f32(p.kv, p.cache_dtype, p.entry(sp.b, j0 + j), D, w.c.data() + j * D);
  cpu_blas::sgemm(false, true, R, n, D, static_cast<float>(p.scale), w.q.data(), D, w.c.data(), D, 0.0f, w.s.data(), n);
  softmax_rows(p, sp, j0, n, w);
  accumulate_visible(p, sp, j0, n, [&](int64_t r0, int64_t rows, int64_t k) {
    cpu_blas::sgemm(false, false, rows, p.Dv, k, 1.0f, w.s.data() + r0 * n, n, w.c.data(), D, 1.0f,
                    w.acc.data() + r0 * p.Dv, p.Dv);
  });
}

// One chunk on the bf16 dot-product path: the entries packed straight from their pages (an f8e4m3
// cache's widened to bf16 first), P
// rounded to bf16 (nearest even) after the f32 softmax (l sums the f32 weights).
void chunk_bf16(const Problem& p, const Split& sp, int64_t j0, int64_t n, Work& w) {
  const int64_t R = p.rows();
  if (p.cache_dtype == DType::kF8E4M3) {  // widened (exactly) into the chunk's bf16 rows
    uint16_t* wide = memory::as<uint16_t>(w.wide);
    for (int64_t j = 0; j < n; ++j) {
      cpu_convert::f8e4m3_to_bf16(static_cast<const uint8_t*>(p.kv) + p.entry(sp.b, j0 + j), wide + j * p.D, p.D);
      w.keys[static_cast<size_t>(j)] = wide + j * p.D;
    }
  } else {
    const auto* kv = static_cast<const uint16_t*>(p.kv);
    for (int64_t j = 0; j < n; ++j) w.keys[static_cast<size_t>(j)] = kv + p.entry(sp.b, j0 + j);
  }
  uint32_t *pk = memory::as<uint32_t>(w.pk), *pv = memory::as<uint32_t>(w.pv);
  uint16_t* pb = memory::as<uint16_t>(w.pb);
  cpu_bf16_gemm::pack_cols(w.keys.data(), p.D, n, pk);
  const auto* q = static_cast<const uint16_t*>(p.q) + sp.b * R * p.D;
  cpu_bf16_gemm::gemm(R, n, p.D, q, p.D, pk, static_cast<float>(p.scale), false, w.s.data(), n);
  softmax_rows(p, sp, j0, n, w);
  cpu_convert::f32_to_bf16(w.s.data(), pb, R * n);
  int64_t packed = -1;  // the keys pv holds (the packed layout depends on their count)
  accumulate_visible(p, sp, j0, n, [&](int64_t r0, int64_t rows, int64_t k) {
    if (k != packed) cpu_bf16_gemm::pack_rows(w.keys.data(), k, p.Dv, pv), packed = k;
    cpu_bf16_gemm::gemm(rows, p.Dv, k, pb + r0 * n, n, pv, 1.0f, true, w.acc.data() + r0 * p.Dv, p.Dv);
  });
}

// Stage 1 for one split: o_part [R, Dv] and lse values at lse_part[r·stride].
void partial(const Problem& p, const Split& sp, float* o_part, float* lse_part, int64_t stride, Work& w) {
  TESSERA_TRACE_SCOPE("mla_decode.split_kv");
  const int64_t R = p.rows(), Dv = p.Dv;
  const bool bf16_dot = static_cast<bool>(w.pk);
  if (!bf16_dot) to_f32(p.q, p.dtype, sp.b * R * p.D, R * p.D, w.q.data());
  std::fill(w.acc.data(), w.acc.data() + R * Dv, 0.0f);
  std::fill(w.m.data(), w.m.data() + R, kNegInf);
  std::fill(w.l.data(), w.l.data() + R, 0.0f);
  for (int64_t j0 = sp.k0; j0 < sp.k1; j0 += kChunk) {
    const int64_t n = std::min(kChunk, sp.k1 - j0);
    if (bf16_dot) chunk_bf16(p, sp, j0, n, w);
    else chunk_f32(p, sp, j0, n, w);
  }
  for (int64_t r = 0; r < R; ++r) {  // l = 0: no key seen (o 0, lse −inf); NaN (a non-finite key seen) stays NaN
    const float l = w.l[static_cast<size_t>(r)];
    const float inv = l == 0.0f ? 0.0f : static_cast<float>(p.v_scale) / l;
    for (int64_t d = 0; d < Dv; ++d) o_part[r * Dv + d] = w.acc[static_cast<size_t>(r * Dv + d)] * inv;
    lse_part[r * stride] = l == 0.0f ? kNegInf : w.m[static_cast<size_t>(r)] + std::log(l);
  }
}

template <class F>
void parallel_for(int64_t n, int threads, bool blas, F&& body) {
  std::atomic<int64_t> next{0};
  const int T = static_cast<int>(std::clamp<int64_t>(n, 1, std::max(threads, 1)));
  cpu_threads::run_threads(T, blas, std::string(kKernelName) + " cpu", [&](int tid) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) body(i, tid);
  });
}

}  // namespace

// Measured (devlog v3): faster than widening to f32 for sgemm from Sq·Hq = 2 rows on.
bool uses_bf16_dot(const Problem& p) {
  const bool cache = p.cache_dtype == DType::kBF16 || p.cache_dtype == DType::kF8E4M3;
  return p.dtype == DType::kBF16 && cache && p.rows() >= kMinBf16DotRows && cpu_bf16_gemm::available();
}

int64_t automatic_split_keys(const Problem& p, int threads) {
  int64_t Lmax = 0;
  for (int64_t b = 0; b < p.B; ++b) Lmax = std::max<int64_t>(Lmax, p.seqlens[b]);
  return automatic_split_keys(p.B, Lmax, threads);
}

Plan plan(const Problem& p, int threads) {
  Plan pl;
  pl.split_keys = p.block_sizes && p.block_sizes->split_keys > 0 ? p.block_sizes->split_keys
                                                                 : automatic_split_keys(p, threads);
  pl.first.push_back(0);
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t k0 = 0, k1 = 0; k0 < p.seqlens[b]; k0 = k1) {
      k1 = k0 + std::min<int64_t>(p.seqlens[b] - k0, pl.split_keys);  // no overflow for any split_keys
      pl.splits.push_back({b, k0, k1});
    }
    pl.first.push_back(static_cast<int64_t>(pl.splits.size()));
  }
  return pl;
}

Partials Partials::allocate(int64_t splits, int64_t rows, int64_t dv) {
  Partials part;
  part.o_buf = memory::host_alloc(static_cast<size_t>(std::max<int64_t>(splits * rows * dv, 1)) * sizeof(float));
  part.lse_buf = memory::host_alloc(static_cast<size_t>(std::max<int64_t>(splits * rows, 1)) * sizeof(float));
  part.o = memory::as<float>(part.o_buf), part.lse = memory::as<float>(part.lse_buf);
  return part;
}

Partials stage1(const Problem& p, const Plan& pl, int threads) {
  const int64_t R = p.rows(), n = static_cast<int64_t>(pl.splits.size());
  Partials part = Partials::allocate(n, R, p.Dv);
  std::vector<std::unique_ptr<Work>> work(static_cast<size_t>(std::max(threads, 1)));
  // The bf16 path never calls the BLAS: holding OpenBLAS at one thread and restoring it after
  // wakes its pool, whose threads then spin (sched_yield) on the cores the workers need.
  const bool bf16_dot = uses_bf16_dot(p);
  parallel_for(n, threads, /*blas=*/!bf16_dot, [&](int64_t i, int tid) {
    auto& w = work[static_cast<size_t>(tid)];
    if (!w) w = std::make_unique<Work>(p, bf16_dot);
    const Split& sp = pl.splits[static_cast<size_t>(i)];
    const int64_t first = pl.first[static_cast<size_t>(sp.b)], nb = pl.first[static_cast<size_t>(sp.b + 1)] - first;
    partial(p, sp, part.o + i * R * p.Dv, part.lse + first * R + (i - first), nb, *w);
  });
  return part;
}

void stage2(const Problem& p, const Plan& pl, const Partials& part, int threads) {
  const int64_t R = p.rows(), Dv = p.Dv;
  parallel_for(p.B, threads, /*blas=*/false, [&](int64_t b, int) {
    TESSERA_TRACE_SCOPE("mla_decode.combine");
    const int64_t first = pl.first[static_cast<size_t>(b)], nb = pl.first[static_cast<size_t>(b + 1)] - first;
    std::vector<float> row(static_cast<size_t>(p.o_dtype == DType::kF32 ? 0 : Dv));
    for (int64_t r = 0; r < R; ++r) {
      const int64_t out = b * R + r;
      float* o = p.o_dtype == DType::kF32 ? static_cast<float*>(p.o) + out * Dv : row.data();
      primitives::lse_combine_row(nb, Dv, part.o + (first * R + r) * Dv, R * Dv, part.lse + first * R + r * nb, o,
                                  p.lse + out);
      if (p.o_dtype == DType::kBF16) cpu_convert::f32_to_bf16(o, static_cast<uint16_t*>(p.o) + out * Dv, Dv);
      if (p.o_dtype == DType::kF16) cpu_convert::f32_to_f16(o, static_cast<uint16_t*>(p.o) + out * Dv, Dv);
    }
  });
}

namespace {

class Cpu final : public Implementation {
 public:
  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return "split-KV pipeline: per (batch, split) all Sq·Hq rows as GEMMs over gathered pages (bf16 dot products "
           "for bf16 on AVX512-BF16, else sgemm), then the lse combine";
  }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU)
      return Availability::no("inputs are on " + p.device.str() + ", cpu runs on host memory");
    if (p.rows() * p.D > INT_MAX) return Availability::no("Sq·Hq·D must fit a BLAS int");
    return Availability::yes();
  }
  void forward(const Problem& p) const override {
    const Plan pl = plan(p, p.num_threads);
    const Partials part = stage1(p, pl, p.num_threads);
    stage2(p, pl, part, p.num_threads);
  }
};

}  // namespace
}  // namespace tessera::mla_decode::cpu

namespace tessera::mla_decode {
std::unique_ptr<Implementation> make_cpu_implementation() { return std::make_unique<cpu::Cpu>(); }
}  // namespace tessera::mla_decode
