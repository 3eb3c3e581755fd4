// linear_cross_entropy: gradients of a 16-bit dw in vocabulary slices (cpu_vocab_slices.h).
#include "kernels/linear_cross_entropy/cpu_vocab_slices.h"

#include <algorithm>
#include <cstring>

#include "core/memory.h"
#include "core/trace.h"
#include "primitives/cpu_convert.h"
#include "tessera/error.h"

namespace tessera::linear_cross_entropy::vocab_slices {
namespace {

constexpr int64_t kAlign = 64;  // slice widths: whole cache lines of a 16-bit row, packer pairs
// Left for the backend's per-thread packed chunks and x panels (~1 MiB at 2 threads, b = 256, h = 512).
constexpr size_t kReserve = size_t{2} << 20;

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
  if (p.class_weights) q.class_weights = p.class_weights + c0;
  return q;
}

// The forward's lse when the caller gave none (loss and lse into scratch).
const float* lse_of(const Implementation& impl, const Problem& p, const BlockSizes& bs, memory::HostBuffer& lse_buf,
                    memory::HostBuffer& loss_buf) {
  Problem f = p;
  f.want_argmax = false;
  ForwardOut o;
  o.lse = alloc<float>(lse_buf, p.B);
  o.loss = alloc<float>(loss_buf, p.B);
  impl.forward(f, bs, o);
  return o.lse;
}

}  // namespace

bool needed(const Problem& p, const GradOut& out) {
  return p.device.type == DeviceType::kCPU && !p.partial() && out.dw != nullptr && out.dw_dtype != DType::kF32 &&
         p.memory_budget > 0 && 4.0 * static_cast<double>(p.H) * static_cast<double>(p.V) > static_cast<double>(p.memory_budget);
}

int64_t columns(const Problem& p, int64_t b) {
  const double B = static_cast<double>(p.B), H = static_cast<double>(p.H), bb = static_cast<double>(std::min(b, p.B));
  const double fixed = 8.0 * B * H + static_cast<double>(kReserve);
  const double left = std::max(0.0, static_cast<double>(p.memory_budget) - fixed);
  const double per_column = (p.layout == WLayout::kHV ? 8.0 : 4.0) * H + 6.0 * bb;
  const auto vc = static_cast<int64_t>(left / per_column) / kAlign * kAlign;
  return std::clamp<int64_t>(vc, kAlign, std::max<int64_t>(kAlign, p.V));
}

void backward(const Implementation& impl, const Problem& p, const BlockSizes& bs, const GradIn& g,
              const GradOut& out) {
  TESSERA_TRACE_SCOPE("lce.vocab_slices");
  memory::HostBuffer lse_buf, loss_buf, label_buf, sum_buf, share_buf, w_buf, dw_buf;
  GradIn gi = g;
  if (gi.lse == nullptr) gi.lse = lse_of(impl, p, bs, lse_buf, loss_buf);
  const int64_t vc = std::min(columns(p, bs.b), p.V), BH = p.B * p.H;
  const bool hv = p.layout == WLayout::kHV;
  int64_t* labels = alloc<int64_t>(label_buf, p.B);
  float* sum = out.dx_dtype == DType::kF32 ? static_cast<float*>(out.dx) : alloc<float>(sum_buf, BH);
  float* share = p.V > vc ? alloc<float>(share_buf, BH) : nullptr;
  uint16_t* w_slice = hv ? alloc<uint16_t>(w_buf, p.H * vc) : nullptr;
  uint16_t* dw_slice = hv ? alloc<uint16_t>(dw_buf, p.H * vc) : nullptr;
  for (int64_t c0 = 0; c0 < p.V; c0 += vc) {
    const int64_t n = std::min(vc, p.V - c0);
    if (hv) gather_columns(p.w, p.H, p.V, c0, n, w_slice);
    const Problem q = slice_of(p, c0, n, w_slice, labels);
    GradOut o = out;
    o.dx = c0 == 0 ? sum : share;  // the first slice's share is the start of the sum
    o.dx_dtype = DType::kF32;
    o.dw = hv ? static_cast<void*>(dw_slice) : at(out.dw, c0 * p.H, out.dw_dtype);
    if (out.dbias) o.dbias = at(out.dbias, c0, out.dbias_dtype);
    impl.backward(q, bs, gi, o);
    if (c0 > 0)
      for (int64_t i = 0; i < BH; ++i) sum[i] += share[i];
    if (hv) scatter_columns(dw_slice, p.H, p.V, c0, n, out.dw);
  }
  if (out.dx_dtype == DType::kBF16) cpu_convert::f32_to_bf16(sum, static_cast<uint16_t*>(out.dx), BH);
  if (out.dx_dtype == DType::kF16) cpu_convert::f32_to_f16(sum, static_cast<uint16_t*>(out.dx), BH);
}

void forward_backward(const Implementation& impl, const Problem& p, const BlockSizes& bs, const GradIn& g,
                      const ForwardOut& fout, const GradOut& out) {
  memory::HostBuffer lse_buf;
  ForwardOut f = fout;
  if (f.lse == nullptr) f.lse = alloc<float>(lse_buf, p.B);
  impl.forward(p, bs, f);
  GradIn gi = g;
  gi.lse = f.lse;
  backward(impl, p, bs, gi, out);
}

}  // namespace tessera::linear_cross_entropy::vocab_slices
