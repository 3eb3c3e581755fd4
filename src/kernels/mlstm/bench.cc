// mlstm: the benchmark problem (inputs by name, the chunkwise form's cost) for `tessera bench`.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/random.h"
#include "harness/blas.h"
#include "kernels/mlstm/impl.h"
#include "kernels/registry.h"
#include "tune/declared.h"

namespace tessera::mlstm {

const kernels::KernelSpec& spec();
void quadratic_baseline(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& i, const Tensor& f);  // baseline.cc

namespace {

struct Dims {
  int64_t B = 0, NH = 0, S = 0, DK = 0, DV = 0;
  DType dtype = DType::kF32;
};

class MlstmBench final : public kernels::CallBenchProblem {
 public:
  MlstmBench(const Dims& d, uint64_t seed, bool with_data) : CallBenchProblem(spec), d_(d), chunk_(bench_chunk(d)) {
    if (!with_data) return;  // cost model only (`tessera bench --predict`)
    q_ = random_uniform(d.dtype, {d.B, d.NH, d.S, d.DK}, 1.0f, seed * 8 + 1);
    k_ = random_uniform(d.dtype, {d.B, d.NH, d.S, d.DK}, 1.0f, seed * 8 + 2);
    v_ = random_uniform(d.dtype, {d.B, d.NH, d.S, d.DV}, 1.0f, seed * 8 + 3);
    i_ = random_uniform(DType::kF32, {d.B, d.NH, d.S}, 3.0f, seed * 8 + 4);
    f_ = random_uniform(DType::kF32, {d.B, d.NH, d.S}, 3.0f, seed * 8 + 5);
    for (int64_t j = 0; j < f_.numel(); ++j) f_.data_as<float>()[j] += 3.0f;
    dh_ = random_uniform(DType::kF32, {d.B, d.NH, d.S, d.DV}, 1.0f, seed * 8 + 6);
  }

  harness::Row describe() const override {
    harness::Row r = harness::Row::object();
    r["chunk"] = chunk_;
    // The cpu backend's chunk-start states of one head (f32), kept by each team of threads in the
    // backward (cpu.cc plan_of: one thread per head while the teams' states fit 48 MiB, else
    // teams sharing a head): the bulk of its extra memory, which the bench measures
    // (extra_host_bytes).
    r["cpu_state_bytes_per_team"] = (chunks_per_head() + 1.0) * double(d_.DK * d_.DV + d_.DK) * 4.0;
    return r;
  }

  // Σ over the chunks of one head of L_j^e (the last chunk may be short).
  double chunk_sum(int e) const {
    const int64_t L = std::min<int64_t>(chunk_, d_.S), full = d_.S / L, tail = d_.S % L;
    return double(full) * std::pow(double(L), e) + (tail ? std::pow(double(tail), e) : 0.0);
  }
  double chunks_per_head() const { return chunk_sum(0); }

  // FLOPs of the chunkwise form (cpu.cc), per head, summed over its chunks of L steps. Since v0.4
  // the L×L products count only their causal pairs s ≤ t, L(L+1)/2 per chunk (the masked upper
  // half is not useful work; v0.1–v0.3 counted the tiles in full, 2L² per row of D: rates from
  // before v0.4 are ~10 % higher at L = 64 for the same time). pairs() = Σ_chunks L(L+1)/2.
  // Forward: Q̂Kᵀ 2·pairs·DK, P·V 2·pairs·DV, Q̂·C_j 2L·DK·DV, the chunk's state Kᵀdiag(A)V 2L·DK·DV.
  // The bench's call has no initial state and asks for no last state (nor its gradient), so the
  // state products of the first chunk (with C_0 = 0) and of the last (into a state nobody reads)
  // are not issued (cpu.cc skips them) and not counted: ends() = L_first + L_last (one chunk: the
  // same chunk twice, which removes all of them).
  double pairs() const { return (chunk_sum(2) + chunk_sum(1)) / 2; }
  double ends() const {
    const int64_t L = std::min<int64_t>(chunk_, d_.S), tail = d_.S % L;
    return double(L) + double(tail ? tail : L);
  }
  double forward_flops() const {
    const double DK = double(d_.DK), DV = double(d_.DV);
    return heads() * (2 * pairs() * (DK + DV) + (4 * chunk_sum(1) - 2 * ends()) * DK * DV);
  }
  // Backward alone, what it computes again (issued, not useful): the chunk states Kᵀdiag(A)V (all
  // but the last chunk's) and Q̂Kᵀ. The fused pass (forward_backward) recomputes neither: it forms
  // the states once and keeps each chunk's E and P from its forward sweep.
  double backward_recompute_flops() const {
    const int64_t L = std::min<int64_t>(chunk_, d_.S), tail = d_.S % L;
    const double DK = double(d_.DK), DV = double(d_.DV), last = double(tail ? tail : L);
    return heads() * (2 * (chunk_sum(1) - last) * DK * DV + 2 * pairs() * DK);
  }
  // Backward, the gradient products: dNum·Vᵀ, Pᵀ·dNum, dS·K, dSᵀ·Q̂ (L×L, causal pairs); dNum·C_jᵀ,
  // Q̂ᵀdiag(w)dNum, diag(A)V·dC_{j+1}ᵀ, diag(A)K·dC_{j+1} (L×DK×DV); the first chunk's dNum·C_0ᵀ and
  // dC_0 and the last chunk's two products with dC_NC = 0 are not issued (see ends()).
  double backward_flops() const {
    const double DK = double(d_.DK), DV = double(d_.DV);
    return heads() * (4 * pairs() * (DK + DV) + (8 * chunk_sum(1) - 4 * ends()) * DK * DV);
  }
  double heads() const { return double(d_.B * d_.NH); }
  double work() const override { return forward_flops(); }

