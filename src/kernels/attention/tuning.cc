// attention: shape buckets, cache key, timing and sanitizing for the tuner.
#include "kernels/attention/tuning.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/random.h"
#include "tessera/error.h"
#include "tessera/version.h"
#include "tune/device_kind.h"

namespace tessera::attention {

// The buckets: dimension order (B, S, H, D); first match wins. The head dim is what changes the
// best tiles most (it sets the width of every tile product and the bytes per kv row a tile
// holds in cache); batch, length and heads are left open.
//
// Representative shapes (what `tessera tune` times) keep each bucket's D with one sequence of
// 1024 rows and 4 heads, so that a full sweep, f32 and bf16, takes a few minutes on the 2-core
// development machine.
const std::vector<tune::Bucket>& tuning_buckets() {
  constexpr int64_t kAny = std::numeric_limits<int64_t>::max();
  static const std::vector<tune::Bucket> buckets = {
      {"d64", "D <= 64: small heads (BERT-style, many vision models)",
       {{"B", 1, kAny, 1}, {"S", 1, kAny, 1024}, {"H", 1, kAny, 4}, {"D", 1, 64, 64}}},
      {"d128", "64 < D <= 128: Llama, Mistral, Qwen",
       {{"B", 1, kAny, 1}, {"S", 1, kAny, 1024}, {"H", 1, kAny, 4}, {"D", 65, 128, 128}}},
      {"d256", "D > 128: Gemma (256)",
       {{"B", 1, kAny, 1}, {"S", 1, kAny, 1024}, {"H", 1, kAny, 4}, {"D", 129, kAny, 256}}},
  };
  return buckets;
}

const tune::Bucket* bucket_for(const Problem& p) {
  return tune::match_bucket(tuning_buckets(), {p.N, std::max(p.Sq, p.Sk), p.Hq, std::max(p.D, p.Dv)});
}

tune::Params to_params(const BlockSizes& bs) { return {{"q", bs.q}, {"kv", bs.kv}}; }

BlockSizes from_params(const tune::Params& p) {
  const auto q = tune::param(p, "q"), kv = tune::param(p, "kv");
  check(q && kv, ErrorCode::kInvalidArgument,
        std::string(kKernelName) + ": tuned parameters '" + tune::params_str(p) + "' lack one of q, kv");
  return {*q, *kv};
}

namespace {
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
using tune::pow2_class;
}  // namespace

BlockSizes sanitize_for_shape(const BlockSizes& bs, const Problem& p) {
  BlockSizes s = bs;
  s.q = std::max<int64_t>(1, std::min(bs.q, round_up(std::max<int64_t>(p.Sq, 1), 16)));
  s.kv = std::max<int64_t>(1, std::min(bs.kv, round_up(std::max<int64_t>(p.Sk, 1), 16)));
  return s;
}

bool worth_autotuning(const Problem& p, int64_t min_work) {
  const double work = static_cast<double>(p.N) * static_cast<double>(p.Hq) * static_cast<double>(p.Sq) *
                      static_cast<double>(p.Sk) * static_cast<double>(p.D);
  return work >= static_cast<double>(min_work);
}

std::string autotune_key(const Implementation& impl, const Problem& p, Pass op, const std::string& device_kind) {
  auto on = [](bool b) { return b ? "on" : "off"; };
  std::string k = std::string(kKernelName);
  k += "|impl=" + impl.name();
  k += "|device=" + device_kind;
  k += std::string("|dtype=") + dtype_name(p.dtype);
  k += "|N<=" + std::to_string(pow2_class(p.N)) + "|varlen=" + on(p.varlen);
  k += "|Sq<=" + std::to_string(pow2_class(p.Sq)) + "|Sk<=" + std::to_string(pow2_class(p.Sk));
  k += "|Hq=" + std::to_string(p.Hq) + "|Hkv=" + std::to_string(p.Hkv);
  k += "|D=" + std::to_string(p.D) + "|Dv=" + std::to_string(p.Dv);
  k += std::string("|causal=") + on(p.causal);
  k += "|window=" + std::to_string(p.window_left) + "," + std::to_string(p.window_right);
  k += std::string("|softcap=") + on(p.softcap > 0) + "|alibi=" + on(p.alibi) + "|segments=" + on(p.seg_q);
  k += std::string("|op=") + pass_name(op);
  if (impl.device_type() == DeviceType::kCPU) k += "|threads=" + std::to_string(p.num_threads);
  k += std::string("|version=") + TESSERA_VERSION;
  return k;
}

namespace {

// Scratch outputs shared by every timed call of one RunFn.
struct Scratch {
  Tensor o, lse, grad_o, dq, dk, dv;
  bool saved = false;  // o and lse hold a forward's result (backward timing)
};

std::shared_ptr<Scratch> make_scratch(const Problem& p, Pass op) {
  auto s = std::make_shared<Scratch>();
  const Device dev = p.device;
  s->o = Tensor::empty(p.dtype, {p.total_q, p.Hq, p.Dv}, dev);
  s->lse = Tensor::empty(DType::kF32, {p.total_q * p.Hq}, dev);
  if (op != Pass::kForward) {
    s->grad_o = random_uniform(p.dtype, {p.total_q, p.Hq, p.Dv}, 1.0f, 17).to(dev);
    s->dq = Tensor::empty(p.dtype, {p.total_q, p.Hq, p.D}, dev);
    s->dk = Tensor::empty(p.dtype, {p.total_k, p.Hkv, p.D}, dev);
    s->dv = Tensor::empty(p.dtype, {p.total_k, p.Hkv, p.Dv}, dev);
  }
  return s;
}

void run_op(const Implementation& impl, const Problem& p, const BlockSizes& bs, Pass op, Scratch& s) {
  const ForwardOut fo{s.o.data(), p.dtype, s.lse.data_as<float>()};
  if (op != Pass::kBackward || !s.saved) {
    impl.forward(p, bs, fo);
    s.saved = true;
  }
  if (op == Pass::kForward) return;
  const BackwardIn bi{s.o.data(), p.dtype, s.lse.data_as<float>(), s.grad_o.data(), p.dtype};
  const GradOut go{s.dq.data(), p.dtype, s.dk.data(), p.dtype, s.dv.data(), p.dtype};
  impl.backward(p, bs, bi, go);
}

}  // namespace

tune::Runner make_timed_run(const Implementation& impl, const Problem& p, Pass op) {
  auto s = make_scratch(p, op);
  tune::OutputsFn outputs = [s, op] {  // backward's o and lse are its inputs, computed once
    std::vector<tune::Output> o;
    if (op != Pass::kBackward) o.insert(o.end(), {{"o", s->o}, {"lse", s->lse}});
    if (op != Pass::kForward) o.insert(o.end(), {{"dq", s->dq}, {"dk", s->dk}, {"dv", s->dv}});
    return o;
  };
  const Implementation* ip = &impl;
  std::function<void(const BlockSizes&)> saved;  // backward is timed on a forward's o and lse, computed once
  if (op == Pass::kBackward)
    saved = [s, ip, p](const BlockSizes& bs) {
      if (!s->saved) run_op(*ip, p, bs, Pass::kForward, *s);
    };
  return tune::timed_runner<Tuning>(
      impl, p, [s, ip, p, op](const BlockSizes& bs) { run_op(*ip, p, bs, op, *s); }, std::move(outputs), saved);
}

Problem shape_only_problem(int64_t B, int64_t S, int64_t H, int64_t D, DType dtype, Device device) {
  Problem p;
  p.N = B, p.Sq = S, p.Sk = S;
  p.total_q = B * S, p.total_k = B * S;
  p.Hq = H, p.Hkv = H, p.D = D, p.Dv = D;
  p.dtype = dtype;
  p.device = device;
  p.scale = 1.0 / std::sqrt(static_cast<double>(D));
  p.num_threads = resolve_num_threads(0);
  return p;
}

OwnedProblem make_random_problem(int64_t B, int64_t S, int64_t H, int64_t D, DType dtype, Device device,
                                 uint64_t seed) {
  OwnedProblem o;
  o.q = random_uniform(dtype, {B * S, H, D}, 1.0f, seed * 3 + 1).to(device);
  o.k = random_uniform(dtype, {B * S, H, D}, 1.0f, seed * 3 + 2).to(device);
  o.v = random_uniform(dtype, {B * S, H, D}, 1.0f, seed * 3 + 3).to(device);
  o.problem = shape_only_problem(B, S, H, D, dtype, device);
  o.problem.q = o.q.data(), o.problem.k = o.k.data(), o.problem.v = o.v.data();
  return o;
}

std::string Tuning::describe(const Implementation& impl, const Problem& p, Pass op) {
  return std::string(kKernelName) + " " + impl.name() + " " + dtype_name(p.dtype) + " " + pass_name(op) +
         " N=" + std::to_string(p.N) + ",Sq=" + std::to_string(p.Sq) + ",Sk=" + std::to_string(p.Sk) +
         ",Hq=" + std::to_string(p.Hq) + ",D=" + std::to_string(p.D);
}

std::string BlockSizes::str() const { return tune::params_str(to_params(*this)); }

void validate_block_sizes(const std::string& implementation, const BlockSizes& bs) {
  tune::validate_named<Tuning>(implementation, bs);
}

}  // namespace tessera::attention
