// linear_cross_entropy: gradients of a 16-bit dw in vocabulary slices (cpu_vocab_slices.h).
#include "kernels/linear_cross_entropy/cpu_vocab_slices.h"

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "core/memory.h"
#include "core/trace.h"
#include "primitives/cpu_bf16_gemm.h"
#include "primitives/cpu_convert.h"
#include "primitives/cpu_f32_gemm.h"
#include "tessera/error.h"

namespace tessera::linear_cross_entropy::vocab_slices {
namespace {

constexpr int64_t kAlign = 64;  // slice widths: whole cache lines of a 16-bit row, packer pairs
constexpr size_t kReserve = size_t{1} << 20;

template <class T>
T* alloc(memory::HostBuffer& buf, int64_t count) {
  buf = memory::host_alloc(static_cast<size_t>(std::max<int64_t>(1, count)) * sizeof(T));
  return memory::as<T>(buf);
}

const char* at(const void* base, int64_t element, DType t) {
  return static_cast<const char*>(base) + element * static_cast<int64_t>(dtype_size(t));
}
char* at(void* base, int64_t element, DType t) { return static_cast<char*>(base) + element * static_cast<int64_t>(dtype_size(t)); }

// Columns [c0, c0 + n) of a row-major [rows × ld] 16-bit matrix to/from a contiguous [rows × n] one.
void gather_columns(const void* src, int64_t rows, int64_t ld, int64_t c0, int64_t n, uint16_t* dst) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * n, s + r * ld + c0, static_cast<size_t>(n) * 2);
}
void scatter_columns(const uint16_t* src, int64_t rows, int64_t ld, int64_t c0, int64_t n, void* dst) {
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(d + r * ld + c0, src + r * n, static_cast<size_t>(n) * 2);
}

// The slice [c0, c0 + n) of p in the partial form: labels relative to c0 (ignored rows keep a
// label no relative label can be), w, bias and class weights from c0 on. w_slice: an [H, V] w's
// columns, gathered by the caller.
Problem slice_of(const Problem& p, int64_t c0, int64_t n, const void* w_slice, int64_t* labels) {
  Problem q = p;
  q.V = n;
  q.V_total = p.V;
  q.memory_budget = 0;
  q.budget_spent = true;
  q.want_argmax = false;
  q.ignore_index = -p.V;  // outside (−V, V), where every relative label lies
  for (int64_t t = 0; t < p.B; ++t) {
    const int64_t y = p.label(t);
    labels[t] = y == p.ignore_index ? q.ignore_index : y - c0;
  }
  q.labels = labels;
  q.label_dtype = DType::kI64;
  q.w = p.layout == WLayout::kHV ? w_slice : at(p.w, c0 * p.H, p.dtype);
  if (p.bias) q.bias = at(p.bias, c0, p.bias_dtype);
  // The partial form's class weights are all V_total of them rotated to the slice; the cpu
  // backward reads only entries [0, n) and the labels inside the slice (cpu_rows.cc), so the
  // unrotated array from c0 on gives the same values.
  if (p.class_weights) q.class_weights = p.class_weights + c0;
  return q;
}

// The backend's route for a 16-bit problem, as cpu.cc's Call::setup picks it: the bf16 dot
// product, the packed f32 micro-kernel (pk), or OpenBLAS.
bool dot_route(const Problem& p) { return p.dtype == DType::kBF16 && cpu_bf16_gemm::available(); }
bool pk_route(const Problem& p) { return !dot_route(p) && cpu_f32_gemm::available(); }
// Rows of the pk route's slab slot: b rounded up to the micro-kernel's 64-column panel.
double pk_rows(const Problem& p, const BlockSizes& bs) {
  const int64_t bb = std::min(bs.b, p.B), panel = cpu_f32_gemm::kPanel;
  return static_cast<double>((bb + panel - 1) / panel * panel);
}

