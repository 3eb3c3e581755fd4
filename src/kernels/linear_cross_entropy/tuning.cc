// linear_cross_entropy: shape buckets, cache key, timing and sanitizing for the tuner.
#include "kernels/linear_cross_entropy/tuning.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "core/env.h"
#include "core/random.h"
#include "tessera/error.h"
#include "tune/device_kind.h"

namespace tessera::linear_cross_entropy {



// The buckets: dimension order (B, H, V); first match wins. Vocabulary size is what separates
// real models most (how many vocabulary tiles a row streams through); token count and hidden
// size are left open.
//
// Representative shapes are what `tessera tune` times. They keep each bucket's V (the number
// that defines it) but use a small B and H so that a full sweep of every bucket, f32 and bf16,
// finishes in a few minutes on a 2-core CPU (the development machine). On a bigger machine or a
// GPU, pass larger shapes by editing these, and regenerate the table.
const std::vector<tune::Bucket>& tuning_buckets() {
  constexpr int64_t kAny = std::numeric_limits<int64_t>::max();
  static const std::vector<tune::Bucket> buckets = {
      {"small", "V <= 16k: toy models, unit-test sized vocabularies",
       {{"B", 1, kAny, 512}, {"H", 1, kAny, 256}, {"V", 1, 16384, 8192}}},
      {"llama2-ish", "16k < V <= 64k: Llama-2 / Mistral (32000), GPT-2 (50257)",
       {{"B", 1, kAny, 256}, {"H", 1, kAny, 512}, {"V", 16385, 65536, 32000}}},
      {"llama3-ish", "64k < V <= 192k: Llama-3 (128256), Qwen-2 (151936)",
       {{"B", 1, kAny, 128}, {"H", 1, kAny, 512}, {"V", 65537, 196608, 128256}}},
      {"gemma-ish", "V > 192k: Gemma (256000)",
       {{"B", 1, kAny, 64}, {"H", 1, kAny, 512}, {"V", 196609, kAny, 256000}}},
  };
  return buckets;
}

const tune::Bucket* bucket_for(const Problem& p) {
  return tune::match_bucket(tuning_buckets(), {p.B, p.H, p.V});
}

tune::Params to_params(const BlockSizes& bs) { return {{"b", bs.b}, {"h", bs.h}, {"v", bs.v}}; }

BlockSizes from_params(const tune::Params& p) {
  const auto b = tune::param(p, "b"), h = tune::param(p, "h"), v = tune::param(p, "v");
  check(b && h && v, ErrorCode::kInvalidArgument,
        std::string(kKernelName) + ": tuned parameters '" + tune::params_str(p) +
            "' lack one of b, h, v");
  return {*b, *h, *v};
}

namespace {
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
int64_t pow2_class(int64_t x) {
  int64_t c = 1;
  while (c < x) c *= 2;
  return c;
}
}  // namespace

BlockSizes sanitize_for_shape(const BlockSizes& bs, const Problem& p) {
  BlockSizes s = bs;
  s.b = std::min(bs.b, round_up(p.B, 16));
  s.h = std::min(bs.h, round_up(p.H, 16));
  s.v = std::min(bs.v, round_up(p.V, 16));
  return s;
}

bool worth_autotuning(const Problem& p, int64_t min_work) {
  // B*H*V can pass 2^63 only for absurd shapes; compare in double.
  return static_cast<double>(p.B) * static_cast<double>(p.H) * static_cast<double>(p.V) >=
         static_cast<double>(min_work);
}

std::string autotune_key(const Implementation& impl, const Problem& p, Pass op,
                         const std::string& device_kind) {
  std::string k = std::string(kKernelName);
  k += "|impl=" + impl.name();
  k += "|device=" + device_kind;
  k += std::string("|dtype=") + dtype_name(p.dtype);
  k += "|B<=" + std::to_string(pow2_class(p.B));
  k += "|H=" + std::to_string(p.H) + "|V=" + std::to_string(p.V);
  k += std::string("|layout=") + w_layout_name(p.layout);
  k += std::string("|bias=") + (p.bias ? dtype_name(p.bias_dtype) : "none");
  k += std::string("|soft_cap=") + (p.soft_cap > 0 ? "on" : "off");
  k += std::string("|label_smoothing=") + (p.label_smoothing > 0 ? "on" : "off");
  k += std::string("|argmax=") + (p.want_argmax ? "on" : "off");
  k += std::string("|op=") + pass_name(op);
  if (impl.device_type() == DeviceType::kCPU) k += "|threads=" + std::to_string(p.num_threads);
  k += std::string("|version=") + TESSERA_VERSION;
  return k;
}

tune::Runner make_timed_run(const Implementation& impl, const Problem& p, Pass op) {
  // Scratch outputs, shared by every timed call, freed with the RunFn.
  struct Scratch {
    Tensor loss, lse, argmax, grad_loss, dx, dw, dbias;
    bool lse_ready = false;
  };
  auto s = std::make_shared<Scratch>();
  const Device dev = p.device;
  const int64_t nloss = p.reduction == Reduction::kNone ? p.B : 1;
  s->loss = Tensor::empty(DType::kF32, {nloss}, dev);
  s->lse = Tensor::empty(DType::kF32, {p.B}, dev);
  if (p.want_argmax) s->argmax = Tensor::empty(DType::kI64, {p.B}, dev);
  if (op != Pass::kForward) {
    Tensor g = Tensor::empty(DType::kF32, {nloss});
    for (int64_t i = 0; i < nloss; ++i) g.data_as<float>()[i] = 1.0f;
    s->grad_loss = dev.type == DeviceType::kCPU ? g : g.to(dev);
    s->dx = Tensor::empty(p.dtype, {p.B, p.H}, dev);
    s->dw = Tensor::empty(p.dtype, {p.H * p.V}, dev);
    if (p.bias) s->dbias = Tensor::empty(p.bias_dtype, {p.V}, dev);
  }
  const Implementation* ip = &impl;
  const Problem prob = p;
  tune::OutputsFn outputs = [s, op] {  // backward's lse is its input, computed once
    std::vector<tune::Output> o;
    if (op != Pass::kBackward) o.insert(o.end(), {{"loss", s->loss}, {"lse", s->lse}});
    if (op != Pass::kForward) o.insert(o.end(), {{"dx", s->dx}, {"dw", s->dw}});
    if (op != Pass::kForward && s->dbias.defined()) o.push_back({"dbias", s->dbias});
    return o;
  };
  tune::RunFn run = [s, ip, prob, op](const tune::Params& params) -> double {
    const BlockSizes bs = from_params(params);
    ip->validate_block_sizes(bs);
    ForwardOut fo{s->loss.data_as<float>(), s->lse.data_as<float>(),
                  prob.want_argmax ? s->argmax.data_as<int64_t>() : nullptr};
    GradIn gi{op == Pass::kForward ? nullptr : s->grad_loss.data_as<float>(), nullptr};
    GradOut go{op == Pass::kForward ? nullptr : s->dx.data(), prob.dtype,
               op == Pass::kForward ? nullptr : s->dw.data(), prob.dtype,
               prob.bias && op != Pass::kForward ? s->dbias.data() : nullptr, prob.bias_dtype};
    if (op == Pass::kBackward && !s->lse_ready) {  // backward is timed with the forward's lse
      ip->forward(prob, bs, fo);
      ip->synchronize(prob);
      s->lse_ready = true;
    }
    const auto t0 = std::chrono::steady_clock::now();
    switch (op) {
      case Pass::kForward: ip->forward(prob, bs, fo); break;
      case Pass::kBackward:
        gi.lse = s->lse.data_as<float>();
        ip->backward(prob, bs, gi, go);
        break;
      case Pass::kFused: ip->forward_backward(prob, bs, gi, fo, go); break;
    }
    ip->synchronize(prob);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  return {std::move(run), std::move(outputs)};
}

std::string Tuning::describe(const Implementation& impl, const Problem& p, Pass op) {
  return std::string(kKernelName) + " " + impl.name() + " " + dtype_name(p.dtype) + " " + pass_name(op) +
         " B=" + std::to_string(p.B) + ",H=" + std::to_string(p.H) + ",V=" + std::to_string(p.V);
}

Problem Tuning::shape_only(const std::vector<int64_t>& s, DType dtype, Device dev) {
  Problem p;
  p.B = s.at(0), p.H = s.at(1), p.V = s.at(2);
  p.dtype = dtype;
  p.device = dev;
  p.num_threads = resolve_num_threads(0);
  return p;
}

OwnedProblem make_random_problem(int64_t B, int64_t H, int64_t V, DType dtype, Device device,
                                 uint64_t seed) {
  OwnedProblem o;
  o.x = random_uniform(dtype, {B, H}, 1.0f, seed * 3 + 1).to(device);
  o.w = random_uniform(dtype, {H, V}, 1.0f / std::sqrt(static_cast<float>(H)), seed * 3 + 2).to(device);
  o.labels = random_indices(DType::kI64, {B}, V, seed * 3 + 3).to(device);
  Problem& p = o.problem;
  p.B = B, p.H = H, p.V = V;
  p.dtype = dtype;
  p.device = device;
  p.x = o.x.data(), p.w = o.w.data(), p.labels = o.labels.data();
  p.layout = WLayout::kHV;
  p.label_dtype = DType::kI64;
  p.num_threads = resolve_num_threads(0);
  return o;
}

std::string BlockSizes::str() const { return tune::params_str(to_params(*this)); }

void validate_block_sizes(const std::string& implementation, const BlockSizes& bs) {
  tune::validate_named<Tuning>(implementation, bs);
}

}  // namespace tessera::linear_cross_entropy
