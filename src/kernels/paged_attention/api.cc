// paged_attention: validation and dispatch. Every check (shapes, dtypes, devices, and every page
// id, length and offset of every sequence) runs before any output is touched.

#include "dispatch/arg_check.h"
#include "dispatch/tensor_rules.h"
#include "dispatch/work.h"
#include "kernels/paged_attention/impl.h"
#include "tessera/error.h"

namespace tessera::paged_attention {
namespace {

using dispatch::num;
const dispatch::ArgCheck args{kKernelName, "q"};

// The tensors by their dims; cu_q_lens ([N + 1]) and the entries of the index tensors are checked
// by check_sequences.
const dispatch::TensorRules kRules{kKernelName,
                                   {{"q", "T,Hq,D", "float"},
                                    {"k_cache", "P,page_size,Hkv,D", "=q|f8e4m3"},
                                    {"v_cache", "P,page_size,Hkv,Dv", "=k_cache"},
                                    {"sinks", "Hq", "f32"},
                                    {"page_table", "N,max_pages", "i32", true},
                                    {"kv_lens", "N", "i32", true}}};

void check_shapes(const Inputs& in, const dispatch::Dims& d, Problem& p) {
  p.device = d.device();
  p.dtype = in.q.dtype;
  p.cache_dtype = in.k_cache.dtype;
  p.T = d["T"], p.Hq = d["Hq"], p.D = d["D"];
  p.P = d["P"], p.page_size = d["page_size"], p.Hkv = d["Hkv"], p.Dv = d["Dv"];
  p.N = d["N"], p.max_pages = d["max_pages"];
  if (p.Hq < 1 || p.Hkv < 1) args.fail("head counts must be >= 1, got Hq=" + num(p.Hq) + ", Hkv=" + num(p.Hkv));
  if (p.D < 1 || p.Dv < 1) args.fail("head dims must be >= 1, got D=" + num(p.D) + ", Dv=" + num(p.Dv));
  if (p.page_size < 1) args.fail("page_size (k_cache's axis 1) must be >= 1, got " + num(p.page_size));
  if (p.Hq % p.Hkv != 0)
    args.fail("Hq=" + num(p.Hq) + " is not a multiple of Hkv=" + num(p.Hkv) + " (query head h reads kv head h / (Hq/Hkv))");
  p.q = in.q.data, p.k = in.k_cache.data, p.v = in.v_cache.data;
  if (in.sinks) p.sinks = static_cast<const float*>(in.sinks->data);
}

// cu_q_lens [N+1], then every entry of it, kv_lens [N] and page_table [N, max_pages] a sequence reads.
void check_sequences(const Inputs& in, dispatch::Dims& d, Problem& p) {
  d.set("N+1", p.N + 1);
  d.check(in.cu_q_lens, {"cu_q_lens", "N+1", "i32", true});
  p.cu_q = static_cast<const int32_t*>(in.cu_q_lens.data);
  p.kv_lens = static_cast<const int32_t*>(in.kv_lens.data);
  p.page_table = static_cast<const int32_t*>(in.page_table.data);
  args.offsets(in.cu_q_lens, p.T, "cu_q_lens", "rows of q");
  args.pages({p.page_table, p.kv_lens, p.N, p.max_pages, p.page_size, p.P}, "page_table", "kv_lens");
  for (int64_t s = 0; s < p.N; ++s)
    if (p.q_len(s) > p.kv_lens[s])
      args.fail("sequence " + num(s) + ": q_len=" + num(p.q_len(s)) + " is above kv_lens[" + num(s) + "] = " +
                num(p.kv_lens[s]) + " (kv_len counts the new tokens)");
}

Problem normalize(const Inputs& in, const Outputs& out, const Options& opt) {
  dispatch::Dims d = bind_tensors(in, dispatch::BindMode::kFull);
  Problem p;
  check_shapes(in, d, p);
  check_sequences(in, d, p);
  // k_scale folds into the softmax scale (x = scale·q·(k_scale·k_cache)); v_scale goes with 1/l.
  p.scale = args.positive_f32(args.softmax_scale(opt.scale, p.D) * args.positive_f32(opt.k_scale, "k_scale"),
                              opt.k_scale == 1.0 ? "scale" : "scale * k_scale");
  p.v_scale = args.positive_f32(opt.v_scale, "v_scale");
  args.softcap(opt.softcap, "softcap");
  args.window(opt.window, "window");
  p.softcap = opt.softcap;
  p.causal = opt.causal;
  p.window = opt.window;
  p.num_threads = resolve_num_threads(opt.num_threads, dispatch::pair_products_flops(p.N, p.Hq, p.D + p.Dv, [&](int64_t s) {
    return static_cast<double>(p.q_len(s)) * static_cast<double>(p.kv_len(s)); }));
  p.stream = opt.stream;
  if (opt.check_finite) {
    args.finite(in.q, "q");
    // −inf is a sink that takes nothing.
    if (in.sinks) args.need(dispatch::all_finite(*in.sinks, /*allow_neg_inf=*/true), "sinks contain NaN or +Inf");
    // The caches are not scanned: their unused slots may hold anything (the contract).
  }
  d.check(out.o, "o", "T,Hq,Dv", "=q|f32");
  d.check(out.lse, "lse", "T,Hq", "f32");
  p.o = out.o.data;
  p.o_f32 = out.o.dtype == DType::kF32;
  p.lse = static_cast<float*>(out.lse.data);
  // An o inside a cache would be read back by later rows: refused, as o and lse over each other.
  args.apart({{"o", out.o}, {"lse", out.lse}}, {{"q", in.q}, {"k_cache", in.k_cache}, {"v_cache", in.v_cache},
                                              {"page_table", in.page_table}, {"kv_lens", in.kv_lens},
                                              {"cu_q_lens", in.cu_q_lens}, {"sinks", in.sinks.value_or(TensorView{})}});
  return p;
}

}  // namespace

dispatch::Dims bind_tensors(const Inputs& in, dispatch::BindMode mode) {
  for (const auto& [name, t] : {std::pair<const char*, const TensorView&>{"q", in.q}, {"k_cache", in.k_cache},
                                {"v_cache", in.v_cache}, {"page_table", in.page_table}, {"kv_lens", in.kv_lens},
                                {"cu_q_lens", in.cu_q_lens}})
    if (!dispatch::given(t)) args.fail(std::string(name) + " is required");  // a null pointer segfaulted
  return kRules.bind({{"q", in.q}, {"k_cache", in.k_cache}, {"v_cache", in.v_cache},
                      {"sinks", in.sinks.value_or(TensorView{})}, {"page_table", in.page_table}, {"kv_lens", in.kv_lens}},
                     mode);
}

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

std::string forward(const Inputs& in, const Outputs& out, const Options& opt) {
  const Problem p = normalize(in, out, opt);
  if (p.T == 0) return registry().empty_call(opt.implementation, p.device.type);
  return registry().dispatch_problem(opt.implementation, p, [&](const Implementation& impl) { impl.forward(p); });
}

Result compute(const Inputs& in, const Options& opt) {
  const dispatch::Dims d = bind_tensors(in, dispatch::BindMode::kShapesOnly);
  Result r;
  r.o = Tensor::empty(in.q.dtype, d.shape("T,Hq,Dv"), in.q.device);
  r.lse = Tensor::empty(DType::kF32, d.shape("T,Hq"), in.q.device);
  r.implementation = forward(in, {r.o.view(), r.lse.view()}, opt);
  return r;
}

}  // namespace tessera::paged_attention
