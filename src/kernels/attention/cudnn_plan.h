// attention, cudnn backend: the host arithmetic of a call — which problems cuDNN's fused flash
// attention (SDPA) takes and why not the others, the descriptor dims / strides of Tessera's
// [B, S, H, D] layouts, the diagonal band that encodes causal and window masks, and the key of
// the execution-plan cache. Plain C++ (no CUDA or cuDNN headers), so the CPU test suite checks it
// (AttentionCudnnPlan.* in tests/kernels/attention_cudnn_plan_test.cc) and cudnn.cc uses exactly
// what was tested. Design: docs/kernels/attention.md, section "cudnn backend".
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>

#include "kernels/attention/impl.h"

namespace tessera::attention::cudnn_plan {

// Head dims: multiples of 8 (16-byte rows of f16 / bf16), at most 256 each (the frontend's
// validation of the backward on Hopper with cuDNN 9.10+; the forward leaves it to the engines).
constexpr int64_t kHeadDimMultiple = 8;
constexpr int64_t kMaxHeadDim = 256;
constexpr size_t kPointerAlign = 16;

// cuDNN's dims / strides of one tensor, in its [B, H, S, D] order.
struct Layout {
  std::array<int64_t, 4> dim{}, stride{};
};

// A [B, S, H, D] row-major array (Tessera's q, k, v, o and their gradients) seen as [B, H, S, D].
inline Layout bshd(int64_t B, int64_t S, int64_t H, int64_t D) {
  return {{B, H, S, D}, {S * H * D, D, H * D, 1}};
}

// The dense lse [B, H, S] (f32) as cuDNN's Stats [B, H, S, 1].
inline Layout stats(int64_t B, int64_t H, int64_t S) { return {{B, H, S, 1}, {H * S, S, 1, 1}}; }

// cuDNN's diagonal band with bottom-right alignment (off = Sk − Sq, as Tessera's contract): a key j
// of row i is kept when j + left > i + off (so `left` keys end at the diagonal, itself included)
// and j <= i + off + right. Tessera: j >= i + off − window_left and j <= i + off + window_right,
// causal = right 0. So left = window_left + 1; right = 0 when causal, else window_right.
// A bound that keeps every key is dropped (no mask nodes): left >= Sk (row Sq−1 already sees key
// 0), right >= Sq − 1 (row 0 already sees key Sk − 1); e.g. causal decode with one query row.
struct Band {
  std::optional<int64_t> left, right;
};

inline Band band_of(const Problem& p) {
  Band b;
  if (p.window_left >= 0 && p.window_left + 1 < p.Sk) b.left = p.window_left + 1;
  const int64_t right = p.causal ? 0 : p.window_right;  // window_right >= 0 adds nothing to causal
  if (right >= 0 && right < p.Sq - 1) b.right = right;
  return b;
}

inline bool aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kPointerAlign == 0; }

// Why cuDNN's fused attention cannot take `p` ("" when it can, as far as the host knows: cuDNN's
// own support check, run when the plan is built, has the last word). Device and dtype of the
// outputs are checked elsewhere (they are not part of Problem).
inline std::string unsupported_reason(const Problem& p) {
  const auto n = [](int64_t v) { return std::to_string(v); };
  if (p.dtype != DType::kF16 && p.dtype != DType::kBF16)
    return std::string("cuDNN's fused attention takes f16 or bf16 inputs, got ") + dtype_name(p.dtype);
  if (p.varlen)
    return "the varlen form (cu_seqlens) is not wired to cuDNN's ragged offsets yet: never run on a GPU";
  if (p.alibi) return "cuDNN's ALiBi uses its own slopes (2^(-8h/H)), not the caller's alibi_slopes";
  if (p.seg_q) return "cuDNN's fused attention has no segment-id mask";
  if (p.dropout())
    return "dropout: cuDNN draws its own mask (not Tessera's Philox rule, which cpu, cuda and the reference share)";
  if (p.bias)
    return "the additive bias (and dbias) is not wired to cuDNN's bias tensor yet: the cuda kernels take it";
  if (p.softcap > 0.0)
    return "softcap: cuDNN applies it only through a score modifier that excludes the causal and window "
           "masks; not wired";
  if (p.D % kHeadDimMultiple != 0 || p.Dv % kHeadDimMultiple != 0)
    return "cuDNN needs head dims that are multiples of 8, got D=" + n(p.D) + ", Dv=" + n(p.Dv);
  if (p.D > kMaxHeadDim || p.Dv > kMaxHeadDim)
    return "cuDNN takes head dims up to " + n(kMaxHeadDim) + ", got D=" + n(p.D) + ", Dv=" + n(p.Dv);
  if (p.Sq >= INT32_MAX || p.Sk >= INT32_MAX) return "cuDNN's mask bounds are 32-bit: Sq and Sk must be < 2^31";
  const Band b = band_of(p);
  if ((b.left || b.right) && p.Sq > p.Sk)
    return "cuDNN's bottom-right causal / window masks need Sq <= Sk, got Sq=" + n(p.Sq) + ", Sk=" + n(p.Sk);
  if (!aligned(p.q) || !aligned(p.k) || !aligned(p.v)) return "cuDNN needs q, k and v 16-byte aligned";
  return {};
}

