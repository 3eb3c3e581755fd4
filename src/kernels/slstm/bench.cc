// slstm: the benchmark problem (inputs by name, the cost model) for `tessera bench slstm`.
#include <memory>

#include "core/random.h"
#include "kernels/registry.h"
#include "kernels/slstm/impl.h"

namespace tessera::slstm {

const kernels::KernelSpec& spec();

namespace {

class SlstmBench final : public kernels::CallBenchProblem {
 public:
  SlstmBench(const harness::GridShape& s, DType dt, uint64_t seed, bool with_data)
      : CallBenchProblem(spec), B_(s.dim("B")), S_(s.dim("S")), NH_(s.dim("NH")), DH_(s.dim("DH")), dt_(dt) {
    if (!with_data) return;
    wx_ = random_uniform(dt, {B_, S_, 4, NH_, DH_}, 1.0f, seed * 8 + 1);
    r_ = random_uniform(dt, {4, NH_, DH_, DH_}, 0.5f / std::sqrt(float(DH_)), seed * 8 + 2);
    b_ = random_uniform(dt, {4, NH_, DH_}, 0.5f, seed * 8 + 3);
    dh_ = random_uniform(DType::kF32, {B_, S_, NH_, DH_}, 1.0f, seed * 8 + 4);
  }

  // The recurrent products: 4 gates · DH × DH multiply-adds per (batch, step, head).
  double work() const override { return 8.0 * B_ * S_ * NH_ * DH_ * DH_; }

  harness::Cost cost(Pass pass, const std::string&) const override {
    harness::Cost c;
    const double esz = double(dtype_size(dt_));
    const double cells = double(B_) * S_ * NH_ * DH_;
    // h is written in the inputs' dtype (the declared rule the bench allocates by); dh is given in f32.
    const double wx = cells * 4 * esz, r = 4.0 * NH_ * DH_ * DH_ * esz, h = cells * esz, dh = cells * 4;
    if (pass != Pass::kBackward) {
      c.add({"recurrent GEMMs h_{t-1}·r (4 gates)", work(), wx + r + h, 0.0, false});
      // per cell: 4 bias+wx adds, logsigmoid, max, 2 exp, tanh, sigmoid, c, n, h: ~20 FLOPs, 6 transcendentals
      c.add({"pointwise gates and states", 20.0 * cells, 0.0, 6.0 * cells, false});
    }
    if (pass != Pass::kForward) {
      if (pass == Pass::kBackward) c.add({"forward recomputed for the stored activations", work() + 20.0 * cells, wx + r, 6.0 * cells, true});
      c.add({"dh_{t-1} = dgates·rᵀ", work(), dh, 0.0, false});
      c.add({"dr = Σ h_{t-1}ᵀ·dgates", work(), wx + r, 0.0, false});
      c.add({"pointwise gate gradients", 30.0 * cells, wx, 0.0, false});
    }
    c.assumptions.push_back("8·B·S·NH·DH² FLOPs per recurrent product; pointwise ~20 FLOPs/cell forward, 30 backward");
    return c;
  }

  CallData call_data() const override { return {{{"wx", wx_}, {"r", r_}, {"b", b_}, {"grad_h", dh_}}, {}}; }

 private:
  int64_t B_, S_, NH_, DH_;
  DType dt_;
  Tensor wx_, r_, b_, dh_;
};

}  // namespace

std::unique_ptr<harness::BenchProblem> make_bench_problem(const harness::GridShape& shape, DType dtype,
                                                          const harness::OptionValues&, uint64_t seed, bool with_data) {
  return std::make_unique<SlstmBench>(shape, dtype, seed, with_data);
}

}  // namespace tessera::slstm
