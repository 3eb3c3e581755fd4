// mla_decode: validation and dispatch. Every check runs before any output is touched.

#include "dispatch/arg_check.h"
#include "dispatch/work.h"
#include "dispatch/declared_tensors.h"
#include "kernels/mla_decode/impl.h"
#include "tune/declared.h"
#include "tessera/error.h"

namespace tessera::mla_decode {

// Every input declared once (dispatch/declared_tensors.h: the CLI's flags, the Python keywords and
// the help derive from it too); cache_seqlens and the page ids it makes read are checked by
// ArgCheck::pages.
const dispatch::DeclaredTensors<Inputs>& tensors() {
  static const dispatch::DeclaredTensors<Inputs> t{
      kKernelName,
      {{&Inputs::q, {"q", "B,Sq,Hq,D", "float"}, "queries"},
       {&Inputs::kv_cache, {"kv_cache", "P,page_size,1,D", "=q|f8e4m3"},
        "paged latent cache (q's dtype or f8e4m3); values = first dv dims"},
       {&Inputs::page_table, {"page_table", "B,max_pages", "i32", true}, "pages of each sequence"},
       {&Inputs::cache_seqlens, {"cache_seqlens", "B", "i32", true}, "keys in the cache per sequence"}},
      {}};
  return t;
}
namespace {

using dispatch::num;
const dispatch::ArgCheck args{kKernelName, "q"};

Problem normalize(const Inputs& in, const Outputs& out, const Options& opt) {
  dispatch::Dims d = bind_tensors(in, opt.dv, dispatch::BindMode::kFull);
  args.need(d["page_size"] >= 1, "page_size must be >= 1, got " + in.kv_cache.str());
  d.check(out.o, "o", "B,Sq,Hq,Dv", "=q|f32");
  d.check(out.lse, "lse", "B,Sq,Hq", "f32");
  Problem p;
  p.B = d["B"], p.Sq = d["Sq"], p.Hq = d["Hq"], p.D = d["D"], p.Dv = d["Dv"];
  p.P = d["P"], p.page_size = d["page_size"], p.max_pages = d["max_pages"];
  // kv_scale folds into the softmax scale (s = scale·q·(kv_scale·kv_cache)) and multiplies o with 1/l.
  p.v_scale = args.positive_f32(opt.kv_scale, "kv_scale");
  p.scale = args.positive_f32(args.softmax_scale(opt.scale, p.D) * p.v_scale,
                              opt.kv_scale == 1.0 ? "scale" : "scale * kv_scale");
  if (opt.check_finite) args.finite(in.q, "q");  // host data; the cache's unused slots may hold anything
  args.need(!opt.block_sizes || opt.block_sizes->split_keys >= 0,
       "block_sizes.split_keys must be >= 0 (0: automatic), got " + num(opt.block_sizes ? opt.block_sizes->split_keys : 0));
  p.dtype = in.q.dtype, p.cache_dtype = in.kv_cache.dtype, p.o_dtype = out.o.dtype, p.device = d.device();
  p.q = in.q.data, p.kv = in.kv_cache.data;
  p.page_table = static_cast<const int32_t*>(in.page_table.data);
  p.seqlens = static_cast<const int32_t*>(in.cache_seqlens.data);
  p.o = out.o.data, p.lse = static_cast<float*>(out.lse.data);
  p.causal = opt.causal;
  p.block_sizes = opt.block_sizes;
  args.pages({p.page_table, p.seqlens, p.B, p.max_pages, p.page_size, p.P}, "page_table", "cache_seqlens");
  p.num_threads = resolve_num_threads(opt.num_threads, dispatch::pair_products_flops(p.B, p.Sq * p.Hq, p.D + p.Dv, [&](int64_t b) {
    return static_cast<double>(p.seqlens[b]); }));  // after args.pages: valid lengths
  p.stream = opt.stream;
  // An o inside the cache would be read back by later rows (and an autotune sweep writes the
  // outputs before the call it keeps): refused, as lse over o.
  tensors().apart(in, {{"o", out.o}, {"lse", out.lse}});
  return p;
}

}  // namespace

dispatch::Dims bind_tensors(const Inputs& in, int64_t dv, dispatch::BindMode mode) {
  dispatch::Dims d = tensors().bind(in, mode);
  args.need(d["D"] >= 1 && d["D"] <= 1024, "D must be in [1, 1024], got " + num(d["D"]));
  args.need(dv >= 1 && dv <= d["D"], "dv must be in [1, D=" + num(d["D"]) + "], got " + num(dv));
  d.set("Dv", dv);
  return d;
}

std::string BlockSizes::str() const { return "split_keys=" + std::to_string(split_keys); }

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

std::string forward(const Inputs& in, const Outputs& out, const Options& opt) {
  const Problem p = normalize(in, out, opt);
  if (p.B * p.Sq * p.Hq == 0) return registry().empty_call(opt.implementation, p.device.type);
  // The split length: the call's (block_sizes.split_keys > 0), else the tuned table's, else
  // autotune-on-miss (timing the implementation on this call), else the automatic rule.
  int64_t Lmax = 0;  // cache_seqlens are host memory on every device
  for (int64_t b = 0; b < p.B; ++b) Lmax = std::max<int64_t>(Lmax, p.seqlens[b]);
  const tune::DeclaredCall c{.dtype = p.dtype,
                             .dims = {p.B, p.Sq, p.Hq, Lmax},
                             .threads = p.num_threads,
                             .given = {{"split_keys", p.block_sizes ? p.block_sizes->split_keys : 0}},
                             // an f8e4m3 cache times otherwise: its own autotune entries
                             .variant = p.cache_dtype == DType::kF8E4M3 ? "kv_cache=f8e4m3" : ""};
  const auto at = [&p](const tune::Params& cand) {
    Problem q = p;
    q.block_sizes = BlockSizes{tune::param(cand, "split_keys").value_or(0)};
    return q;
  };
  return tune::dispatch_declared(
      registry(), tuning(), opt, p, c,
      {tune::buffer_of("o", out.o), tune::buffer_of("lse", out.lse)}, at,
      [](const Implementation& impl, const Problem& q) { impl.forward(q); });
}

}  // namespace tessera::mla_decode
