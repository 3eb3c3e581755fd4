// mla_decode cpu: the split-KV pipeline (cpu_stages.h) on OpenBLAS sgemm and the shared lse
// combine. Threads over (batch, split) items in stage 1 and over rows in stage 2.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/trace.h"
#include "kernels/mla_decode/cpu_stages.h"
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
  cpu_convert::half_to_f32(static_cast<const uint16_t*>(src) + at, t == DType::kBF16, dst, n);
}

// A tracked f32 buffer of n values.
struct Floats {
  memory::HostBuffer buf;
  explicit Floats(int64_t n) : buf(memory::host_alloc(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float))) {}
  float* data() const { return memory::as<float>(buf); }
  float& operator[](size_t i) const { return data()[i]; }
};

int64_t pairs(const Problem& p) { return (p.D + 1) / 2; }
int64_t rows4(const Problem& p) { return (p.rows() + 3) / 4 * 4; }

// One worker's buffers for stage 1 (qp and ct, bf16 pairs, only on the bf16 dot-product path).
struct Work {
  Floats q, c, s, acc, m, l;
  memory::HostBuffer qp, ct;
  Work(const Problem& p, bool bf16_dot)
      : q(p.rows() * p.D), c(kChunk * p.D), s(p.rows() * kChunk), acc(p.rows() * p.Dv), m(p.rows()), l(p.rows()) {
    if (!bf16_dot) return;
    qp = memory::host_alloc(static_cast<size_t>(rows4(p) * pairs(p)) * sizeof(uint32_t));
    ct = memory::host_alloc(static_cast<size_t>(pairs(p) * kChunk) * sizeof(uint32_t));
    std::fill_n(memory::as<uint32_t>(qp), rows4(p) * pairs(p), 0u);
    std::fill_n(memory::as<uint32_t>(ct), pairs(p) * kChunk, 0u);
  }
};

// n bf16 values as pairs (lo | hi << 16), an odd n's last pair padded with 0, every stride-th word.
void to_pairs(const uint16_t* src, int64_t n, uint32_t* dst, int64_t stride) {
  for (int64_t k = 0; 2 * k < n; ++k)
    dst[k * stride] = uint32_t{src[2 * k]} | (2 * k + 1 < n ? uint32_t{src[2 * k + 1]} << 16 : 0u);
}

// Measured (devlog): 1.25x faster at Sq·Hq = 256 rows, 8 % slower at 16 (the per-key pair
// scatter is shared by fewer rows), so from 64 rows on.
bool uses_bf16_dot(const Problem& p) { return p.dtype == DType::kBF16 && p.rows() >= kMinBf16DotRows && have_bf16_dot(); }

// S [R, n] of the chunk of keys j0 .. j0 + n (already in w.c as f32, and in w.ct as pairs).
void chunk_scores(const Problem& p, int64_t n, Work& w) {
  const int64_t R = p.rows(), D = p.D;
  if (w.qp)
    scores_bf16_dot(memory::as<uint32_t>(w.qp), R, pairs(p), memory::as<uint32_t>(w.ct), kChunk, n,
                    static_cast<float>(p.scale), w.s.data());
  else
    cpu_blas::sgemm(false, true, R, n, D, static_cast<float>(p.scale), w.q.data(), D, w.c.data(), D, 0.0f, w.s.data(), n);
}

// Online-softmax update of row r with the chunk's scores s[0, n) of which the first `valid`
// are visible: s becomes the weights P (0 where masked), acc is rescaled.
void softmax_update(float* s, int64_t n, int64_t valid, float& m, float& l, float* acc, int64_t dv) {
  if (valid <= 0) {
    std::fill(s, s + n, 0.0f);
    return;
  }
  float mx = m;
  for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, s[j]);
  const float alpha = m == kNegInf ? 0.0f : std::exp(m - mx);
  float sum = 0.0f;
  for (int64_t j = 0; j < valid; ++j) sum += (s[j] = std::exp(s[j] - mx));
  std::fill(s + valid, s + n, 0.0f);
  if (alpha != 1.0f)
    for (int64_t d = 0; d < dv; ++d) acc[d] *= alpha;
  l = l * alpha + sum;
  m = mx;
}

// Stage 1 for one split: o_part [R, Dv] and lse values at lse_part[r·stride].
void partial(const Problem& p, const Split& sp, float* o_part, float* lse_part, int64_t stride, Work& w) {
  TESSERA_TRACE_SCOPE("mla_decode.split_kv");
  const int64_t R = p.rows(), D = p.D, Dv = p.Dv;
  to_f32(p.q, p.dtype, sp.b * R * D, R * D, w.q.data());
  if (w.qp)
    for (int64_t r = 0; r < R; ++r)
      to_pairs(static_cast<const uint16_t*>(p.q) + (sp.b * R + r) * D, D, memory::as<uint32_t>(w.qp) + r * pairs(p), 1);
  std::fill(w.acc.data(), w.acc.data() + R * Dv, 0.0f);
  std::fill(w.m.data(), w.m.data() + R, kNegInf);
  std::fill(w.l.data(), w.l.data() + R, 0.0f);
  for (int64_t j0 = sp.k0; j0 < sp.k1; j0 += kChunk) {
    const int64_t n = std::min(kChunk, sp.k1 - j0);
    for (int64_t j = 0; j < n; ++j) {
      to_f32(p.kv, p.dtype, p.entry(sp.b, j0 + j), D, w.c.data() + j * D);
      if (w.ct) to_pairs(static_cast<const uint16_t*>(p.kv) + p.entry(sp.b, j0 + j), D, memory::as<uint32_t>(w.ct) + j, kChunk);
    }
    chunk_scores(p, n, w);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t valid = std::min(n, p.visible(sp.b, r / p.Hq) - j0);
      softmax_update(w.s.data() + r * n, n, valid, w.m[static_cast<size_t>(r)], w.l[static_cast<size_t>(r)],
                     w.acc.data() + r * Dv, Dv);
    }
    cpu_blas::sgemm(false, false, R, Dv, n, 1.0f, w.s.data(), n, w.c.data(), D, 1.0f, w.acc.data(), Dv);
  }
  for (int64_t r = 0; r < R; ++r) {
    const float l = w.l[static_cast<size_t>(r)];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int64_t d = 0; d < Dv; ++d) o_part[r * Dv + d] = w.acc[static_cast<size_t>(r * Dv + d)] * inv;
    lse_part[r * stride] = l > 0.0f ? w.m[static_cast<size_t>(r)] + std::log(l) : kNegInf;
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

int64_t automatic_split_keys(const Problem& p, int threads) {
  int64_t Lmax = 0;
  for (int64_t b = 0; b < p.B; ++b) Lmax = std::max<int64_t>(Lmax, p.seqlens[b]);
  const int64_t want = 4 * static_cast<int64_t>(std::max(threads, 1));
  if (Lmax == 0 || p.B >= want) return std::max<int64_t>(Lmax, 1);
  const int64_t per_batch = (want + p.B - 1) / p.B;
  const int64_t keys = (Lmax + per_batch - 1) / per_batch;
  return std::max(kMinSplitKeys, (keys + kChunk - 1) / kChunk * kChunk);
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
  parallel_for(n, threads, /*blas=*/true, [&](int64_t i, int tid) {
    auto& w = work[static_cast<size_t>(tid)];
    if (!w) w = std::make_unique<Work>(p, uses_bf16_dot(p));
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
    return "split-KV pipeline: per (batch, split) all Sq·Hq rows as sgemm over gathered pages, then the lse combine";
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
