// mla_decode: the benchmark problem. Dims B (sequences), Sq (queries per sequence), Hq (query
// heads), T (cached keys per sequence); options d, dv, page_size, causal. Pages are shuffled.
// Baseline: gather + attention (baseline.cc).
#include <functional>

#include "core/random.h"
#include "kernels/bench_glue.h"
#include "kernels/mla_decode/impl.h"
#include "kernels/registry.h"
#include "tessera/error.h"

namespace tessera::mla_decode {

const kernels::KernelSpec& spec();
std::function<void()> gather_attention_baseline(const Tensor& q, const Tensor& kv, const Tensor& page_table, int64_t T,
                                                int64_t Dv, bool causal, int threads);  // baseline.cc

namespace {

using K = harness::OptionSpec::Kind;

struct Settings {
  int64_t B = 0, Sq = 0, Hq = 0, T = 0, D = 576, Dv = 512, page_size = 64;
  bool causal = false;
  DType dtype = DType::kBF16;
  bool f8_cache = false;  // the cache in f8e4m3 (raw values up to 64, kv_scale 1/64)
  DType cache_dtype() const { return f8_cache ? DType::kF8E4M3 : dtype; }
  int64_t pages() const { return (T + page_size - 1) / page_size; }
};

class MlaBench final : public kernels::CallBenchProblem {
 public:
  MlaBench(Settings s, uint64_t seed, bool with_data) : CallBenchProblem(spec), s_(s) {
    if (!with_data) return;
    const int64_t np = s_.pages(), P = s_.B * np;
    q_ = random_uniform(s_.dtype, {s_.B, s_.Sq, s_.Hq, s_.D}, 1.0f, seed * 5 + 1);
    kv_ = random_uniform(s_.cache_dtype(), {P, s_.page_size, 1, s_.D}, s_.f8_cache ? 64.0f : 1.0f, seed * 5 + 2);
    pt_ = kernels::shuffled_page_table(s_.B, np, seed * 5 + 3);
    L_ = Tensor::empty(DType::kI32, {s_.B});
    for (int64_t b = 0; b < s_.B; ++b) L_.data_as<int32_t>()[b] = static_cast<int32_t>(s_.T);
  }

  harness::Row describe() const override {
    harness::Row r = harness::Row::object();
    r["D"] = s_.D, r["Dv"] = s_.Dv, r["page_size"] = s_.page_size, r["causal"] = s_.causal;
    r["cache_dtype"] = dtype_name(s_.cache_dtype());
    return r;
  }

  // Visible (query, key) pairs over all heads and sequences.
  double pairs() const {
    double keys = 0;
    for (int64_t i = 0; i < s_.Sq; ++i) keys += s_.causal ? std::max<int64_t>(0, s_.T - s_.Sq + i + 1) : s_.T;
    return keys * s_.B * s_.Hq;
  }
  double work() const override { return pairs() * (s_.D + s_.Dv); }

  harness::Cost cost(Pass, const std::string& implementation) const override {
    harness::Cost c;
    const double esz = static_cast<double>(dtype_size(s_.dtype));
    const double cache = double(s_.B) * s_.T * s_.D * static_cast<double>(dtype_size(s_.cache_dtype()));
    const double q = double(s_.B) * s_.Sq * s_.Hq * s_.D * esz;
    const double out = double(s_.B) * s_.Sq * s_.Hq * (s_.Dv + 1) * 4.0;
    c.add({"scores: q·cᵀ over the latent head", 2.0 * pairs() * s_.D, cache + q, pairs(), false});
    c.add({"values: p·c[:dv]", 2.0 * pairs() * s_.Dv, out, 0.0, false});
    if (implementation == "gather+attention")  // the baseline also writes and reads k and v
      c.add({"gather k, v", 0.0, double(s_.B) * s_.T * (s_.D + s_.Dv) * esz * 2.0, 0.0, false});
    c.assumptions.push_back("useful FLOPs 2·pairs·(D + Dv); bytes: the cache entries read once, q, o and lse (f32)");
    return c;
  }

  CallData call_data() const override {
    CallData c{{{"q", q_}, {"kv_cache", kv_}, {"page_table", pt_}, {"cache_seqlens", L_}}, {}};
    c.options.set("dv", std::to_string(s_.Dv));
    c.options.set("causal", s_.causal ? "true" : "false");
    if (s_.f8_cache) c.options.set("kv_scale", "0.015625");
    return c;
  }

  // None for an f8e4m3 cache (attention takes no f8e4m3).
  std::vector<harness::BaselineCall> baselines(const std::vector<Pass>& passes, int threads) override {
    if (s_.f8_cache) return {};
    return kernels::forward_baseline(
        passes, {.name = "gather+attention",
                 .description =
                     "gather pages into contiguous k [B, T, 1, D] and v [B, T, 1, Dv], then attention (Hkv = 1)",
                 .roofline_dtype = dtype_name(s_.dtype),
                 .cost = cost(Pass::kForward, "gather+attention"),
                 .run = gather_attention_baseline(q_, kv_, pt_, s_.T, s_.Dv, s_.causal, threads)});
  }

 private:
  Settings s_;
  Tensor q_, kv_, pt_, L_;
};

std::unique_ptr<harness::BenchProblem> make(const harness::GridShape& shape, DType dtype, const harness::OptionValues& o,
                                            uint64_t seed, bool with_data) {
  Settings s;
  s.B = shape.dim("B"), s.Sq = shape.dim("Sq"), s.Hq = shape.dim("Hq"), s.T = shape.dim("T");
  s.D = o.integer("d"), s.Dv = o.integer("dv"), s.page_size = o.integer("page_size"), s.causal = o.flag("causal");
  s.dtype = dtype;
  s.f8_cache = o.flag("f8_cache");
  check(s.page_size >= 1 && s.Dv >= 1 && s.Dv <= s.D && s.T >= 0, ErrorCode::kInvalidArgument,
        "mla_decode bench: needs page_size >= 1, 1 <= dv <= d, T >= 0");
  return std::make_unique<MlaBench>(s, seed, with_data);
}

}  // namespace

kernels::BenchSpec bench_spec() {
  return kernels::bench_spec_of(
      {{"d", K::kInt, "latent head dims D (512 latent + 64 rotary in DeepSeek)", "576", {}},
       {"dv", K::kInt, "value dims: the first dv of D", "512", {}},
       {"page_size", K::kInt, "keys per cache page", "64", {}},
       {"causal", K::kFlag, "multi-token decode: query i at position T − Sq + i", "false", {}},
       {"f8_cache", K::kFlag, "the latent cache in f8e4m3 (kv_scale 1/64)", "false", {}}},
      make);
}

}  // namespace tessera::mla_decode
