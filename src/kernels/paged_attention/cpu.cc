// paged_attention: the CPU backend.
//
// Work is cut into tasks (sequence s, kv heads [g0, g1), query rows [i0, i0 + rows), key positions
// [k0, k1)). A task packs the rows × Hq/Hkv query heads of its kv head into one f32 tile (GQA
// packing: the keys and values of a page are read once for every query head of the group) and
// streams its keys in blocks of at most kKeyBlock slots: scores (f32 FMA), soft cap and masks,
// the online softmax, P·V (cpu_simd.h). Decode rows (q_len 1) make one task per sequence over all
// its kv heads (each page block is then read whole, in memory order); with a bf16 cache on a CPU
// with AVX512-BF16 (and D, Dv multiples of 32) such a task reads the cache directly with bf16 dot
// products instead (cpu_decode_bf16.h). Prefill rows make flash-style tiles of up to kTileVectors
// query vectors per kv head, whose key blocks span pages (gathered run by run) and whose Q·Kᵀ
// and P·V are sgemm calls (cpu_blas, one BLAS thread per worker) from kGemmRows vectors on.
// When there are fewer tasks than the threads can balance (few sequences, long contexts), long
// tasks are split along the keys (split-KV); each split writes a normalized partial o and its
// lse, and a second phase combines them with primitives::lse_combine_row. Partials exist only for
// split tasks: extra memory O(threads × tile), independent of kv_len.
// Keys past kv_len, and pages the page table does not reach, are never read.
#include <algorithm>
#include <utility>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/trace.h"
#include "kernels/paged_attention/cpu_decode_bf16.h"
#include "kernels/paged_attention/cpu_simd.h"
#include "kernels/paged_attention/impl.h"
#include "primitives/cpu_blas.h"
#include "primitives/cpu_convert.h"
#include "primitives/cpu_threads.h"
#include "primitives/lse_combine.h"
#include "tessera/error.h"

