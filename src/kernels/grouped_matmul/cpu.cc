// grouped_matmul: the optimized CPU backend.
//
// gmm: the output rows of the local groups are cut into work items (group, ≤ m rows, ≤ n
// columns); each item is one OpenBLAS sgemm of its rows of lhs against its columns of rhs[g]
// (f32 inputs are read in place; bf16/f16 rows and rhs columns are converted to f32 into the
// thread's buffers first). Rows outside every local group are zeroed. Where the f32 micro-kernel
// runs (below), bf16/f16 gmm runs on it instead: the item's rows converted once, rhs[g] converted
// straight into its packed panels, a chunk at a time (gmm_item_panels).
// tgmm: items (group, ≤ m rows of drhs[g], ≤ n columns); each is lhs[rows of g]ᵀ · dout[rows of
// g] over the group's rows — in place for f32 in one sgemm, in blocks of kRowBlock converted
// rows for bf16/f16, accumulating in f32. An empty group's matrix is zeroed.
//
// bf16 on the AVX512-BF16 dot product (primitives/cpu_bf16_gemm; TESSERA_CPU_BF16_DOT=0 or a CPU
// without it selects the f32 route above): gmm packs its item's columns of rhs[g] (for groups of
// ≤ kChunkedRows rows in chunks of kKChunk × kDotCols, prefetched one ahead, as on the f32 route)
// and reads the lhs rows in place; tgmm transposes its item's lhs columns (bf16, a block of kRowBlock rows at a
// time) and packs dout's rows. Products of two bf16 are exact in f32 and the sums are f32, as in
// the f32 route: the results differ from it only in the order of the sums.
//
// f32 on the packed AVX-512 FMA micro-kernel (primitives/cpu_f32_gemm; TESSERA_CPU_F32_GEMM=0 or
// =avx2, or a CPU without AVX-512F, selects the OpenBLAS route above: the AVX2 kernel took
// 1.05-1.6x OpenBLAS's time here, devlog 2026-11-28). Items are (group, kPanel-aligned
// column chunk of ≤ max(n, kPanel) columns) over the whole group — cut into row parts only
// where one is over a (2·threads)-th of the call's work — so a group's rhs panel is packed once
// and every row of the group runs against it (the block size m is not used). gmm packs one kPanel-column panel
// of rhs[g] at a time (K·kPanel floats, in L2; for groups of ≤ kChunkedRows rows in chunks of
// kKChunk rows of rhs, the output accumulating over them) and runs the item's lhs rows, read in
// place, against it. tgmm: C's rows index the operand it transposes (lhs columns; dout's with
// transpose_rhs), whole (≤ kMaxSpan per item); its columns the operand it packs, in chunks; per
// kRowBlock rows of the group the transposed block is formed once and each packed panel
// accumulates into the output. Sums are f32 in k order with one rounding per FMA (a chunked gmm
// group's item adds each chunk's sum to the output: one more rounding per chunk; the route differs from
// OpenBLAS in the order of the sums only).
//
// Threads: the shared worker threads (primitives/cpu_threads.h), items handed out by an atomic counter, heaviest first; OpenBLAS at one
// thread meanwhile (primitives/cpu_threads.h). Determinism: every output element is computed by
// exactly one item, whose arithmetic does not depend on the thread that runs it, so results are
// bitwise identical for any thread count.
// Memory: per thread, for bf16/f16, m·K + K·n + m·n floats (gmm) or (kRowBlock + m)·… floats
// (tgmm); for f32 on OpenBLAS none; on the micro-kernel K·kPanel floats (gmm) or kRowBlock ·
// (kMaxSpan + kPanel) floats at most (tgmm).
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/memory.h"
#include "core/trace.h"
#include "primitives/cpu_bf16_gemm.h"
#include "primitives/cpu_blas.h"
#include "primitives/cpu_convert.h"
#include "primitives/cpu_f32_gemm.h"
#include "primitives/cpu_threads.h"
#include "kernels/grouped_matmul/impl.h"
#include "tessera/error.h"

namespace tessera::grouped_matmul {
namespace {

constexpr int kMaxThreads = 256;
constexpr int64_t kRowBlock = 1024;  // tgmm, bf16/f16: rows converted per step
constexpr int64_t kMaxBlock = 1 << 16;
constexpr int64_t kPanel = cpu_f32_gemm::kPanel;  // f32 micro-kernel: columns per packed panel
constexpr int64_t kMaxSpan = 4096;                // tgmm on it: rows of the output per item at most
constexpr int64_t kSliceRows = 12;                // gmm on it: rows per product between prefetches (2 register blocks)
constexpr int64_t kKChunk = 256;                  // gmm on it: rows of b per packed chunk, for groups of
constexpr int64_t kChunkedRows = 128;             // at most this many rows (else the whole K: c stays in L2)
constexpr int64_t kDotCols = 256;                 // bf16 dot route, chunked: columns per packed chunk (128 KiB)

// dst [rows, cols] (row stride cols) = f32(src[r·ld + c]) for the block at element offset `off`.
void to_f32(const void* src, DType t, int64_t off, int64_t ld, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * cols;
    const int64_t o = off + r * ld;
    if (t == DType::kF32) {
      std::memcpy(d, static_cast<const float*>(src) + o, static_cast<size_t>(cols) * sizeof(float));
    } else {
      cpu_convert::half_to_f32(static_cast<const uint16_t*>(src) + o, t == DType::kBF16, d, cols);
    }
  }
}

// dst[off + r·ld + c] = src[r·cols + c] rounded to t (nearest even).
void from_f32(const float* src, int64_t rows, int64_t cols, void* dst, DType t, int64_t off, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * cols;
    const int64_t o = off + r * ld;
    if (t == DType::kF32) {
      std::memcpy(static_cast<float*>(dst) + o, s, static_cast<size_t>(cols) * sizeof(float));
    } else if (t == DType::kBF16) {
      cpu_convert::f32_to_bf16(s, static_cast<uint16_t*>(dst) + o, cols);
    } else {
      cpu_convert::f32_to_f16(s, static_cast<uint16_t*>(dst) + o, cols);
    }
  }
}