// Bytes of the backend's b×V slab per vocabulary column: f32 plus dz in bf16 on the dot route
// (6·b), f32 for b rounded up to 64 rows on the pk route, f32 (4·b) on OpenBLAS.
double slab_per_column(const Problem& p, const BlockSizes& bs) {
  if (dot_route(p)) return 6.0 * static_cast<double>(std::min(bs.b, p.B));
  return 4.0 * (pk_route(p) ? pk_rows(p, bs) : static_cast<double>(std::min(bs.b, p.B)));
}

// The backend's own scratch besides the slab and the dw accumulator: per thread a converted (f32
// route) or packed h × v chunk of w, the token block's x converted and dx staged (b × H f32
// each); on the pk route also x_blkᵀ and dxᵀ (or x_blk packed) and per thread w's rows widened or
// the packer's scratch; and a little more. An estimate: the Call does not report its sizes.
double backend_reserve(const Problem& p, const BlockSizes& bs) {
  const double T = std::max(1, p.num_threads), bb = static_cast<double>(std::min(bs.b, p.B)),
               h = static_cast<double>(std::min(bs.h, p.H)), v = static_cast<double>(std::min(bs.v, p.V)),
               H = static_cast<double>(p.H);
  double r = T * 4.0 * h * v + 8.0 * bb * H + static_cast<double>(kReserve);
  if (pk_route(p)) r += 8.0 * pk_rows(p, bs) * H + T * 4.0 * std::max(48.0 * std::min(v, 512.0), 64.0 * h);
  return r;
}

// The route's own buffers, all allocated before anything is written (an allocation failure then
// leaves every output untouched, as dispatch's fallback needs).
struct Buffers {
  memory::HostBuffer lse_buf, loss_buf, label_buf, sum_buf, share_buf, w_buf, dw_buf;
  float *lse = nullptr, *loss = nullptr, *sum = nullptr, *share = nullptr;
  int64_t* labels = nullptr;
  uint16_t *w_slice = nullptr, *dw_slice = nullptr;

  Buffers(const Problem& p, const GradOut& out, int64_t vc, bool need_lse) {
    const int64_t BH = p.B * p.H;
    const bool hv = p.layout == WLayout::kHV;
    if (need_lse) {
      lse = alloc<float>(lse_buf, p.B);
      loss = alloc<float>(loss_buf, p.B);
    }
    labels = alloc<int64_t>(label_buf, p.B);
    if (out.dx) {  // left out (Gradients): no dx sum
      sum = out.dx_dtype == DType::kF32 ? static_cast<float*>(out.dx) : alloc<float>(sum_buf, BH);
      if (p.V > vc) share = alloc<float>(share_buf, BH);
    }
    if (hv) {
      w_slice = alloc<uint16_t>(w_buf, p.H * vc);
      dw_slice = alloc<uint16_t>(dw_buf, p.H * vc);
    }
  }
};

// The forward's lse into b.lse (its loss into b.loss): for a backward given none.
void forward_lse(const Implementation& impl, const Problem& p, const BlockSizes& bs, const Buffers& b) {
  Problem f = p;
  f.want_argmax = false;
  f.budget_spent = true;  // the route's buffers are allocated already
  ForwardOut o;
  o.lse = b.lse;
  o.loss = b.loss;
  impl.forward(f, bs, o);
}

