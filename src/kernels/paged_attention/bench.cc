// paged_attention: the benchmark problem and its cost model; the gather-then-attention baseline
// is baseline.cc's.
//
// Shape: N sequences of kv_len S each (causal), the first `prefill` of them prefilling Q new
// tokens, the others decoding one; H query heads, H / gqa kv heads, head dim D (= Dv); pages of
// `page_size` slots in a shuffled order; with --f8-cache the caches hold f8e4m3 (raw values up to 64,
// k_scale = v_scale = 1/64).
#include <functional>

#include "core/random.h"
#include "kernels/bench_glue.h"
#include "kernels/paged_attention/impl.h"
#include "kernels/registry.h"
#include "tessera/error.h"

namespace tessera::paged_attention {

const kernels::KernelSpec& spec();
std::function<void()> gather_attention_baseline(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                                const Tensor& page_table, const Tensor& cu_q_lens, int64_t S,
                                                int threads);  // baseline.cc

namespace {

using K = harness::OptionSpec::Kind;

struct Settings {
  int64_t N = 0, S = 0, Q = 1, H = 0, Hkv = 0, D = 0, prefill = 0, page_size = 16;
  DType dtype = DType::kBF16;
  bool f8_cache = false;
  DType cache_dtype() const { return f8_cache ? DType::kF8E4M3 : dtype; }
  int64_t q_len(int64_t s) const { return s < prefill ? Q : 1; }
  int64_t T() const { return prefill * Q + (N - prefill); }
  int64_t pages() const { return (S + page_size - 1) / page_size; }
  // Σ over query rows of the keys they see (causal, kv_len S).
  double pairs() const {
    const double s = static_cast<double>(S), q = static_cast<double>(Q);
    return static_cast<double>(prefill) * (q * s - q * (q - 1) / 2) + static_cast<double>(N - prefill) * s;
  }
};

class PagedBench final : public kernels::CallBenchProblem {
 public:
  PagedBench(const Settings& s, uint64_t seed, bool with_data) : CallBenchProblem(spec), s_(s) {
    if (!with_data) return;
    const int64_t P = s.N * s.pages();
    q_ = random_uniform(s.dtype, {s.T(), s.H, s.D}, 1.0f, seed * 5 + 1);
    k_ = cache({P, s.page_size, s.Hkv, s.D}, seed * 5 + 2);
    v_ = cache({P, s.page_size, s.Hkv, s.D}, seed * 5 + 3);
    pt_ = kernels::shuffled_page_table(s.N, s.pages(), seed);
    kl_ = Tensor::empty(DType::kI32, {s.N});
    cq_ = Tensor::empty(DType::kI32, {s.N + 1});
    cq_.data_as<int32_t>()[0] = 0;
    for (int64_t i = 0; i < s.N; ++i) {
      kl_.data_as<int32_t>()[i] = static_cast<int32_t>(s.S);
      cq_.data_as<int32_t>()[i + 1] = static_cast<int32_t>(cq_.data_as<int32_t>()[i] + s.q_len(i));
    }
  }

  harness::Row describe() const override {
    harness::Row r = harness::Row::object();
    r["kv_heads"] = s_.Hkv, r["prefill"] = s_.prefill, r["page_size"] = s_.page_size;
    r["cache_dtype"] = dtype_name(s_.cache_dtype());
    return r;
  }
  double work() const override { return 4.0 * s_.H * s_.D * s_.pairs(); }

  // Useful FLOPs: QKᵀ and PV over the visible pairs. Bytes: the cache rows the batch needs, each
  // once (what a decode step must stream: its roofline is the memory line), q, o and lse.
  harness::Cost cost(Pass, const std::string&) const override {
    harness::Cost c;
    const double esz = static_cast<double>(dtype_size(s_.dtype)), T = static_cast<double>(s_.T());
    const double cache_esz = static_cast<double>(dtype_size(s_.cache_dtype()));
    const double cache = static_cast<double>(s_.N) * s_.S * s_.Hkv * 2.0 * s_.D * cache_esz;
    const double qo = 2.0 * T * s_.H * s_.D * esz + T * s_.H * 4.0;
    c.add({"forward: QKᵀ, PV over the visible pairs", work(), cache + qo, s_.H * s_.pairs(), false});
    c.assumptions.push_back("useful FLOPs 4·H·D·pairs (causal); bytes: the needed cache rows once, q, o, lse");
    return c;
  }

  // Gather every sequence's pages into contiguous k, v, then attention's varlen forward (cpu);
  // none for an f8e4m3 cache (attention takes no f8e4m3).
  std::vector<harness::BaselineCall> baselines(const std::vector<Pass>& passes, int threads) override {
    if (s_.f8_cache) return {};
    return kernels::forward_baseline(
        passes, {.name = "gather+attention",
                 .description = "copy the pages into contiguous k, v, then attention (varlen, causal, cpu)",
                 .roofline_dtype = dtype_name(s_.dtype),
                 .cost = cost(Pass::kForward, "gather+attention"),
                 .run = gather_attention_baseline(q_, k_, v_, pt_, cq_, s_.S, threads)});
  }

  CallData call_data() const override {
    harness::OptionValues o;
    o.set("causal", "true");
    if (s_.f8_cache) o.set("k_scale", "0.015625"), o.set("v_scale", "0.015625");
    return {{{"q", q_}, {"k_cache", k_}, {"v_cache", v_}, {"page_table", pt_}, {"kv_lens", kl_}, {"cu_q_lens", cq_}}, o};
  }

 private:
  // A cache uniform in [-1, 1]: in the problem's dtype, or f8e4m3 raw values up to 64.
  Tensor cache(const Shape& shape, uint64_t seed) const {
    return random_uniform(s_.cache_dtype(), shape, s_.f8_cache ? 64.0f : 1.0f, seed);
  }

  Settings s_;
  Tensor q_, k_, v_, pt_, kl_, cq_;
};

}  // namespace

std::vector<harness::OptionSpec> bench_options() {
  return {{"gqa", K::kInt, "query heads per kv head (1 = MHA, H = MQA)", "4", {}},
          {"prefill", K::kInt, "sequences that prefill Q tokens (the first ones); the others decode one", "0", {}},
          {"page_size", K::kInt, "slots per page", "16", {}},
          {"f8_cache", K::kFlag, "the caches in f8e4m3 (k_scale = v_scale = 1/64)", "false", {}}};
}

std::unique_ptr<harness::BenchProblem> make_bench_problem(const harness::GridShape& shape, DType dtype,
                                                          const harness::OptionValues& o, uint64_t seed, bool with_data) {
  Settings s;
  s.N = shape.dim("N"), s.S = shape.dim("S"), s.Q = shape.dim("Q"), s.H = shape.dim("H"), s.D = shape.dim("D");
  const int64_t g = o.integer("gqa");
  check(g >= 1 && s.H % g == 0, ErrorCode::kInvalidArgument, "--gqa must divide H=" + std::to_string(s.H));
  s.Hkv = s.H / g;
  s.prefill = o.integer("prefill");
  s.page_size = o.integer("page_size");
  s.dtype = dtype;
  s.f8_cache = o.flag("f8_cache");
  check(s.prefill >= 0 && s.prefill <= s.N, ErrorCode::kInvalidArgument, "--prefill must be in [0, N]");
  check(s.page_size >= 1 && s.Q >= 1 && s.Q <= s.S, ErrorCode::kInvalidArgument,
        "paged_attention bench: need page_size >= 1 and 1 <= Q <= S");
  return std::make_unique<PagedBench>(s, seed, with_data);
}

}  // namespace tessera::paged_attention