// Zeroes rows × cols elements at element offset `off` with row stride ld (0 bits are 0.0 in
// f32, bf16 and f16 alike).
void zero_block(void* dst, DType t, int64_t off, int64_t ld, int64_t rows, int64_t cols) {
  const size_t es = dtype_size(t);
  char* base = static_cast<char*>(dst);
  for (int64_t r = 0; r < rows; ++r) std::memset(base + (off + r * ld) * es, 0, static_cast<size_t>(cols) * es);
}

// [0, n) in ceil(n / block) near-equal parts.
std::vector<std::pair<int64_t, int64_t>> split(int64_t n, int64_t block) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t parts = std::max<int64_t>(1, (n + block - 1) / block);
  for (int64_t i = 0; i < parts; ++i) out.emplace_back(n * i / parts, n * (i + 1) / parts);
  return out;
}

// A rectangle of one group's output: rows [r0, r1) × columns [c0, c1) (tgmm: rows of drhs[g]).
struct Item {
  int64_t g, r0, r1, c0, c1;
  double work;
};

void sort_heaviest_first(std::vector<Item>& items) {
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.work > b.work; });
}

// Per-thread f32 scratch.
struct Scratch {
  std::vector<memory::HostBuffer> keep;
  std::vector<float*> a, b, c;
  void make(int T, size_t a_floats, size_t b_floats, size_t c_floats) {
    for (int t = 0; t < T; ++t) {
      a.push_back(alloc(a_floats));
      b.push_back(alloc(b_floats));
      c.push_back(alloc(c_floats));
    }
  }
  float* alloc(size_t n) {
    if (n == 0) return nullptr;
    keep.push_back(memory::host_alloc(n * sizeof(float)));
    return memory::as<float>(keep.back());
  }
};

// The bf16 dot route: bf16 in (raw bits), f32 sums. One packed operand and, for tgmm, one
// transposed block per thread; C goes through Scratch's f32 buffer when the output is not f32.
bool bf16_dot(const Problem& p) { return p.dtype == DType::kBF16 && cpu_bf16_gemm::available(); }

const uint16_t* bits(const void* p) { return static_cast<const uint16_t*>(p); }

// dst [cols × rows] = src [rows × cols] (row stride ld), in 16 × 16 blocks.
void transpose_bf16(const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, uint16_t* dst) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16)
      for (int64_t r = r0; r < std::min(r0 + 16, rows); ++r)
        for (int64_t c = c0; c < std::min(c0 + 16, cols); ++c) dst[c * rows + r] = src[r * ld + c];
}

// Packs B [K × N] whose row k starts at base + k·ld.
void pack_strided_rows(const uint16_t* base, int64_t ld, int64_t K, int64_t N, uint32_t* packed,
                       std::vector<const uint16_t*>& ptrs) {
  ptrs.resize(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) ptrs[static_cast<size_t>(k)] = base + k * ld;
  cpu_bf16_gemm::pack_rows(ptrs.data(), K, N, packed);
}

// Rows of `width` elements at base + r·ld, r < rows: the part of a packed chunk's source in DRAM.
template <class T>
struct PanelSource {
  const T* base;
  int64_t ld, rows, width;
  // Prefetches (for L2) the lines of rows [rows·i / parts, rows·(i + 1) / parts).
  void prefetch(int64_t i, int64_t parts) const {
    constexpr int64_t line = 64 / sizeof(T);
    for (int64_t r = rows * i / parts; r < rows * (i + 1) / parts; ++r)
      for (int64_t c = 0; c < width; c += line) __builtin_prefetch(base + r * ld + c, 0, 2);
  }
};

// The chunk after rows [k0, k0 + kc) of the column block at c0 (blocks of `step` columns up to
// c1, chunks of at most kc_max of K rows): the same block's next rows, else the next block's first;
// w <= 0 when there is none.
struct NextChunk {
  int64_t c0, k0, w, kc;
  NextChunk(int64_t c0_, int64_t k0_, int64_t kc_, int64_t K, int64_t c1, int64_t step, int64_t kc_max) {
    const bool same = k0_ + kc_ < K;
    c0 = same ? c0_ : c0_ + step, k0 = same ? k0_ + kc_ : 0;
    w = std::min(step, c1 - c0), kc = std::min(kc_max, K - k0);
  }
};

// A small group's rows against one packed chunk, kSliceRows at a time (product(r0, rn)), the next
// chunk's source (rows × width at base, row stride ld; none when width or rows <= 0) prefetched a
// part per slice: the rows of a small group take little longer to run than a chunk to load.
template <class T, class F>
void rows_with_prefetch(int64_t rows, const T* base, int64_t ld, int64_t src_rows, int64_t width, F&& product) {
  const int64_t slices = (rows + kSliceRows - 1) / kSliceRows;
  const PanelSource<T> src{base, ld, src_rows, width};
  for (int64_t i = 0; i < slices; ++i) {
    if (src_rows > 0 && width > 0) src.prefetch(i, slices);
    const int64_t r0 = i * kSliceRows;
    product(r0, std::min(kSliceRows, rows - r0));
  }
}

