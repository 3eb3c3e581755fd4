// paged_attention: validation and dispatch. Every check (shapes, dtypes, devices, and every page
// id, length and offset of every sequence) runs before any output is touched.
#include <cmath>
#include <limits>

#include "dispatch/arg_check.h"
#include "kernels/paged_attention/impl.h"
#include "tessera/error.h"

namespace tessera::paged_attention {
namespace {

using dispatch::num;
const dispatch::ArgCheck args{kKernelName, "q"};

// An index tensor: i32 of this shape, in host memory.
void require_index(const TensorView& t, const Shape& shape, const char* what) {
  args.dtype(t, DType::kI32, what);
  args.shape(t, shape, what);
  args.host(t, what);
}

void check_shapes(const Inputs& in, Problem& p) {
  const TensorView &q = in.q, &k = in.k_cache, &v = in.v_cache;
  args.floating(q, "q");
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    args.fail(std::string("q, k_cache and v_cache must share one dtype, got q ") + dtype_name(q.dtype) + ", k_cache " +
        dtype_name(k.dtype) + ", v_cache " + dtype_name(v.dtype));
  if (q.ndim() != 3) args.fail("q must be [T, Hq, D], got " + shape_str(q.shape));
  if (k.ndim() != 4) args.fail("k_cache must be [P, page_size, Hkv, D], got " + shape_str(k.shape));
  if (v.ndim() != 4) args.fail("v_cache must be [P, page_size, Hkv, Dv], got " + shape_str(v.shape));
  p.device = q.device;
  p.dtype = q.dtype;
  args.plain(q, p.device, "q");
  args.plain(k, p.device, "k_cache");
  args.plain(v, p.device, "v_cache");
  p.T = q.shape[0], p.Hq = q.shape[1], p.D = q.shape[2];
  p.P = k.shape[0], p.page_size = k.shape[1], p.Hkv = k.shape[2], p.Dv = v.shape[3];
  if (p.Hq < 1 || p.Hkv < 1) args.fail("head counts must be >= 1, got Hq=" + num(p.Hq) + ", Hkv=" + num(p.Hkv));
  if (p.D < 1 || p.Dv < 1) args.fail("head dims must be >= 1, got D=" + num(p.D) + ", Dv=" + num(p.Dv));
  if (p.page_size < 1) args.fail("page_size (k_cache's axis 1) must be >= 1, got " + num(p.page_size));
  if (k.shape[3] != p.D) args.fail("k_cache's head dim " + num(k.shape[3]) + " differs from q's D=" + num(p.D));
  if (p.Hq % p.Hkv != 0)
    args.fail("Hq=" + num(p.Hq) + " is not a multiple of Hkv=" + num(p.Hkv) + " (query head h reads kv head h / (Hq/Hkv))");
  if (v.shape[0] != p.P || v.shape[1] != p.page_size || v.shape[2] != p.Hkv)
    args.fail("v_cache " + shape_str(v.shape) + " must match k_cache " + shape_str(k.shape) + " in all but the last axis");
  p.q = q.data, p.k = k.data, p.v = v.data;
}

// page_table [N, max_pages], kv_lens [N], cu_q_lens [N+1]: every entry a sequence reads.
void check_sequences(const Inputs& in, Problem& p) {
  const TensorView& cu = in.cu_q_lens;
  if (cu.ndim() != 1 || cu.shape[0] < 1) args.fail("cu_q_lens must be 1-D [N+1], got " + shape_str(cu.shape));
  p.N = cu.shape[0] - 1;
  require_index(cu, {p.N + 1}, "cu_q_lens");
  require_index(in.kv_lens, {p.N}, "kv_lens");
  if (in.page_table.ndim() != 2) args.fail("page_table must be [N, max_pages], got " + shape_str(in.page_table.shape));
  p.max_pages = in.page_table.shape[1];
  require_index(in.page_table, {p.N, p.max_pages}, "page_table");
  p.cu_q = static_cast<const int32_t*>(cu.data);
  p.kv_lens = static_cast<const int32_t*>(in.kv_lens.data);
  p.page_table = static_cast<const int32_t*>(in.page_table.data);
  if (p.cu_q[0] != 0) args.fail("sequence 0: cu_q_lens[0] must be 0, got " + num(p.cu_q[0]));
  for (int64_t s = 0; s < p.N; ++s) {
    const std::string seq = "sequence " + num(s) + ": ";
    if (p.cu_q[s + 1] < p.cu_q[s])
      args.fail(seq + "cu_q_lens must be non-decreasing, got cu_q_lens[" + num(s) + "]=" + num(p.cu_q[s]) + " then cu_q_lens[" +
          num(s + 1) + "]=" + num(p.cu_q[s + 1]));
    const int64_t kv = p.kv_lens[s], ql = p.q_len(s);
    if (kv < 0) args.fail(seq + "kv_len must be >= 0, got " + num(kv));
    if (kv > p.max_pages * p.page_size)
      args.fail(seq + "kv_len=" + num(kv) + " is above the " + num(p.max_pages) + " pages x " + num(p.page_size) +
          " slots the page table gives");
    if (ql > kv) args.fail(seq + "q_len=" + num(ql) + " is above kv_len=" + num(kv) + " (kv_len counts the new tokens)");
    const int64_t pages = (kv + p.page_size - 1) / p.page_size;
    for (int64_t i = 0; i < pages; ++i) {
      const int64_t id = p.page_table[s * p.max_pages + i];
      if (id < 0 || id >= p.P)
        args.fail(seq + "page_table[" + num(s) + ", " + num(i) + "]=" + num(id) + " is out of range [0, P=" + num(p.P) + ")");
    }
  }
  if (p.cu_q[p.N] != p.T)
    args.fail((p.N > 0 ? "sequence " + num(p.N - 1) + ": " : std::string("no sequences (N=0): ")) + "cu_q_lens[N=" +
        num(p.N) + "]=" + num(p.cu_q[p.N]) + " must equal the rows of q (T=" + num(p.T) + ")");
}

Problem normalize(const Inputs& in, const Options& opt) {
  Problem p;
  check_shapes(in, p);
  check_sequences(in, p);
  if (in.sinks) {
    const TensorView& s = *in.sinks;
    if (s.dtype != DType::kF32) args.fail(std::string("sinks must be f32, got ") + dtype_name(s.dtype));
    if (s.shape != Shape{p.Hq}) args.fail("sinks must be [Hq=" + num(p.Hq) + "], got " + shape_str(s.shape));
    args.plain(s, p.device, "sinks");
    p.sinks = static_cast<const float*>(s.data);
  }
  // The backends compute in f32: a finite double past FLT_MAX would become inf there.
  constexpr double kMax = std::numeric_limits<float>::max();
  if (opt.scale && !(std::isfinite(*opt.scale) && *opt.scale > 0.0 && *opt.scale <= kMax))
    args.fail("scale must be finite in f32 and > 0, got " + std::to_string(*opt.scale));
  if (!(opt.softcap >= 0.0) || !(opt.softcap <= kMax))
    args.fail("softcap must be finite in f32 and >= 0 (0 disables it), got " + std::to_string(opt.softcap));
  if (opt.window < -1) args.fail("window must be >= 0 or -1 (unbounded), got " + num(opt.window));
  p.scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(p.D));
  p.softcap = opt.softcap;
  p.causal = opt.causal;
  p.window = opt.window;
  p.num_threads = resolve_num_threads(opt.num_threads);
  p.stream = opt.stream;
  if (opt.check_finite) {
    args.finite(in.q, "q");
    // −inf is a sink that takes nothing.
    if (in.sinks) args.need(dispatch::all_finite(*in.sinks, /*allow_neg_inf=*/true), "sinks contain NaN or +Inf");
    // The caches are not scanned: their unused slots may hold anything (the contract).
  }
  return p;
}

void check_outputs(const Outputs& out, Problem& p) {
  args.output(out.o, p.dtype, {p.T, p.Hq, p.Dv}, p.device, "o");
  args.output(out.lse, DType::kF32, {p.T, p.Hq}, p.device, "lse");
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
  return registry().dispatch_problem(opt.implementation, p, [&](const Implementation& impl) { impl.forward(p); });
}

Result compute(const Inputs& in, const Options& opt) {
  check(in.q.ndim() == 3 && in.v_cache.ndim() == 4, ErrorCode::kInvalidArgument,
        std::string(kKernelName) + ": q must be [T, Hq, D] and v_cache [P, page_size, Hkv, Dv], got " + shape_str(in.q.shape) + " and " +
            shape_str(in.v_cache.shape));
  Result r;
  r.o = Tensor::empty(in.q.dtype, {in.q.shape[0], in.q.shape[1], in.v_cache.shape[3]}, in.q.device);
  r.lse = Tensor::empty(DType::kF32, {in.q.shape[0], in.q.shape[1]}, in.q.device);
  r.implementation = forward(in, {r.o.view(), r.lse.view()}, opt);
  return r;
}

}  // namespace tessera::paged_attention
