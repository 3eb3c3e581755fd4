// tessera run linear_cross_entropy: the kernel on the user's own .npy arrays.
#include <fmt/core.h>

#include <chrono>
#include <filesystem>

#include "harness/npy.h"
#include "tessera/commands.h"
#include "tessera/error.h"
#include "tessera/linear_cross_entropy.h"

namespace tessera::cli {
namespace {

namespace lce = tessera::linear_cross_entropy;

struct RunArgs {
  std::string x, w, labels, bias, weights, out;
  std::string w_layout = "auto", reduction = "mean", impl;
  double z_loss = 0, soft_cap = 0, smoothing = 0;
  int64_t ignore_index = -100;
  bool grad = false, argmax = false;
  int threads = 0;
};

// Gradients are written as f32 whatever the inputs' dtype (no second rounding for the user).
Tensor as_f32(const Tensor& t) {
  if (t.dtype() == DType::kF32) return t;
  Tensor o = Tensor::empty(DType::kF32, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) o.data_as<float>()[i] = load_as_f32(t.data(), t.dtype(), i);
  return o;
}

// dw in w's memory layout as the user gave it (a C-order array of w's shape).
void save_npy(const std::string& dir, const char* name, const TensorView& t) {
  npy::save((std::filesystem::path(dir) / name).string(), t);
}

void run_lce(const RunArgs& a) {
  lce::Options opt;
  opt.reduction = lce::parse_reduction(a.reduction);
  opt.w_layout = lce::parse_w_layout(a.w_layout);
  opt.z_loss_weight = a.z_loss;
  opt.soft_cap = a.soft_cap;
  opt.label_smoothing = a.smoothing;
  opt.ignore_index = a.ignore_index;
  opt.return_argmax = a.argmax;
  opt.implementation = a.impl;
  opt.num_threads = a.threads;
  opt.check_finite = true;  // users' files: reject NaN/Inf before computing

  Tensor x = npy::load(a.x), w = npy::load(a.w), labels = npy::load(a.labels), bias, weights;
  if (!a.bias.empty()) bias = npy::load(a.bias);
  if (!a.weights.empty()) weights = npy::load(a.weights);
  lce::Inputs in{x, w, std::nullopt, labels, std::nullopt};
  if (bias.defined()) in.bias = bias.view();
  if (weights.defined()) in.weights = weights.view();

  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  if (ec) throw Error(ErrorCode::kIo, a.out + ": cannot create output directory: " + ec.message());

  const auto t0 = std::chrono::steady_clock::now();
  lce::Result r = a.grad ? lce::compute_with_grad(in, opt) : lce::compute(in, opt);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  save_npy(a.out, "loss.npy", r.loss);
  save_npy(a.out, "lse.npy", r.lse);
  if (r.argmax.defined()) save_npy(a.out, "argmax.npy", r.argmax);
  if (a.grad) {
    save_npy(a.out, "dx.npy", as_f32(r.dx));
    // dw: shape of w as given; if w was given as a C-order array the layouts coincide.
    save_npy(a.out, "dw.npy", as_f32(r.dw));
    if (r.dbias.defined()) save_npy(a.out, "dbias.npy", as_f32(r.dbias));
  }
  const int64_t H = x.shape().empty() ? 0 : x.shape().back();
  const int64_t B = H ? x.numel() / H : 0;
  fmt::print("linear_cross_entropy: implementation={} B={} H={} V={} dtype={} reduction={}{} time={:.3f} ms\n",
             r.implementation, B, H, bias.defined() ? bias.numel() : (w.shape()[0] == H ? w.shape()[1] : w.shape()[0]),
             dtype_name(x.dtype()), a.reduction, a.grad ? " (with gradients)" : "", ms);
  if (r.loss.numel() == 1 && r.loss.shape().empty()) fmt::print("loss = {:.9g}\n", r.loss.data_as<float>()[0]);
  fmt::print("wrote {}/{{loss,lse{}{}}}.npy\n", a.out, a.argmax ? ",argmax" : "",
             a.grad ? (bias.defined() ? ",dx,dw,dbias" : ",dx,dw") : "");
}

}  // namespace

void register_run(CLI::App& app) {
  auto* run = app.add_subcommand("run", "Run a kernel on your own .npy arrays");
  run->require_subcommand(1);
  auto* cmd = run->add_subcommand("linear_cross_entropy", "Fused linear + softmax cross-entropy on .npy inputs");
  auto a = std::make_shared<RunArgs>();
  cmd->add_option("--x", a->x, "hidden states [..., H] (.npy: f32, f16 or bf16 as <V2)")->required();
  cmd->add_option("--w", a->w, "classifier [H, V] or [V, H] (.npy, same dtype as x)")->required();
  cmd->add_option("--labels", a->labels, "labels [...] (.npy: i32 or i64)")->required();
  cmd->add_option("--bias", a->bias, "bias [V] (.npy, float)");
  cmd->add_option("--weights", a->weights, "per-token weights [...] (.npy, f32)");
  cmd->add_option("--w-layout", a->w_layout, "hv, vh or auto (default: from the shape)")->check(CLI::IsMember({"hv", "vh", "auto"}));
  cmd->add_option("--reduction", a->reduction, "none, sum or mean (default mean)")->check(CLI::IsMember({"none", "sum", "mean"}));
  cmd->add_option("--z-loss", a->z_loss, "z-loss weight λ (adds λ·lse² per token)");
  cmd->add_option("--soft-cap", a->soft_cap, "logit soft cap c (z = c·tanh(z/c)); 0 disables");
  cmd->add_option("--label-smoothing", a->smoothing, "label smoothing ε in [0, 1]");
  cmd->add_option("--ignore-index", a->ignore_index, "label value whose rows are ignored (default -100)");
  cmd->add_flag("--grad", a->grad, "also write dx, dw (and dbias) for an upstream gradient of 1, as f32");
  cmd->add_flag("--argmax", a->argmax, "also write argmax.npy (i64)");
  cmd->add_option("--impl", a->impl, "implementation name or comma list (default: the dispatch order)");
  cmd->add_option("--threads", a->threads, "CPU threads (default: all cores)");
  cmd->add_option("--out", a->out, "output directory")->required();
  cmd->callback([a] { run_lce(*a); });
}

}  // namespace tessera::cli