// The f32 route on the packed micro-kernel: f32 in and out, AVX-512F, TESSERA_CPU_F32_GEMM not 0.
bool f32_kernel(const Problem& p, DType out) {
  return p.dtype == DType::kF32 && out == DType::kF32 && cpu_f32_gemm::available();
}

// [0, n) in ceil(n / block) near-equal parts whose bounds are multiples of kPanel (the last ends at n).
std::vector<std::pair<int64_t, int64_t>> split_panels(int64_t n, int64_t block) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (n <= 0) return out;
  for (auto [a, b] : split((n + kPanel - 1) / kPanel, std::max<int64_t>(1, block / kPanel)))
    out.emplace_back(a * kPanel, std::min(n, b * kPanel));
  return out;
}

// [0, n) in `parts` near-equal parts (at least ceil(n / most), at most n; none for n = 0).
std::vector<std::pair<int64_t, int64_t>> split_count(int64_t n, int64_t parts, int64_t most) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (n <= 0) return out;  // before the division: most is M, 0 for an expert rank with no tokens (SIGFPE)
  most = std::max<int64_t>(most, 1);
  parts = std::min(n, std::max({parts, int64_t(1), (n + most - 1) / most}));
  for (int64_t i = 0; i < parts; ++i) out.emplace_back(n * i / parts, n * (i + 1) / parts);
  return out;
}

// Parts to cut an item of `work` into so that none is over a (2·threads)-th of the call's `total`
// (1 when it is not): few groups, or one group of most rows (skewed routing), still keep every
// thread busy; many groups stay one item per column chunk.
int64_t parts_for_threads(const Problem& p, double work, double total) {
  const double share = total / (2.0 * std::max(1, p.num_threads));
  return share <= 0 ? 1 : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(work / share)));
}

struct DotScratch {
  std::vector<memory::HostBuffer> keep;
  std::vector<uint32_t*> packed;
  std::vector<uint16_t*> t;  // tgmm: a transposed block
  std::vector<std::vector<const uint16_t*>> ptrs;
  void make(int T, size_t packed_words, size_t t_elems) {
    ptrs.resize(static_cast<size_t>(T));
    for (int i = 0; i < T; ++i) {
      keep.push_back(memory::host_alloc(packed_words * sizeof(uint32_t)));
      packed.push_back(memory::as<uint32_t>(keep.back()));
      keep.push_back(memory::host_alloc(std::max<size_t>(t_elems, 1) * sizeof(uint16_t)));
      t.push_back(memory::as<uint16_t>(keep.back()));
    }
  }
};

// Runs body(item, tid) over items on up to p.num_threads threads, heaviest first.
template <class F>
void for_items(const Problem& p, const std::vector<Item>& items, int T, F&& body) {
  std::atomic<size_t> next{0};
  cpu_threads::run_threads(T, /*blas=*/true, std::string(kKernelName) + " cpu", [&](int tid) {
    for (size_t i = next.fetch_add(1); i < items.size(); i = next.fetch_add(1)) body(items[i], tid);
  });
  (void)p;
}

int thread_count(const Problem& p, size_t items) {
  return static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(p.num_threads, static_cast<int64_t>(items)), 1, kMaxThreads));
}

// A tgmm item's block of drhs[g]: [kc, nc] at (k0, c0) with stride N, or [nc, kc] at (c0, k0)
// with stride K (transpose_rhs). Products accumulate in C: the output itself when it is f32, else
// the thread's f32 buffer, rounded into the output by store().
struct TgmmBlock {
  int64_t off, ld, rows, cols, ldC;
  bool out_f32;
  float* C;
  float* buf;
  TgmmBlock(const Problem& p, const TgmmArgs& x, const Item& it, float* cbuf) : buf(cbuf) {
    const int64_t kc = it.r1 - it.r0, nc = it.c1 - it.c0, K = p.K, N = p.N;
    const bool t = p.transpose_rhs;
    off = t ? it.g * N * K + it.c0 * K + it.r0 : it.g * K * N + it.r0 * N + it.c0;
    ld = t ? K : N, rows = t ? nc : kc, cols = t ? kc : nc;
    out_f32 = x.c_dtype == DType::kF32;
    C = out_f32 ? static_cast<float*>(x.c) + off : cbuf;
    ldC = out_f32 ? ld : cols;
  }
  void zero(const TgmmArgs& x) const { zero_block(x.c, x.c_dtype, off, ld, rows, cols); }
  void store(const TgmmArgs& x) const {
    if (!out_f32) from_f32(buf, rows, cols, x.c, x.c_dtype, off, ld);
  }
};

class Cpu final : public Implementation {
 public:
  std::string name() const override { return "cpu"; }
  std::string description() const override {
    return "packed AVX-512 FMA micro-kernel per (group, column chunk) for f32 (else OpenBLAS sgemm per (group, row "
           "block, column tile)); bf16: the AVX512-BF16 dot product; threads over tiles, deterministic";
  }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  Availability supports(const Problem& p) const override {
    if (p.device.type != DeviceType::kCPU)
      return Availability::no("inputs are on " + p.device.str() + ", cpu runs on host memory");
    if (p.M > INT_MAX || p.K > INT_MAX || p.N > INT_MAX)
      return Availability::no("M, K and N must each fit a BLAS int (<= 2^31 - 1)");
    return Availability::yes();
  }
  void validate_block_sizes(const BlockSizes& bs) const override {
    check(bs.m >= 1 && bs.m <= kMaxBlock && bs.n >= 1 && bs.n <= kMaxBlock, ErrorCode::kInvalidArgument,
          std::string(kKernelName) + " cpu: block sizes m and n must be in [1, 65536], got " + bs.str());
  }