  harness::Cost cost(Pass pass, const std::string&) const override {
    harness::Cost c;
    const double esz = double(dtype_size(d_.dtype)), tok = double(d_.B * d_.NH * d_.S);
    const double in_bytes = tok * (2.0 * d_.DK + d_.DV) * esz + tok * 8.0, h_bytes = tok * d_.DV * esz;
    const double exps = heads() * (chunk_sum(2) + chunk_sum(1)) / 2 + heads() * chunk_sum(1);  // E (causal), A
    if (pass != Pass::kBackward)
      c.add({"forward: Q̂Kᵀ, P·V (L×L tiles), Q̂·C_j, Kᵀdiag(A)V per chunk", forward_flops(), in_bytes + h_bytes, exps,
             false});
    if (pass != Pass::kForward) {
      if (pass == Pass::kBackward)
        c.add({"backward: the chunk states Kᵀdiag(A)V and Q̂Kᵀ again", backward_recompute_flops(), 0.0, exps, true});
      c.add({"backward: dNum·Vᵀ, Pᵀ·dNum, dS·K, dSᵀ·Q̂ (L×L tiles) and four L×DHQK×DHV products per chunk",
             backward_flops(), in_bytes + 2 * h_bytes + tok * (2.0 * d_.DK + d_.DV) * esz, 0.0, false});
    }
    c.assumptions.push_back("chunkwise form at chunk " + std::to_string(chunk_) +
                            ": FLOPs of the chunkwise products, the L×L tiles at their causal pairs s ≤ t only "
                            "(since v0.4; v0.1–v0.3 counted them in full); the state products that a zero initial state "
                            "or an unread last state makes unnecessary are not counted; the backward's "
                            "recomputation of the states and of Q̂Kᵀ (not in the fused pass) counted as issued, "
                            "not useful");
    return c;
  }

  // The parallel (quadratic) form through the BLAS (baseline.cc), forward only.
  std::vector<harness::BaselineCall> baselines(const std::vector<Pass>& passes, int) override {
    std::vector<harness::BaselineCall> out;
    if (d_.dtype != DType::kF32 || !harness::blas::available()) return out;
    for (Pass pass : passes) {
      if (pass != Pass::kForward) continue;
      out.push_back({.name = "blas-quadratic",
                     .pass = pass,
                     .description = "parallel (quadratic) form: S×S decay matrix, Q̂Kᵀ and P·V through the BLAS, per head",
                     .run = [this] { quadratic_baseline(q_, k_, v_, i_, f_); }});
      const double S = double(d_.S);
      out.back().cost.add({"Q̂Kᵀ and P·V, S×S", 2 * S * S * double(d_.DK + d_.DV) * double(d_.B * d_.NH), 0.0, S * S, false});
    }
    return out;
  }

  CallData call_data() const override {
    CallData c{{{"q", q_}, {"k", k_}, {"v", v_}, {"i", i_}, {"f", f_}, {"grad_h", dh_}}, {}};
    c.options.set("chunk_size", std::to_string(chunk_));
    return c;
  }

 private:
  // The chunk the rows run and their FLOPs count: the tuned table's for cpu at this shape, else
  // the default — passed to every call explicitly, so that an autotune inside a timed call cannot
  // run another chunk than the cost model counts.
  static int64_t bench_chunk(const Dims& d) {
    const tune::DeclaredCall c{.implementation = "cpu",
                               .dtype = d.dtype,
                               .dims = {d.B, d.NH, d.S, d.DK, d.DV},
                               .threads = resolve_num_threads(0),
                               .given = {{"chunk_size", 0}},
                               .autotune_on_miss = false};
    return tune::param(tune::choose_declared(tuning(), c, {}, {}).params, "chunk_size").value_or(kDefaultChunk);
  }

  Dims d_;
  int64_t chunk_ = kDefaultChunk;
  Tensor q_, k_, v_, i_, f_, dh_;
};

}  // namespace

std::unique_ptr<harness::BenchProblem> make_bench_problem(const harness::GridShape& shape, DType dtype,
                                                          const harness::OptionValues&, uint64_t seed, bool with_data) {
  Dims d;
  d.B = shape.dim("B"), d.NH = shape.dim("NH"), d.S = shape.dim("S"), d.DK = shape.dim("DHQK"), d.DV = shape.dim("DHV");
  d.dtype = dtype;
  return std::make_unique<MlstmBench>(d, seed, with_data);
}

}  // namespace tessera::mlstm
