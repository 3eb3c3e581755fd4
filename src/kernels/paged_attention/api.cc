// paged_attention: validation and dispatch. Every check (shapes, dtypes, devices, and every page
// id, length and offset of every sequence) runs before any output is touched.
#include <cmath>
#include <limits>

#include "kernels/paged_attention/impl.h"
#include "tessera/error.h"

namespace tessera::paged_attention {
namespace {

const std::string kName = kKernelName;

[[noreturn]] void bad(const std::string& msg) { throw Error(ErrorCode::kInvalidArgument, kName + ": " + msg); }
std::string num(int64_t v) { return std::to_string(v); }

void require_plain(const TensorView& t, const Device& d, const char* what) {
  if (t.device != d) bad(std::string(what) + " is on " + t.device.str() + " but q is on " + d.str());
  if (!t.is_contiguous()) bad(std::string(what) + " must be contiguous (row-major), got strides " + shape_str(t.strides));
  if (t.data == nullptr && t.numel() > 0) bad(std::string(what) + " has no data (null pointer)");
}
void require_index(const TensorView& t, const Shape& shape, const char* what) {
  if (t.dtype != DType::kI32) bad(std::string(what) + " must be i32, got " + dtype_name(t.dtype));
  if (t.shape != shape) bad(std::string(what) + " must have shape " + shape_str(shape) + ", got " + shape_str(t.shape));
  if (t.device.type != DeviceType::kCPU)
    bad(std::string(what) + " must be in host memory (also for device inputs), got " + t.device.str());
  require_plain(t, t.device, what);
}

// True when no element is NaN or ±Inf (−inf allowed with allow_neg_inf: a sink that takes nothing).
bool all_finite(const TensorView& t, bool allow_neg_inf = false) {
  if (t.device.type != DeviceType::kCPU) return true;  // device data is not inspected here
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float x = load_as_f32(t.data, t.dtype, i);
    if (!std::isfinite(x) && !(allow_neg_inf && x == -std::numeric_limits<float>::infinity())) return false;
  }
  return true;
}

void check_shapes(const Inputs& in, Problem& p) {
  const TensorView &q = in.q, &k = in.k_cache, &v = in.v_cache;
  if (!is_float(q.dtype)) bad(std::string("q must be f32, bf16 or f16, got ") + dtype_name(q.dtype));
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    bad(std::string("q, k_cache and v_cache must share one dtype, got q ") + dtype_name(q.dtype) + ", k_cache " +
        dtype_name(k.dtype) + ", v_cache " + dtype_name(v.dtype));
  if (q.ndim() != 3) bad("q must be [T, Hq, D], got " + shape_str(q.shape));
  if (k.ndim() != 4) bad("k_cache must be [P, page_size, Hkv, D], got " + shape_str(k.shape));
  if (v.ndim() != 4) bad("v_cache must be [P, page_size, Hkv, Dv], got " + shape_str(v.shape));
  p.device = q.device;
  p.dtype = q.dtype;
  require_plain(q, p.device, "q");
  require_plain(k, p.device, "k_cache");
  require_plain(v, p.device, "v_cache");
  p.T = q.shape[0], p.Hq = q.shape[1], p.D = q.shape[2];
  p.P = k.shape[0], p.page_size = k.shape[1], p.Hkv = k.shape[2], p.Dv = v.shape[3];
  if (p.Hq < 1 || p.Hkv < 1) bad("head counts must be >= 1, got Hq=" + num(p.Hq) + ", Hkv=" + num(p.Hkv));
  if (p.D < 1 || p.Dv < 1) bad("head dims must be >= 1, got D=" + num(p.D) + ", Dv=" + num(p.Dv));
  if (p.page_size < 1) bad("page_size (k_cache's axis 1) must be >= 1, got " + num(p.page_size));
  if (k.shape[3] != p.D) bad("k_cache's head dim " + num(k.shape[3]) + " differs from q's D=" + num(p.D));
  if (p.Hq % p.Hkv != 0)
    bad("Hq=" + num(p.Hq) + " is not a multiple of Hkv=" + num(p.Hkv) + " (query head h reads kv head h / (Hq/Hkv))");
  if (v.shape[0] != p.P || v.shape[1] != p.page_size || v.shape[2] != p.Hkv)
    bad("v_cache " + shape_str(v.shape) + " must match k_cache " + shape_str(k.shape) + " in all but the last axis");
  p.q = q.data, p.k = k.data, p.v = v.data;
}

// page_table [N, max_pages], kv_lens [N], cu_q_lens [N+1]: every entry a sequence reads.
void check_sequences(const Inputs& in, Problem& p) {
  const TensorView& cu = in.cu_q_lens;
  if (cu.ndim() != 1 || cu.shape[0] < 1) bad("cu_q_lens must be 1-D [N+1], got " + shape_str(cu.shape));
  p.N = cu.shape[0] - 1;
  require_index(cu, {p.N + 1}, "cu_q_lens");
  require_index(in.kv_lens, {p.N}, "kv_lens");
  if (in.page_table.ndim() != 2) bad("page_table must be [N, max_pages], got " + shape_str(in.page_table.shape));
  p.max_pages = in.page_table.shape[1];
  require_index(in.page_table, {p.N, p.max_pages}, "page_table");
  p.cu_q = static_cast<const int32_t*>(cu.data);
  p.kv_lens = static_cast<const int32_t*>(in.kv_lens.data);
  p.page_table = static_cast<const int32_t*>(in.page_table.data);
  if (p.cu_q[0] != 0) bad("sequence 0: cu_q_lens[0] must be 0, got " + num(p.cu_q[0]));
  for (int64_t s = 0; s < p.N; ++s) {
    const std::string seq = "sequence " + num(s) + ": ";
    if (p.cu_q[s + 1] < p.cu_q[s])
      bad(seq + "cu_q_lens must be non-decreasing, got cu_q_lens[" + num(s) + "]=" + num(p.cu_q[s]) + " then cu_q_lens[" +
          num(s + 1) + "]=" + num(p.cu_q[s + 1]));
    const int64_t kv = p.kv_lens[s], ql = p.q_len(s);
    if (kv < 0) bad(seq + "kv_len must be >= 0, got " + num(kv));
    if (kv > p.max_pages * p.page_size)
      bad(seq + "kv_len=" + num(kv) + " is above the " + num(p.max_pages) + " pages x " + num(p.page_size) +
          " slots the page table gives");
    if (ql > kv) bad(seq + "q_len=" + num(ql) + " is above kv_len=" + num(kv) + " (kv_len counts the new tokens)");
    const int64_t pages = (kv + p.page_size - 1) / p.page_size;
    for (int64_t i = 0; i < pages; ++i) {
      const int64_t id = p.page_table[s * p.max_pages + i];
      if (id < 0 || id >= p.P)
        bad(seq + "page_table[" + num(s) + ", " + num(i) + "]=" + num(id) + " is out of range [0, P=" + num(p.P) + ")");
    }
  }
  if (p.cu_q[p.N] != p.T)
    bad((p.N > 0 ? "sequence " + num(p.N - 1) + ": " : std::string("no sequences (N=0): ")) + "cu_q_lens[N=" +
        num(p.N) + "]=" + num(p.cu_q[p.N]) + " must equal the rows of q (T=" + num(p.T) + ")");
}

Problem normalize(const Inputs& in, const Options& opt) {
  Problem p;
  check_shapes(in, p);
  check_sequences(in, p);
  if (in.sinks) {
    const TensorView& s = *in.sinks;
    if (s.dtype != DType::kF32) bad(std::string("sinks must be f32, got ") + dtype_name(s.dtype));
    if (s.shape != Shape{p.Hq}) bad("sinks must be [Hq=" + num(p.Hq) + "], got " + shape_str(s.shape));
    require_plain(s, p.device, "sinks");
    p.sinks = static_cast<const float*>(s.data);
  }
  // The backends compute in f32: a finite double past FLT_MAX would become inf there.
  constexpr double kMax = std::numeric_limits<float>::max();
  if (opt.scale && !(std::isfinite(*opt.scale) && *opt.scale > 0.0 && *opt.scale <= kMax))
    bad("scale must be finite in f32 and > 0, got " + std::to_string(*opt.scale));
  if (!(opt.softcap >= 0.0) || !(opt.softcap <= kMax))
    bad("softcap must be finite in f32 and >= 0 (0 disables it), got " + std::to_string(opt.softcap));
  if (opt.window < -1) bad("window must be >= 0 or -1 (unbounded), got " + num(opt.window));
  p.scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(p.D));
  p.softcap = opt.softcap;
  p.causal = opt.causal;
  p.window = opt.window;
  p.num_threads = resolve_num_threads(opt.num_threads);
  p.stream = opt.stream;
  if (opt.check_finite) {
    if (!all_finite(in.q)) bad("q contains NaN or Inf");
    if (in.sinks && !all_finite(*in.sinks, /*allow_neg_inf=*/true)) bad("sinks contain NaN or +Inf");
    // The caches are not scanned: their unused slots may hold anything (the contract).
  }
  return p;
}