  void gmm(const Problem& p, const BlockSizes& bs, const GmmArgs& x) const override {
    TESSERA_TRACE_SCOPE("gmm.gmm");
    zero_block(x.c, x.c_dtype, 0, p.N, p.row_lo(), p.N);
    zero_block(x.c, x.c_dtype, p.row_hi() * p.N, p.N, p.M - p.row_hi(), p.N);
    if (p.K == 0) {  // empty sums: zero (the chunked routes would not write at all)
      zero_block(x.c, x.c_dtype, p.row_lo() * p.N, p.N, p.row_hi() - p.row_lo(), p.N);
      return;
    }
    if (f32_kernel(p, x.c_dtype)) return gmm_kernel(p, bs, x);
    std::vector<Item> items;
    for (int64_t g = 0; g < p.G; ++g) {
      if (p.rows(g) == 0) continue;
      for (auto [r0, r1] : split(p.rows(g), bs.m))
        for (auto [c0, c1] : split(p.N, bs.n))
          items.push_back({g, p.begin[g] + r0, p.begin[g] + r1, c0, c1, double(r1 - r0) * double(c1 - c0)});
    }
    if (items.empty()) return;
    sort_heaviest_first(items);
    const int T = thread_count(p, items.size());
    const bool in_f32 = p.dtype == DType::kF32, out_f32 = x.c_dtype == DType::kF32;
    const size_t mb = static_cast<size_t>(std::min(bs.m, p.M)), nb = static_cast<size_t>(std::min(bs.n, p.N));
    Scratch s;
    if (bf16_dot(p)) {
      DotScratch d;
      d.make(T, static_cast<size_t>(cpu_bf16_gemm::packed_words(p.K, static_cast<int64_t>(nb))), 0);
      s.make(T, 0, 0, out_f32 ? 0 : mb * nb);
      for_items(p, items, T, [&](const Item& it, int tid) {
        gmm_item_dot(p, x, it, d.packed[tid], d.ptrs[tid], s.c[tid]);
      });
      return;
    }
    if (!in_f32 && cpu_f32_gemm::available()) {  // f16 (bf16 without the dot): widened into f32 panels (+ scratch)
      s.make(T, mb * static_cast<size_t>(p.K), 2 * static_cast<size_t>(kPanel * p.K), out_f32 ? 0 : mb * nb);
      for_items(p, items, T, [&](const Item& it, int tid) { gmm_item_panels(p, x, it, s.a[tid], s.b[tid], s.c[tid]); });
      return;
    }
    s.make(T, in_f32 ? 0 : mb * p.K, in_f32 ? 0 : nb * p.K, out_f32 ? 0 : mb * nb);
    for_items(p, items, T, [&](const Item& it, int tid) { gmm_item(p, x, it, s.a[tid], s.b[tid], s.c[tid]); });
  }

  void tgmm(const Problem& p, const BlockSizes& bs, const TgmmArgs& x) const override {
    TESSERA_TRACE_SCOPE("gmm.tgmm");
    if (f32_kernel(p, x.c_dtype)) return tgmm_kernel(p, bs, x);
    std::vector<Item> items;
    for (int64_t g = 0; g < p.G; ++g)
      for (auto [k0, k1] : split(p.K, bs.m))
        for (auto [c0, c1] : split(p.N, bs.n))
          items.push_back({g, k0, k1, c0, c1, double(p.rows(g)) * double(k1 - k0) * double(c1 - c0)});
    sort_heaviest_first(items);
    const int T = thread_count(p, items.size());
    const bool in_f32 = p.dtype == DType::kF32, out_f32 = x.c_dtype == DType::kF32;
    const size_t mb = static_cast<size_t>(std::min(bs.m, p.K)), nb = static_cast<size_t>(std::min(bs.n, p.N));
    const size_t rb = static_cast<size_t>(std::min<int64_t>(kRowBlock, std::max<int64_t>(1, p.M)));
    Scratch s;
    if (bf16_dot(p)) {
      s.make(T, 0, 0, out_f32 ? 0 : mb * nb);
      // The transposed operand is the item's lhs columns (or its dout columns with transpose_rhs).
      const size_t tcols = p.transpose_rhs ? nb : mb, pcols = p.transpose_rhs ? mb : nb;
      DotScratch d;
      d.make(T, static_cast<size_t>(cpu_bf16_gemm::packed_words(static_cast<int64_t>(rb), static_cast<int64_t>(pcols))),
             rb * tcols);
      for_items(p, items, T, [&](const Item& it, int tid) {
        tgmm_item_dot(p, x, it, d.t[tid], d.packed[tid], d.ptrs[tid], s.c[tid]);
      });
      return;
    }
    s.make(T, in_f32 ? 0 : rb * mb, in_f32 ? 0 : rb * nb, out_f32 ? 0 : mb * nb);
    for_items(p, items, T, [&](const Item& it, int tid) { tgmm_item(p, x, it, s.a[tid], s.b[tid], s.c[tid]); });
  }

