// mla_decode: validation and dispatch. Every check runs before any output is touched.
#include <cmath>

#include "dispatch/arg_check.h"
#include "kernels/mla_decode/impl.h"
#include "tune/declared.h"
#include "tessera/error.h"

namespace tessera::mla_decode {
namespace {

using dispatch::num;
const dispatch::ArgCheck args{kKernelName, "q"};

void check_views(const Inputs& in, const Outputs& out) {
  const TensorView &q = in.q, &kv = in.kv_cache, &pt = in.page_table, &sl = in.cache_seqlens;
  args.need(q.ndim() == 4, "q must be [B, Sq, Hq, D], got " + q.str());
  args.need(kv.ndim() == 4 && kv.shape[2] == 1, "kv_cache must be [P, page_size, 1, D] (one latent head), got " + kv.str());
  args.need(is_float(q.dtype) && kv.dtype == q.dtype,
       "q and kv_cache must share one of f32, bf16, f16, got " + q.str() + " and " + kv.str());
  args.need(kv.shape[3] == q.shape[3], "kv_cache has D=" + num(kv.shape[3]) + " but q has D=" + num(q.shape[3]));
  args.need(q.shape[3] >= 1 && q.shape[3] <= 1024, "D must be in [1, 1024], got " + num(q.shape[3]));
  args.need(kv.shape[1] >= 1, "page_size must be >= 1, got " + kv.str());
  args.need(pt.ndim() == 2 && pt.dtype == DType::kI32 && pt.shape[0] == q.shape[0],
       "page_table must be int32 [B=" + num(q.shape[0]) + ", max_pages], got " + pt.str());
  args.need(sl.ndim() == 1 && sl.dtype == DType::kI32 && sl.shape[0] == q.shape[0],
       "cache_seqlens must be int32 [B=" + num(q.shape[0]) + "], got " + sl.str());
  args.need(pt.device.type == DeviceType::kCPU && sl.device.type == DeviceType::kCPU,
       "page_table and cache_seqlens must be in host memory (they are validated before anything runs)");
  args.need(out.lse.dtype == DType::kF32, "lse must be f32, got " + out.lse.str());
  args.need(out.o.dtype == DType::kF32 || out.o.dtype == q.dtype, "o must be f32 or q's dtype, got " + out.o.str());
  args.need(kv.device == q.device && out.o.device == q.device && out.lse.device == q.device,
       "q, kv_cache, o and lse must be on one device");
  for (const TensorView* t : {&q, &kv, &pt, &sl, &out.o, &out.lse})
    args.need(t->is_contiguous() && (t->numel() == 0 || t->data != nullptr), "every tensor must be contiguous with data, got " + t->str());
}

// Lengths and the page ids every visible key reads, batch by batch.
void check_pages(const Problem& p) {
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t L = p.seqlens[b];
    args.need(L >= 0 && L <= p.max_pages * p.page_size,
         "cache_seqlens[" + num(b) + "] = " + num(L) + " is outside [0, max_pages·page_size = " +
             num(p.max_pages * p.page_size) + "]");
    for (int64_t k = 0; k * p.page_size < L; ++k) {
      const int64_t id = p.page_table[b * p.max_pages + k];
      args.need(id >= 0 && id < p.P, "page_table[" + num(b) + ", " + num(k) + "] = " + num(id) +
                                    " is not a page of kv_cache (P=" + num(p.P) + ")");
    }
  }
}

Problem normalize(const Inputs& in, const Outputs& out, const Options& opt) {
  check_views(in, out);
  Problem p;
  p.B = in.q.shape[0], p.Sq = in.q.shape[1], p.Hq = in.q.shape[2], p.D = in.q.shape[3];
  p.P = in.kv_cache.shape[0], p.page_size = in.kv_cache.shape[1], p.max_pages = in.page_table.shape[1];
  args.need(opt.dv >= 1 && opt.dv <= p.D, "dv must be in [1, D=" + num(p.D) + "], got " + num(opt.dv));
  p.Dv = opt.dv;
  args.need(out.o.shape == Shape{p.B, p.Sq, p.Hq, p.Dv},
       "o must be " + shape_str({p.B, p.Sq, p.Hq, p.Dv}) + ", got " + out.o.str());
  args.need(out.lse.shape == Shape{p.B, p.Sq, p.Hq}, "lse must be " + shape_str({p.B, p.Sq, p.Hq}) + ", got " + out.lse.str());
  p.scale = opt.scale.value_or(1.0 / std::sqrt(static_cast<double>(p.D)));
  args.need(std::isfinite(p.scale) && p.scale > 0, "scale must be finite and > 0, got " + std::to_string(p.scale));
  args.need(!opt.block_sizes || opt.block_sizes->split_keys >= 0,
       "block_sizes.split_keys must be >= 0 (0: automatic), got " + num(opt.block_sizes ? opt.block_sizes->split_keys : 0));
  p.dtype = in.q.dtype, p.o_dtype = out.o.dtype, p.device = in.q.device;
  p.q = in.q.data, p.kv = in.kv_cache.data;
  p.page_table = static_cast<const int32_t*>(in.page_table.data);
  p.seqlens = static_cast<const int32_t*>(in.cache_seqlens.data);
  p.o = out.o.data, p.lse = static_cast<float*>(out.lse.data);
  p.causal = opt.causal;
  p.block_sizes = opt.block_sizes;
  p.num_threads = resolve_num_threads(opt.num_threads);
  p.stream = opt.stream;
  check_pages(p);
  return p;
}

}  // namespace

std::string BlockSizes::str() const { return "split_keys=" + std::to_string(split_keys); }

std::vector<ImplementationInfo> implementations() { return registry().infos(); }

std::string forward(const Inputs& in, const Outputs& out, const Options& opt) {
  const Problem p = normalize(in, out, opt);
  if (p.B * p.Sq * p.Hq == 0) return "(empty)";
  // The split length: the call's (block_sizes.split_keys > 0), else the tuned table's, else
  // autotune-on-miss (timing the implementation on this call), else the automatic rule.
  int64_t Lmax = 0;  // cache_seqlens are host memory on every device
  for (int64_t b = 0; b < p.B; ++b) Lmax = std::max<int64_t>(Lmax, p.seqlens[b]);
  tune::DeclaredCall c;
  c.dtype = p.dtype;
  c.dims = {p.B, p.Sq, p.Hq, Lmax};
  c.threads = p.num_threads;
  c.given = {{"split_keys", p.block_sizes ? p.block_sizes->split_keys : 0}};
  const auto at = [&p](const tune::Params& cand) {
    Problem q = p;
    q.block_sizes = BlockSizes{tune::param(cand, "split_keys").value_or(0)};
    return q;
  };
  return tune::dispatch_declared(
      registry(), tuning(), opt, p, c,
      {{"o", p.o, p.o_dtype, {p.B, p.Sq, p.Hq, p.Dv}}, {"lse", p.lse, DType::kF32, {p.B, p.Sq, p.Hq}}}, at,
      [](const Implementation& impl, const Problem& q) { impl.forward(q); });
}

}  // namespace tessera::mla_decode