void check_outputs(const Outputs& out, Problem& p) {
  if (out.o.dtype != DType::kF32 && out.o.dtype != p.dtype)
    bad(std::string("o must be f32 or q's dtype ") + dtype_name(p.dtype) + ", got " + dtype_name(out.o.dtype));
  const Shape os{p.T, p.Hq, p.Dv}, ls{p.T, p.Hq};
  if (out.o.shape != os) bad("o must have shape " + shape_str(os) + ", got " + shape_str(out.o.shape));
  if (out.lse.dtype != DType::kF32) bad(std::string("lse must be f32, got ") + dtype_name(out.lse.dtype));
  if (out.lse.shape != ls) bad("lse must have shape " + shape_str(ls) + ", got " + shape_str(out.lse.shape));
  require_plain(out.o, p.device, "o");
  require_plain(out.lse, p.device, "lse");
  p.o = out.o.data;
  p.o_f32 = out.o.dtype == DType::kF32;
  p.lse = static_cast<float*>(out.lse.data);
}

}  // namespace

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

std::string forward(const Inputs& in, const Outputs& out, const Options& opt) {
  Problem p = normalize(in, opt);
  check_outputs(out, p);
  if (p.T == 0) return "(empty)";
  return registry().dispatch(
      opt.implementation, p.device.type, [&](const Implementation& impl) { return impl.supports(p); },
      [&](const Implementation& impl) { impl.forward(p); });
}

Result compute(const Inputs& in, const Options& opt) {
  check(in.q.ndim() == 3 && in.v_cache.ndim() == 4, ErrorCode::kInvalidArgument,
        kName + ": q must be [T, Hq, D] and v_cache [P, page_size, Hkv, Dv], got " + shape_str(in.q.shape) + " and " +
            shape_str(in.v_cache.shape));
  Result r;
  r.o = Tensor::empty(in.q.dtype, {in.q.shape[0], in.q.shape[1], in.v_cache.shape[3]}, in.q.device);
  r.lse = Tensor::empty(DType::kF32, {in.q.shape[0], in.q.shape[1]}, in.q.device);
  r.implementation = forward(in, {r.o.view(), r.lse.view()}, opt);
  return r;
}

}  // namespace tessera::paged_attention