 private:
  // gmm on the f32 micro-kernel: items (group, its rows — in parts only for threads —, a
  // kPanel-aligned chunk of ≤ max(n, kPanel) columns).
  void gmm_kernel(const Problem& p, const BlockSizes& bs, const GmmArgs& x) const {
    const auto chunks = split_panels(p.N, bs.n);
    if (chunks.empty()) return;
    const double total = double(p.row_hi() - p.row_lo()) * double(p.N), width = double(chunks.front().second);
    std::vector<Item> items;
    for (int64_t g = 0; g < p.G; ++g)
      for (auto [r0, r1] : split_count(p.rows(g), parts_for_threads(p, double(p.rows(g)) * width, total), p.M))
        for (auto [c0, c1] : chunks)
          items.push_back({g, p.begin[g] + r0, p.begin[g] + r1, c0, c1, double(r1 - r0) * double(c1 - c0)});
    if (items.empty()) return;
    sort_heaviest_first(items);
    const int T = thread_count(p, items.size());
    Scratch s;
    s.make(T, 0, static_cast<size_t>(cpu_f32_gemm::packed_floats(p.K, kPanel)), 0);
    for_items(p, items, T, [&](const Item& it, int tid) { gmm_item_kernel(p, x, it, s.b[tid]); });
  }