void run_slices(const Implementation& impl, const Problem& p, const BlockSizes& bs, const GradIn& g,
                const GradOut& out, int64_t vc, const Buffers& b) {
  TESSERA_TRACE_SCOPE("lce.vocab_slices");
  const int64_t BH = p.B * p.H;
  const bool hv = p.layout == WLayout::kHV;
  for (int64_t c0 = 0; c0 < p.V; c0 += vc) {
    const int64_t n = std::min(vc, p.V - c0);
    if (hv) gather_columns(p.w, p.H, p.V, c0, n, b.w_slice);
    const Problem q = slice_of(p, c0, n, b.w_slice, b.labels);
    GradOut o = out;
    o.dx = !out.dx ? nullptr : c0 == 0 ? b.sum : b.share;  // the first slice's share is the start of the sum
    o.dx_dtype = DType::kF32;
    o.dw = hv ? static_cast<void*>(b.dw_slice) : at(out.dw, c0 * p.H, out.dw_dtype);
    if (out.dbias) o.dbias = at(out.dbias, c0, out.dbias_dtype);
    impl.backward(q, bs, g, o);
    if (c0 > 0 && out.dx)
      for (int64_t i = 0; i < BH; ++i) b.sum[i] += b.share[i];
    if (hv) scatter_columns(b.dw_slice, p.H, p.V, c0, n, out.dw);
  }
  if (!out.dx) return;
  if (out.dx_dtype == DType::kBF16) cpu_convert::f32_to_bf16(b.sum, static_cast<uint16_t*>(out.dx), BH);
  if (out.dx_dtype == DType::kF16) cpu_convert::f32_to_f16(b.sum, static_cast<uint16_t*>(out.dx), BH);
}

// The slice width, with a warning when the budget cannot hold even the fixed part.
int64_t width(const Problem& p, const BlockSizes& bs) {
  const int64_t vc = std::min(columns(p, bs), p.V);
  if (vc == kAlign && p.V > kAlign)
    log::warn_once(std::string(kKernelName) + " cpu: memory_budget (" + memory::bytes_str(p.memory_budget) +
                   ") leaves no room beyond the two f32 B×H dx buffers and the backend's scratch: gradients in " +
                   std::to_string((p.V + kAlign - 1) / kAlign) + " slices of " + std::to_string(kAlign) +
                   " columns, slow and over the budget");
  return vc;
}

}  // namespace

bool needed(const Problem& p, const BlockSizes& bs, const GradOut& out) {
  if (p.device.type != DeviceType::kCPU || p.partial() || out.dw == nullptr || out.dw_dtype == DType::kF32 ||
      p.memory_budget == 0)
    return false;
  // The route without slices: the f32 accumulator of dw, the b×V slab (f32 + its bf16 copy), the rest.
  const double H = static_cast<double>(p.H), V = static_cast<double>(p.V);
  const double whole = 4.0 * H * V + slab_per_column(p, bs) * V + backend_reserve(p, bs);
  return whole > static_cast<double>(p.memory_budget);
}

int64_t columns(const Problem& p, const BlockSizes& bs) {
  const double H = static_cast<double>(p.H);
  const double fixed = 8.0 * static_cast<double>(p.B) * H + backend_reserve(p, bs);
  const double left = std::max(0.0, static_cast<double>(p.memory_budget) - fixed);
  const double per_column = (p.layout == WLayout::kHV ? 8.0 : 4.0) * H + slab_per_column(p, bs);
  const auto vc = static_cast<int64_t>(left / per_column) / kAlign * kAlign;
  return std::clamp<int64_t>(vc, kAlign, std::max<int64_t>(kAlign, p.V));
}

void backward(const Implementation& impl, const Problem& p, const BlockSizes& bs, const GradIn& g,
              const GradOut& out) {
  const int64_t vc = width(p, bs);
  const Buffers b(p, out, vc, g.lse == nullptr);
  GradIn gi = g;
  if (gi.lse == nullptr) {
    forward_lse(impl, p, bs, b);
    gi.lse = b.lse;
  }
  run_slices(impl, p, bs, gi, out, vc, b);
}

void forward_backward(const Implementation& impl, const Problem& p, const BlockSizes& bs, const GradIn& g,
                      const ForwardOut& fout, const GradOut& out) {
  const int64_t vc = width(p, bs);
  const Buffers b(p, out, vc, fout.lse == nullptr);
  ForwardOut f = fout;
  if (f.lse == nullptr) f.lse = b.lse;
  impl.forward(p, bs, f);
  GradIn gi = g;
  gi.lse = f.lse;
  run_slices(impl, p, bs, gi, out, vc, b);
}

}  // namespace tessera::linear_cross_entropy::vocab_slices