// Why cuDNN cannot write outputs of these dtypes (cuDNN's O, dO, dQ, dK, dV are in the inputs'
// dtype); "" when it can.
inline std::string unsupported_outputs(DType input, std::initializer_list<DType> outputs) {
  for (const DType t : outputs)
    if (t != input)
      return std::string("cuDNN writes and reads o, grad_o and the gradients in the inputs' dtype (") +
             dtype_name(input) + "), got " + dtype_name(t);
  return {};
}

enum class Pass : int { kForward = 0, kBackward = 1 };

// One cached execution plan: everything the graph depends on. The scale is part of the graph (a
// constant), as f32 bits; a band bound that is absent is −1.
struct PlanKey {
  int device = 0;
  Pass pass = Pass::kForward;
  DType dtype = DType::kBF16;
  int64_t B = 0, Sq = 0, Sk = 0, Hq = 0, Hkv = 0, D = 0, Dv = 0;
  uint32_t scale_bits = 0;
  int64_t left = -1, right = -1;
  bool deterministic = false;  // backward: cuDNN's deterministic engine first

  bool operator==(const PlanKey& o) const {
    return device == o.device && pass == o.pass && dtype == o.dtype && B == o.B && Sq == o.Sq && Sk == o.Sk &&
           Hq == o.Hq && Hkv == o.Hkv && D == o.D && Dv == o.Dv && scale_bits == o.scale_bits && left == o.left &&
           right == o.right && deterministic == o.deterministic;
  }
  float scale() const {
    float s;
    std::memcpy(&s, &scale_bits, sizeof s);
    return s;
  }
  std::string str() const {
    const auto n = [](int64_t v) { return std::to_string(v); };
    return std::string(pass == Pass::kForward ? "fwd" : "bwd") + " cuda:" + std::to_string(device) + " " +
           dtype_name(dtype) + " B=" + n(B) + " Sq=" + n(Sq) + " Sk=" + n(Sk) + " Hq=" + n(Hq) + " Hkv=" + n(Hkv) +
           " D=" + n(D) + " Dv=" + n(Dv) + " scale=" + std::to_string(scale()) + " left=" + n(left) +
           " right=" + n(right) + (deterministic ? " deterministic" : "");
  }
};

inline PlanKey plan_key(const Problem& p, Pass pass) {
  PlanKey k;
  k.device = p.device.index;
  k.pass = pass;
  k.dtype = p.dtype;
  k.B = p.N, k.Sq = p.Sq, k.Sk = p.Sk, k.Hq = p.Hq, k.Hkv = p.Hkv, k.D = p.D, k.Dv = p.Dv;
  const float s = static_cast<float>(p.scale);
  std::memcpy(&k.scale_bits, &s, sizeof s);
  const Band b = band_of(p);
  k.left = b.left.value_or(-1);
  k.right = b.right.value_or(-1);
  k.deterministic = pass == Pass::kBackward && p.deterministic;
  return k;
}

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = 1469598103934665603ull;
    const auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<uint64_t>(k.device)), mix(static_cast<uint64_t>(k.pass)), mix(static_cast<uint64_t>(k.dtype));
    for (const int64_t v : {k.B, k.Sq, k.Sk, k.Hq, k.Hkv, k.D, k.Dv, k.left, k.right}) mix(static_cast<uint64_t>(v));
    mix(k.scale_bits), mix(k.deterministic);
    return h;
  }
};

// Plans kept before the cache is emptied and starts over (a bound on host memory for programs
// that see many shapes; a plan is rebuilt on its next use).
constexpr size_t kMaxCachedPlans = 256;

}  // namespace tessera::attention::cudnn_plan