  // c[r0:r1, c0:c1] = a[r0:r1, :] · b[g][:, c0:c1], one packed panel of b[g] at a time; for a
  // group of at most kChunkedRows rows each panel in chunks of kKChunk rows of b (c accumulates over
  // the chunks). rhs comes from DRAM once (G·K·N values: 512 MiB at G = 64, K = 1024, N = 2048) and
  // the rows of a small group take little longer to run than a chunk to load, so while a chunk's
  // rows run, kSliceRows at a time, the next chunk's source lines are prefetched into L2 a part per
  // slice. Unchunked, a K × 64 panel (256 KiB at K = 1024), the next one and the group's rows of a
  // overflowed L2 and the prefetched lines were gone when they were packed (the trace's gmm.pack:
  // 24 ms of 105 per call at G = 64, DRAM speed); chunked, a larger group would re-read its c from
  // beyond L2 once per chunk (slower at 512 rows and more, measured).
  static void gmm_item_kernel(const Problem& p, const GmmArgs& x, const Item& it, float* packed) {
    TESSERA_TRACE_SCOPE_I("gmm.gmm.item", it.g);
    namespace f32 = cpu_f32_gemm;
    const int64_t K = p.K, N = p.N, rows = it.r1 - it.r0;
    const bool trans = p.transpose_rhs;
    const float* A = static_cast<const float*>(x.a) + it.r0 * K;
    const float* B = static_cast<const float*>(x.b) + it.g * K * N;
    float* C = static_cast<float*>(x.c) + it.r0 * N;
    const int64_t kc_max = p.rows(it.g) <= kChunkedRows ? kKChunk : K;  // by the group: any thread count, same sums
    // The chunk [k0, k0 + kc) of the panel at column c0, w columns wide: where it starts in b[g].
    const auto chunk = [&](int64_t c0, int64_t k0) { return trans ? B + c0 * K + k0 : B + k0 * N + c0; };
    for (int64_t c0 = it.c0; c0 < it.c1; c0 += kPanel) {
      const int64_t w = std::min(kPanel, it.c1 - c0);
      for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
        const int64_t kc = std::min(kc_max, K - k0);
        {
          TESSERA_TRACE_SCOPE("gmm.pack");
          f32::pack(trans, kc, w, chunk(c0, k0), trans ? K : N, packed);
        }
        const NextChunk n(c0, k0, kc, K, it.c1, kPanel, kc_max);
        TESSERA_TRACE_SCOPE("gmm.gemm");
        rows_with_prefetch(rows, n.w > 0 ? chunk(n.c0, n.k0) : B, trans ? K : N, trans ? n.w : n.kc,
                           trans ? n.kc : n.w, [&](int64_t r0, int64_t rn) {
                             f32::gemm(f32::Tri::kNone, false, rn, w, kc, 1.0f, A + r0 * K + k0, K, packed,
                                       k0 > 0 ? 1.0f : 0.0f, C + r0 * N + c0, N);
                           });
      }
    }
  }

  // tgmm on the f32 micro-kernel. The output block [crows × ccols] of drhs[g] (TgmmBlock): its
  // rows index the operand that is transposed (lhs columns, or dout's with transpose_rhs),
  // whole up to kMaxSpan and in parts only for threads; its columns the packed operand's, in
  // kPanel-aligned chunks of ≤ max(n, kPanel). Items are (group, rows part, columns chunk) in
  // Item's (K, N) coordinates.
  void tgmm_kernel(const Problem& p, const BlockSizes& bs, const TgmmArgs& x) const {
    const bool t = p.transpose_rhs;
    const int64_t span = t ? p.N : p.K, width = t ? p.K : p.N;  // C's rows, C's columns
    const auto chunks = split_panels(width, bs.n);
    if (chunks.empty() || span == 0) return;
    const double total = double(p.row_hi() - p.row_lo()) * double(span) * double(width);
    const double chunk = double(chunks.front().second);
    std::vector<Item> items;
    int64_t most_rows = 0;  // of C in an item: the transposed block's
    for (int64_t g = 0; g < p.G; ++g)
      for (auto [s0, s1] : split_count(span, parts_for_threads(p, double(p.rows(g)) * double(span) * chunk, total), kMaxSpan))
        for (auto [c0, c1] : chunks) {
          most_rows = std::max(most_rows, s1 - s0);
          const double work = double(std::max<int64_t>(p.rows(g), 1)) * double(s1 - s0) * double(c1 - c0);
          items.push_back(t ? Item{g, c0, c1, s0, s1, work} : Item{g, s0, s1, c0, c1, work});
        }
    if (items.empty()) return;
    sort_heaviest_first(items);
    const int T = thread_count(p, items.size());
    int64_t rb = 1;  // rows of a block: the largest group's, up to kRowBlock
    for (int64_t g = 0; g < p.G; ++g) rb = std::max(rb, std::min(kRowBlock, p.rows(g)));
    Scratch s;
    s.make(T, static_cast<size_t>(rb * most_rows), static_cast<size_t>(cpu_f32_gemm::packed_floats(rb, kPanel)), 0);
    for_items(p, items, T, [&](const Item& it, int tid) { tgmm_item_kernel(p, x, it, s.a[tid], s.b[tid]); });
  }

  // drhs[g] block (+)= Tᵀ-side · packed over the group's rows, kRowBlock at a time: T = the
  // item's columns of the transposed operand (rb × crows, transposed to crows × rb), each kPanel
  // columns of the packed operand's item columns packed in turn.
  static void tgmm_item_kernel(const Problem& p, const TgmmArgs& x, const Item& it, float* tbuf, float* packed) {
    TESSERA_TRACE_SCOPE_I("gmm.tgmm.item", it.g);
    namespace f32 = cpu_f32_gemm;
    const int64_t K = p.K, N = p.N, R = p.rows(it.g);
    const bool trans = p.transpose_rhs;
    const TgmmBlock b(p, x, it, nullptr);
    if (R == 0) return b.zero(x);
    const float* a = static_cast<const float*>(x.a);
    const float* d = static_cast<const float*>(x.d);
    const float* tsrc = trans ? d + it.c0 : a + it.r0;
    const float* psrc = trans ? a + it.r0 : d + it.c0;
    const int64_t ldt = trans ? N : K, ldp = trans ? K : N;
    for (int64_t r = 0, row0 = p.begin[it.g]; r < R; r += kRowBlock) {
      const int64_t rb = std::min(kRowBlock, R - r);
      {
        TESSERA_TRACE_SCOPE("gmm.pack");
        f32::transpose(rb, b.rows, tsrc + (row0 + r) * ldt, ldt, tbuf, rb);
      }
      for (int64_t c0 = 0; c0 < b.cols; c0 += kPanel) {
        const int64_t w = std::min(kPanel, b.cols - c0);
        {
          TESSERA_TRACE_SCOPE("gmm.pack");
          f32::pack(false, rb, w, psrc + (row0 + r) * ldp + c0, ldp, packed);
        }
        TESSERA_TRACE_SCOPE("gmm.gemm");
        f32::gemm(f32::Tri::kNone, false, b.rows, w, rb, 1.0f, tbuf, rb, packed, r > 0 ? 1.0f : 0.0f, b.C + c0, b.ldC);
      }
    }
  }

  // c[r0:r1, c0:c1] = a[r0:r1, :] · b[g][:, c0:c1].
  static void gmm_item(const Problem& p, const GmmArgs& x, const Item& it, float* abuf, float* bbuf, float* cbuf) {
    TESSERA_TRACE_SCOPE_I("gmm.gmm.item", it.g);
    const int64_t rows = it.r1 - it.r0, cols = it.c1 - it.c0, K = p.K, N = p.N;
    const bool trans = p.transpose_rhs;
    const float* A = nullptr;
    const float* B = nullptr;
    int64_t lda = K, ldb = trans ? K : N;
    if (p.dtype == DType::kF32) {
      A = static_cast<const float*>(x.a) + it.r0 * K;
      B = static_cast<const float*>(x.b) + (trans ? it.g * N * K + it.c0 * K : it.g * K * N + it.c0);
    } else {
      TESSERA_TRACE_SCOPE("gmm.pack");  // bf16/f16 rows and columns to f32
      to_f32(x.a, p.dtype, it.r0 * K, K, rows, K, abuf);
      if (trans) {
        to_f32(x.b, p.dtype, it.g * N * K + it.c0 * K, K, cols, K, bbuf);  // [cols, K]
      } else {
        to_f32(x.b, p.dtype, it.g * K * N + it.c0, N, K, cols, bbuf);  // [K, cols]
        ldb = cols;
      }
      A = abuf, B = bbuf;
    }
    TESSERA_TRACE_SCOPE("gmm.gemm");  // and the store of a bf16/f16 output
    if (x.c_dtype == DType::kF32) {
      cpu_blas::sgemm(false, trans, rows, cols, K, 1.0f, A, lda, B, ldb, 0.0f,
                      static_cast<float*>(x.c) + it.r0 * N + it.c0, N);
    } else {
      cpu_blas::sgemm(false, trans, rows, cols, K, 1.0f, A, lda, B, ldb, 0.0f, cbuf, cols);
      from_f32(cbuf, rows, cols, x.c, x.c_dtype, it.r0 * N + it.c0, N);
    }
  }

  // gmm_item for bf16/f16 inputs on the f32 micro-kernel: the item's lhs rows converted to f32 once,
  // rhs[g] widened straight into packed f32 panels (f32::pack_half), a chunk at a
  // time (K in kKChunk rows for groups of <= kChunkedRows rows) with the next chunk's source
  // prefetched while the rows run; the output accumulates over the chunks.
  static void gmm_item_panels(const Problem& p, const GmmArgs& x, const Item& it, float* abuf, float* bbuf,
                              float* cbuf) {
    TESSERA_TRACE_SCOPE_I("gmm.gmm.item", it.g);
    namespace f32 = cpu_f32_gemm;
    const int64_t rows = it.r1 - it.r0, cols = it.c1 - it.c0, K = p.K, N = p.N;
    const bool trans = p.transpose_rhs, out_f32 = x.c_dtype == DType::kF32;
    {
      TESSERA_TRACE_SCOPE("gmm.pack");
      to_f32(x.a, p.dtype, it.r0 * K, K, rows, K, abuf);
    }
    float* C = out_f32 ? static_cast<float*>(x.c) + it.r0 * N + it.c0 : cbuf;
    const int64_t ldc = out_f32 ? N : cols, kc_max = p.rows(it.g) <= kChunkedRows ? kKChunk : K;
    const uint16_t* B = bits(x.b) + it.g * K * N;
    const auto at = [&](int64_t c0, int64_t k0) { return trans ? B + c0 * K + k0 : B + k0 * N + c0; };
    float *panel = bbuf, *scratch = bbuf + kPanel * K;  // pack_half_scratch(trans, kc) ≤ kPanel·K
    for (int64_t c0 = it.c0; c0 < it.c1; c0 += kPanel) {
      const int64_t w = std::min(kPanel, it.c1 - c0);
      for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
        const int64_t kc = std::min(kc_max, K - k0);
        {
          TESSERA_TRACE_SCOPE("gmm.pack");
          f32::pack_half(trans, kc, w, at(c0, k0), trans ? K : N, p.dtype == DType::kBF16, panel, scratch);
        }
        const NextChunk n(c0, k0, kc, K, it.c1, kPanel, kc_max);
        TESSERA_TRACE_SCOPE("gmm.gemm");
        rows_with_prefetch(rows, n.w > 0 ? at(n.c0, n.k0) : B, trans ? K : N, trans ? n.w : n.kc, trans ? n.kc : n.w,
                           [&](int64_t r0, int64_t rn) {
                             f32::gemm(f32::Tri::kNone, false, rn, w, kc, 1.0f, abuf + r0 * K + k0, K, panel,
                                       k0 > 0 ? 1.0f : 0.0f, C + r0 * ldc + (c0 - it.c0), ldc);
                           });
      }
    }
    if (!out_f32) {
      TESSERA_TRACE_SCOPE("gmm.store");
      from_f32(cbuf, rows, cols, x.c, x.c_dtype, it.r0 * N + it.c0, N);
    }
  }

  // gmm_item on the bf16 dot product: the item's columns of rhs[g] packed, lhs rows in place.
  static void gmm_item_dot(const Problem& p, const GmmArgs& x, const Item& it, uint32_t* packed,
                           std::vector<const uint16_t*>& ptrs, float* cbuf) {
    TESSERA_TRACE_SCOPE_I("gmm.gmm.item", it.g);
    const int64_t rows = it.r1 - it.r0, cols = it.c1 - it.c0, K = p.K, N = p.N;
    const bool out_f32 = x.c_dtype == DType::kF32;
    float* C = out_f32 ? static_cast<float*>(x.c) + it.r0 * N + it.c0 : cbuf;
    const int64_t ldc = out_f32 ? N : cols;
    if (p.rows(it.g) <= kChunkedRows) {
      gmm_item_dot_chunked(p, x, it, packed, ptrs, C, ldc);
    } else {
      {
        TESSERA_TRACE_SCOPE("gmm.pack");
        pack_dot(p, x, it.g, it.c0, cols, 0, K, packed, ptrs);
      }
      TESSERA_TRACE_SCOPE("gmm.gemm");
      cpu_bf16_gemm::gemm(rows, cols, K, bits(x.a) + it.r0 * K, K, packed, 1.0f, false, C, ldc);
    }
    TESSERA_TRACE_SCOPE("gmm.store");  // of a bf16/f16 output
    if (!out_f32) from_f32(cbuf, rows, cols, x.c, x.c_dtype, it.r0 * N + it.c0, N);
  }

  // Packs rows [k0, k0 + kc) of columns [c0, c0 + w) of rhs[g] for the bf16 dot product.
  static void pack_dot(const Problem& p, const GmmArgs& x, int64_t g, int64_t c0, int64_t w, int64_t k0, int64_t kc,
                       uint32_t* packed, std::vector<const uint16_t*>& ptrs) {
    const int64_t K = p.K, N = p.N;
    if (p.transpose_rhs) {  // rhs[g] is [N, K]: the item's columns are rows of it
      ptrs.resize(static_cast<size_t>(w));
      for (int64_t c = 0; c < w; ++c) ptrs[static_cast<size_t>(c)] = bits(x.b) + g * N * K + (c0 + c) * K + k0;
      cpu_bf16_gemm::pack_cols(ptrs.data(), kc, w, packed);
    } else {
      pack_strided_rows(bits(x.b) + g * K * N + k0 * N + c0, N, kc, w, packed, ptrs);
    }
  }

  // gmm_item_dot for a small group (as gmm_item_kernel): chunks of kKChunk rows × kDotCols columns
  // of rhs[g], the next chunk's source prefetched while the group's rows run against this one.
  static void gmm_item_dot_chunked(const Problem& p, const GmmArgs& x, const Item& it, uint32_t* packed,
                                   std::vector<const uint16_t*>& ptrs, float* C, int64_t ldc) {
    const int64_t rows = it.r1 - it.r0, K = p.K, N = p.N;
    const bool trans = p.transpose_rhs;
    const uint16_t* B = bits(x.b) + it.g * K * N;
    for (int64_t c0 = it.c0; c0 < it.c1; c0 += kDotCols) {
      const int64_t w = std::min(kDotCols, it.c1 - c0);
      for (int64_t k0 = 0; k0 < K; k0 += kKChunk) {
        const int64_t kc = std::min(kKChunk, K - k0);
        {
          TESSERA_TRACE_SCOPE("gmm.pack");
          pack_dot(p, x, it.g, c0, w, k0, kc, packed, ptrs);
        }
        const NextChunk n(c0, k0, kc, K, it.c1, kDotCols, kKChunk);
        const uint16_t* next = n.w <= 0 ? B : trans ? B + n.c0 * K + n.k0 : B + n.k0 * N + n.c0;
        TESSERA_TRACE_SCOPE("gmm.gemm");
        rows_with_prefetch(rows, next, trans ? K : N, trans ? n.w : n.kc, trans ? n.kc : n.w, [&](int64_t r0, int64_t rn) {
          cpu_bf16_gemm::gemm(rn, w, kc, bits(x.a) + (it.r0 + r0) * K + k0, K, packed, 1.0f, k0 > 0,
                              C + r0 * ldc + (c0 - it.c0), ldc);
        });
      }
    }
  }

  // tgmm_item on the bf16 dot product, kRowBlock rows of the group at a time: C (+)= Tᵀ-side ·
  // packed, where T is the transposed block of the operand whose columns index C's rows (lhs,
  // or dout with transpose_rhs) and the other operand's rows are packed.
  static void tgmm_item_dot(const Problem& p, const TgmmArgs& x, const Item& it, uint16_t* tbuf, uint32_t* packed,
                            std::vector<const uint16_t*>& ptrs, float* cbuf) {
    TESSERA_TRACE_SCOPE_I("gmm.tgmm.item", it.g);
    const int64_t K = p.K, N = p.N, R = p.rows(it.g);
    const bool trans = p.transpose_rhs;
    const TgmmBlock b(p, x, it, cbuf);
    if (R == 0) return b.zero(x);
    const int64_t crows = b.rows, ccols = b.cols;
    float* const C = b.C;
    const int64_t ldC = b.ldC;
    // Rows of C index the transposed operand's columns; columns of C the packed operand's.
    const uint16_t* tsrc = trans ? bits(x.d) + it.c0 : bits(x.a) + it.r0;
    const uint16_t* psrc = trans ? bits(x.a) + it.r0 : bits(x.d) + it.c0;
    const int64_t ldt = trans ? N : K, ldp = trans ? K : N;
    for (int64_t r = 0, row0 = p.begin[it.g]; r < R; r += kRowBlock) {
      const int64_t rb = std::min(kRowBlock, R - r);
      {
        TESSERA_TRACE_SCOPE("gmm.pack");
        transpose_bf16(tsrc + (row0 + r) * ldt, ldt, rb, crows, tbuf);
        pack_strided_rows(psrc + (row0 + r) * ldp, ldp, rb, ccols, packed, ptrs);
      }
      TESSERA_TRACE_SCOPE("gmm.gemm");
      cpu_bf16_gemm::gemm(crows, ccols, rb, tbuf, rb, packed, 1.0f, r > 0, C, ldC);
    }
    b.store(x);
  }

  // drhs[g][k0:k1, c0:c1] = a[rows of g, k0:k1]ᵀ · d[rows of g, c0:c1] (stored transposed with
  // transpose_rhs: drhs[g][c0:c1, k0:k1]).
  static void tgmm_item(const Problem& p, const TgmmArgs& x, const Item& it, float* abuf, float* dbuf, float* cbuf) {
    TESSERA_TRACE_SCOPE_I("gmm.tgmm.item", it.g);
    const int64_t kc = it.r1 - it.r0, nc = it.c1 - it.c0, K = p.K, N = p.N, R = p.rows(it.g);
    const bool trans = p.transpose_rhs;
    const TgmmBlock b(p, x, it, cbuf);
    if (R == 0) return b.zero(x);
    float* const C = b.C;
    const int64_t ldC = b.ldC;
    const int64_t row0 = p.begin[it.g];
    const int64_t step = p.dtype == DType::kF32 ? R : kRowBlock;
    for (int64_t r = 0; r < R; r += step) {
      const int64_t rb = std::min(step, R - r);
      const float *A, *D;
      int64_t lda = K, ldd = N;
      if (p.dtype == DType::kF32) {
        A = static_cast<const float*>(x.a) + (row0 + r) * K + it.r0;
        D = static_cast<const float*>(x.d) + (row0 + r) * N + it.c0;
      } else {
        TESSERA_TRACE_SCOPE("gmm.pack");
        to_f32(x.a, p.dtype, (row0 + r) * K + it.r0, K, rb, kc, abuf);
        to_f32(x.d, p.dtype, (row0 + r) * N + it.c0, N, rb, nc, dbuf);
        A = abuf, D = dbuf, lda = kc, ldd = nc;
      }
      const float beta = r == 0 ? 0.0f : 1.0f;
      TESSERA_TRACE_SCOPE("gmm.gemm");
      if (trans)
        cpu_blas::sgemm(true, false, nc, kc, rb, 1.0f, D, ldd, A, lda, beta, C, ldC);
      else
        cpu_blas::sgemm(true, false, kc, nc, rb, 1.0f, A, lda, D, ldd, beta, C, ldC);
    }
    b.store(x);
  }
};

}  // namespace

std::unique_ptr<Implementation> make_cpu_implementation() { return std::make_unique<Cpu>(); }

}  // namespace tessera::grouped_matmul