namespace tessera::paged_attention {
namespace {

constexpr int64_t kKeyBlock = 64;       // keys per block (across pages only for one kv head)
constexpr int64_t kBlockRows = 128;     // key rows × kv heads a block converts at once
constexpr bool kPrefetch = true;  // pages are in any order: the hardware prefetcher stops at their ends
constexpr int64_t kTileVectors = 128;   // query vectors (rows × group heads) per prefill tile
constexpr int64_t kGemmRows = 16;       // from this many query vectors a block's products are GEMMs
constexpr int64_t kSplitKeys = 1024;    // the fewest keys a split gets
constexpr int64_t kTasksPerThread = 4;  // split until there are this many tasks per thread
const float kNegInf = -std::numeric_limits<float>::infinity();

// A task's query vectors r (R = (g1 − g0)·rows·G of them) are ordered [kv head][row][head of
// the group]: decode tasks take every kv head of their sequence, so that each page is read
// whole, front to back; prefill tiles take one kv head.
struct Task {
  int64_t s = 0, g0 = 0, g1 = 0, i0 = 0, rows = 0, k0 = 0, k1 = 0;
  int64_t part = -1;   // split tasks: index of their partial block; −1: writes o and lse itself
  int64_t split = -1;  // split tasks: their Split in Plan::splits
  bool sink = true;    // the first split of a task carries the sink
};

struct Split {  // a task cut into `splits` tasks whose partials are combined
  int64_t s = 0, g0 = 0, g1 = 0, i0 = 0, rows = 0, first_part = 0, splits = 0;
};

// Token row and query head of query vector r of a task (or split) of `rows` rows from kv head g0.
struct Slot {
  int64_t tq, h;
};
Slot slot(const Problem& p, int64_t s, int64_t i0, int64_t rows, int64_t g0, int64_t r) {
  const int64_t G = p.group(), Rg = rows * G, rr = r % Rg;
  return {p.cu_q[s] + i0 + rr / G, (g0 + r / Rg) * G + rr % G};
}

struct Plan {
  std::vector<Task> tasks;
  std::vector<Split> splits;
  int64_t R = 0;      // the most query vectors of a task
  int64_t parts = 0;  // partial blocks (each R × Dv floats and R lse)
};

Plan make_plan(const Problem& p) {
  Plan plan;
  const int64_t G = p.group();
  std::vector<Task> whole;
  for (int64_t s = 0; s < p.N; ++s) {
    const int64_t ql = p.q_len(s);
    const int64_t tile = ql == 1 ? 1 : std::max<int64_t>(1, kTileVectors / G);
    for (int64_t i0 = 0; i0 < ql; i0 += tile) {
      const int64_t rows = std::min(tile, ql - i0), pos0 = p.kv_len(s) - ql + i0;
      const int64_t k0 = p.key_lo(pos0), k1 = p.key_hi(s, pos0 + rows - 1);
      if (ql == 1) {
        whole.push_back({s, 0, p.Hkv, i0, rows, k0, k1});
        continue;
      }
      for (int64_t g = 0; g < p.Hkv; ++g) whole.push_back({s, g, g + 1, i0, rows, k0, k1});
    }
  }
  const int64_t want = kTasksPerThread * p.num_threads;
  const int64_t per = whole.empty() ? 1 : (want + static_cast<int64_t>(whole.size()) - 1) / static_cast<int64_t>(whole.size());
  for (const Task& t : whole) {
    plan.R = std::max(plan.R, (t.g1 - t.g0) * t.rows * G);
    const int64_t keys = t.k1 - t.k0;
    const int64_t n = std::clamp<int64_t>(keys / kSplitKeys, 1, per);
    if (n == 1) {
      plan.tasks.push_back(t);
      continue;
    }
    plan.splits.push_back({t.s, t.g0, t.g1, t.i0, t.rows, plan.parts, n});
    for (int64_t k = 0; k < n; ++k) {
      Task part = t;
      part.k0 = t.k0 + keys * k / n, part.k1 = t.k0 + keys * (k + 1) / n;
      part.part = plan.parts++;
      part.split = static_cast<int64_t>(plan.splits.size()) - 1;
      part.sink = k == 0;
      plan.tasks.push_back(part);
    }
  }
  // Longest first: the dynamic schedule then ends evenly.
  std::stable_sort(plan.tasks.begin(), plan.tasks.end(),
                   [](const Task& a, const Task& b) { return (a.k1 - a.k0) * a.rows > (b.k1 - b.k0) * b.rows; });
  return plan;
}

// Per-thread tiles.
struct Scratch {
  std::vector<float> q, s, k, v, o, m, l, alpha, row, bf16;
  Scratch(const Problem& p, int64_t R, bool bf16_decode)
      : q(static_cast<size_t>(R * p.D)), s(static_cast<size_t>(R * kKeyBlock)),
        k(static_cast<size_t>(std::max(kBlockRows, p.Hkv) * p.D)), v(static_cast<size_t>(std::max(kBlockRows, p.Hkv) * p.Dv)),
        o(static_cast<size_t>(R * p.Dv)), m(static_cast<size_t>(R)), l(static_cast<size_t>(R)),
        alpha(static_cast<size_t>(R)), row(static_cast<size_t>(std::max(p.D, p.Dv))),
        bf16(bf16_decode ? static_cast<size_t>(cpu_bf16::scratch_floats(p)) : 0) {}
};

// Cache rows [row0, row0 + n) of a cache ([rows, Hkv, width]), kv heads [g0, g1), as f32 in
// `buf`, head-major: head g's row j at buf + ((g − g0)·n + j)·width.
const float* cache_rows(const Problem& p, const void* cache, int64_t width, int64_t row0, int64_t n, int64_t g0,
                        int64_t g1, float* buf) {
  const DType c = p.cache_dtype;
  const int kind = c == DType::kF32 ? 0 : c == DType::kBF16 ? 1 : c == DType::kF16 ? 2 : 3;
  const char* first = static_cast<const char*>(cache) + static_cast<size_t>((row0 * p.Hkv + g0) * width) * dtype_size(c);
  cpu_simd::gather_rows(first, kind, n, g1 - g0, width, p.Hkv * width, buf);
  return buf;
}

// Key positions [j, j + n) of task t's sequence, kv heads [t.g0, t.g1), as f32 head-major in
// buf (cache_rows); with one kv head the block may span pages: each page's run in turn.
const float* block_rows(const Problem& p, const void* cache, int64_t width, const Task& t, int64_t j, int64_t n, float* buf) {
  if (t.g1 - t.g0 > 1) return cache_rows(p, cache, width, p.cache_row(t.s, j), n, t.g0, t.g1, buf);
  for (int64_t i = 0; i < n;) {
    const int64_t run = std::min(n - i, p.page_size - (j + i) % p.page_size);
    cache_rows(p, cache, width, p.cache_row(t.s, j + i), run, t.g0, t.g1, buf + i * width);
    i += run;
  }
  return buf;
}

// Asks for cache rows [row0, row0 + n) of every kv head (contiguous bytes) ahead of their use:
// pages are in any order, so the hardware prefetcher cannot run past a page's end.
void prefetch_rows(const Problem& p, const void* cache, int64_t width, int64_t row0, int64_t n) {
  const size_t esz = dtype_size(p.cache_dtype);
  const char* first = static_cast<const char*>(cache) + static_cast<size_t>(row0 * p.Hkv * width) * esz;
  const size_t bytes = static_cast<size_t>(n * p.Hkv * width) * esz;
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(first + off, 0, 3);
}

// Query vector r of task t: row i0 + r / G of the sequence, head g·G + r % G.
void pack_q(const Problem& p, const Task& t, Scratch& w) {
  const int64_t G = p.group();
  for (int64_t r = 0; r < (t.g1 - t.g0) * t.rows * G; ++r) {
    const auto [tq, h] = slot(p, t.s, t.i0, t.rows, t.g0, r);
    const int64_t off = (tq * p.Hq + h) * p.D;
    float* dst = w.q.data() + r * p.D;
    if (p.dtype == DType::kF32)
      std::memcpy(dst, static_cast<const float*>(p.q) + off, static_cast<size_t>(p.D) * sizeof(float));
    else
      cpu_convert::half_to_f32(static_cast<const uint16_t*>(p.q) + off, p.dtype == DType::kBF16, dst, p.D);
    for (int64_t d = 0; d < p.D; ++d) dst[d] *= static_cast<float>(p.scale);
  }
}

// The keys [lo, hi) of block [j0, j0 + n) that query vector r (of one kv head's rows·G) sees.
std::pair<int64_t, int64_t> visible(const Problem& p, const Task& t, int64_t r, int64_t j0, int64_t n) {
  const int64_t pos = p.kv_len(t.s) - p.q_len(t.s) + t.i0 + r / p.group();
  const int64_t lo = std::max(j0, p.key_lo(pos)), hi = p.causal ? std::min(j0 + n, pos + 1) : j0 + n;
  return {lo, std::max(lo, hi)};
}

// Soft cap, then the causal and window masks, on a block of scores (one kv head's rows·G query
// vectors) for keys [j0, j0 + n). Returns whether any score was masked.
bool cap_and_mask(const Problem& p, const Task& t, int64_t j0, int64_t n, Scratch& w) {
  const int64_t G = p.group(), R = t.rows * G, pos0 = p.kv_len(t.s) - p.q_len(t.s) + t.i0;
  if (p.softcap > 0.0) {
    const float c = static_cast<float>(p.softcap), inv = 1.0f / c;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < n; ++j) w.s[r * kKeyBlock + j] = c * std::tanh(w.s[r * kKeyBlock + j] * inv);
  }
  const int64_t pos_last = pos0 + t.rows - 1;
  const bool all_causal = !p.causal || j0 + n - 1 <= pos0;
  const bool all_window = p.window < 0 || j0 >= pos_last - p.window;
  if (all_causal && all_window) return false;
  for (int64_t r = 0; r < R; ++r) {
    const auto [lo, hi] = visible(p, t, r, j0, n);
    for (int64_t j = 0; j < n; ++j)
      if (j0 + j < lo || j0 + j >= hi) w.s[r * kKeyBlock + j] = kNegInf;
  }
  return true;
}

// O = alpha·O + P·V over each row's visible keys only, for a masked block: a key a row does not
// see is never read for it, so a non-finite value there (the caches are not scanned; an f16
// cache overflows to Inf) cannot turn that row's 0 weight into NaN — as the reference and cuda_v2.
void accumulate_visible(const Problem& p, const Task& t, int64_t j0, int64_t n, int64_t Rg, const float* P,
                        const float* V, const float* alpha, float* O) {
  for (int64_t r = 0; r < Rg; ++r) {
    const auto [lo, hi] = visible(p, t, r, j0, n);
    const int64_t a = hi > lo ? lo - j0 : 0;  // none: alpha's rescale alone
    cpu_simd::accumulate(P + r * kKeyBlock + a, kKeyBlock, 1, V + a * p.Dv, p.Dv, hi - lo, p.Dv, alpha + r,
                         O + r * p.Dv, p.Dv);
  }
}

// Keys [t.k0, t.k1) into w.o (unnormalized), w.m, w.l (the generic path: f32 tiles).
void stream_keys(const Problem& p, const Task& t, Scratch& w) {
  const int64_t Rg = t.rows * p.group();
  pack_q(p, t, w);
  std::fill(w.o.begin(), w.o.begin() + (t.g1 - t.g0) * Rg * p.Dv, 0.0f);
  const int64_t heads = t.g1 - t.g0, block = std::clamp<int64_t>(kBlockRows / heads, 1, kKeyBlock);
  for (int64_t j = t.k0; j < t.k1;) {
    // One kv head: the block gathers whole blocks across pages (its rows are then contiguous,
    // and a page of 16 slots no longer makes 16-key GEMMs); several: within one page.
    const int64_t page_end = (j / p.page_size + 1) * p.page_size;
    const int64_t n = std::min({t.k1, heads == 1 ? t.k1 : page_end, j + block}) - j;
    const float* K = block_rows(p, p.k, p.D, t, j, n, w.k.data());
    const float* V = block_rows(p, p.v, p.Dv, t, j, n, w.v.data());
    if (kPrefetch && heads == p.Hkv && j + n < t.k1) {  // the next block, while this one computes
      const int64_t next = j + n, m = std::min({t.k1, (next / p.page_size + 1) * p.page_size, next + block}) - next;
      prefetch_rows(p, p.k, p.D, p.cache_row(t.s, next), m);
      prefetch_rows(p, p.v, p.Dv, p.cache_row(t.s, next), m);
    }
    for (int64_t g = t.g0; g < t.g1; ++g) {  // the kv heads of these cache rows, in memory order
      const int64_t r0 = (g - t.g0) * Rg;
      float *m = w.m.data() + r0, *l = w.l.data() + r0, *alpha = w.alpha.data() + r0;
      const float *Kg = K + (g - t.g0) * n * p.D, *Vg = V + (g - t.g0) * n * p.Dv;
      float* O = w.o.data() + r0 * p.Dv;
      if (Rg < kGemmRows) {  // decode: a few query vectors, register-blocked dot products
        cpu_simd::scores(w.q.data() + r0 * p.D, p.D, Rg, Kg, p.D, n, p.D, w.s.data(), kKeyBlock);
      } else {  // prefill tile: S = Q·Kᵀ as a GEMM (OpenBLAS, one thread per worker)
        cpu_blas::sgemm(false, true, Rg, n, p.D, 1.0f, w.q.data() + r0 * p.D, p.D, Kg, p.D, 0.0f, w.s.data(), kKeyBlock);
      }
      const bool masked = cap_and_mask(p, t, j, n, w);
      cpu_simd::online_softmax(w.s.data(), Rg, n, kKeyBlock, m, l, alpha);
      if (masked) {
        accumulate_visible(p, t, j, n, Rg, w.s.data(), Vg, alpha, O);
      } else if (Rg < kGemmRows) {
        cpu_simd::accumulate(w.s.data(), kKeyBlock, Rg, Vg, p.Dv, n, p.Dv, alpha, O, p.Dv);
      } else {  // O = alpha·O + P·V
        for (int64_t r = 0; r < Rg; ++r)
          if (alpha[r] != 1.0f)
            for (int64_t d = 0; d < p.Dv; ++d) O[r * p.Dv + d] *= alpha[r];
        cpu_blas::sgemm(false, false, Rg, p.Dv, n, 1.0f, w.s.data(), kKeyBlock, Vg, p.Dv, 1.0f, O, p.Dv);
      }
    }
    j += n;
  }
}

// A decode task (one row, every kv head): its query vectors r are the query heads h = r.
bool bf16_decode_task(const Problem& p, const Task& t, const Scratch& w) {
  return !w.bf16.empty() && t.rows == 1 && t.g0 == 0 && t.g1 == p.Hkv;
}

// Runs one task: its rows' normalized o (f32, R × Dv in w.o) and lse (w.m).
void attend(const Problem& p, const Task& t, Scratch& w) {
  const int64_t R = (t.g1 - t.g0) * t.rows * p.group();
  for (int64_t r = 0; r < R; ++r) {
    const bool sink = p.sinks && t.sink;
    w.m[static_cast<size_t>(r)] = sink ? p.sinks[slot(p, t.s, t.i0, t.rows, t.g0, r).h] : kNegInf;
    w.l[static_cast<size_t>(r)] = sink ? 1.0f : 0.0f;
  }
  if (bf16_decode_task(p, t, w))
    cpu_bf16::decode_row(p, t.s, p.cu_q[t.s] + t.i0, t.k0, t.k1, w.m.data(), w.l.data(), w.o.data(), w.bf16.data());
  else
    stream_keys(p, t, w);
  for (int64_t r = 0; r < R; ++r) {  // normalize: o·v_scale / l, lse = m + log l (−inf and 0 when l = 0;
    float* o = w.o.data() + r * p.Dv;   // a NaN l — a non-finite key the row sees — stays NaN, as in the reference)
    const float l = w.l[static_cast<size_t>(r)];
    const float inv = l == 0.0f ? 0.0f : static_cast<float>(p.v_scale) / l;
    for (int64_t d = 0; d < p.Dv; ++d) o[d] *= inv;
    w.m[static_cast<size_t>(r)] = l == 0.0f ? kNegInf : w.m[static_cast<size_t>(r)] + std::log(l);
  }
}

// o row (token tq, head h) from f32.
void store_o(const Problem& p, int64_t tq, int64_t h, const float* src) {
  const int64_t off = (tq * p.Hq + h) * p.Dv;
  if (p.o_f32)
    std::memcpy(static_cast<float*>(p.o) + off, src, static_cast<size_t>(p.Dv) * sizeof(float));
  else if (p.dtype == DType::kBF16)
    cpu_convert::f32_to_bf16(src, static_cast<uint16_t*>(p.o) + off, p.Dv);
  else
    cpu_convert::f32_to_f16(src, static_cast<uint16_t*>(p.o) + off, p.Dv);
}

void store_task(const Problem& p, const Task& t, const Scratch& w, std::vector<float>& part_o,
                std::vector<float>& part_lse, int64_t R, const Plan& plan) {
  const int64_t Rt = (t.g1 - t.g0) * t.rows * p.group();
  if (t.part < 0) {
    for (int64_t r = 0; r < Rt; ++r) {
      const auto [tq, h] = slot(p, t.s, t.i0, t.rows, t.g0, r);
      store_o(p, tq, h, w.o.data() + r * p.Dv);
      p.lse[tq * p.Hq + h] = w.m[static_cast<size_t>(r)];
    }
    return;
  }
  // Partial block `part`: o rows at part·R·Dv, lse at [first_part·R + r·splits + k] of its Split.
  const Split* sp = &plan.splits[static_cast<size_t>(t.split)];
  const int64_t k = t.part - sp->first_part;
  std::memcpy(part_o.data() + t.part * R * p.Dv, w.o.data(), static_cast<size_t>(Rt * p.Dv) * sizeof(float));
  for (int64_t r = 0; r < Rt; ++r) part_lse[static_cast<size_t>(sp->first_part * R + r * sp->splits + k)] = w.m[static_cast<size_t>(r)];
}

void combine(const Problem& p, const Split& c, const std::vector<float>& part_o, const std::vector<float>& part_lse,
             int64_t R, float* row) {
  for (int64_t r = 0; r < (c.g1 - c.g0) * c.rows * p.group(); ++r) {
    const auto [tq, h] = slot(p, c.s, c.i0, c.rows, c.g0, r);
    primitives::lse_combine_row(c.splits, p.Dv, part_o.data() + (c.first_part * R + r) * p.Dv, R * p.Dv,
                                part_lse.data() + c.first_part * R + r * c.splits, row, p.lse + tq * p.Hq + h);
    store_o(p, tq, h, row);
  }
}

class Cpu final : public Implementation {
 public:
  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return "GQA-packed page streaming, split-KV with lse combine, flash tiles with BLAS products for prefill";
  }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU) return Availability::no("the cpu backend runs on host memory");
    return Availability::yes();
  }
  void forward(const Problem& p) const override {
    const Plan plan = make_plan(p);
    const bool bf16_decode = cpu_bf16::available() && cpu_bf16::fits(p);
    std::vector<float> part_o(static_cast<size_t>(plan.parts * plan.R * p.Dv));
    std::vector<float> part_lse(static_cast<size_t>(plan.parts * plan.R), kNegInf);
    const int T = static_cast<int>(std::min<int64_t>(p.num_threads, static_cast<int64_t>(plan.tasks.size())));
    std::atomic<size_t> next{0};
    cpu_threads::run_threads(std::max(T, 1), /*blas=*/true, "paged_attention cpu", [&](int) {
      TESSERA_TRACE_SCOPE("paged_attention.tasks");
      Scratch w(p, plan.R, bf16_decode);
      for (size_t i = next++; i < plan.tasks.size(); i = next++) {
        attend(p, plan.tasks[i], w);
        store_task(p, plan.tasks[i], w, part_o, part_lse, plan.R, plan);
      }
    });
    if (plan.splits.empty()) return;
    std::atomic<size_t> nc{0};
    const int Tc = static_cast<int>(std::min<int64_t>(p.num_threads, static_cast<int64_t>(plan.splits.size())));
    cpu_threads::run_threads(std::max(Tc, 1), false, "paged_attention cpu", [&](int) {
      TESSERA_TRACE_SCOPE("paged_attention.combine");
      std::vector<float> row(static_cast<size_t>(p.Dv));
      for (size_t i = nc++; i < plan.splits.size(); i = nc++) combine(p, plan.splits[i], part_o, part_lse, plan.R, row.data());
    });
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cpu_implementation() { return std::make_unique<Cpu>(); }

}  // namespace tessera::paged_attention
