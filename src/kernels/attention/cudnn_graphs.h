// attention, cudnn backend: the cuDNN frontend graphs of one PlanKey — SDPA forward (O and the
// f32 Stats = lse) and backward (dQ, dK, dV) over Tessera's [B, S, H, D] arrays, with causal /
// window masks as cuDNN's bottom-right diagonal band. Needs the cuDNN frontend headers; used by
// cudnn.cc and by the deviceless graph test (tests/kernels/attention_cudnn_graph_test.cc), which
// checks these exact graphs against cuDNN for an H100 without a GPU.
#pragma once

#include <cudnn_frontend.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/attention/cudnn_plan.h"

namespace tessera::attention::cudnn_graphs {

namespace fe = cudnn_frontend;
namespace cp = cudnn_plan;

// Tensor uids of the graphs' variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

inline std::vector<int64_t> vec(const std::array<int64_t, 4>& a) { return {a.begin(), a.end()}; }

inline fe::DataType_t io_type(DType t) {
  return t == DType::kF16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

inline TensorPtr input(fe::graph::Graph& g, const char* name, int64_t uid, const cp::Layout& l) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(vec(l.dim)).set_stride(vec(l.stride)));
}

inline void as_output(const TensorPtr& t, int64_t uid, const cp::Layout& l) {
  t->set_output(true).set_uid(uid).set_dim(vec(l.dim)).set_stride(vec(l.stride));
}

// Causal and window masks: cuDNN's diagonal band, bottom-right aligned (cudnn_plan.h, Band).
// With Sq == Sk the two alignments are the same mask, and top-left is the one PyTorch asks for:
// on the first GPU run (H200) our bottom-right causal fwd+bwd took 4.64 ms where PyTorch's cuDNN
// causal took 1.93 ms (the forward was on par), so the square case takes the common path.
template <class Attributes>
void set_band(Attributes& a, const cp::PlanKey& k) {
  if (k.left < 0 && k.right < 0) return;
  a.set_diagonal_alignment(k.Sq == k.Sk ? fe::DiagonalAlignment_t::TOP_LEFT : fe::DiagonalAlignment_t::BOTTOM_RIGHT);
  if (k.left >= 0) a.set_diagonal_band_left_bound(static_cast<int>(k.left));
  if (k.right >= 0) a.set_diagonal_band_right_bound(static_cast<int>(k.right));
}

// sm_version > 0 (e.g. 90): the target architecture, for building without a device (the test);
// 0: the frontend asks the current device.
inline std::shared_ptr<fe::graph::Graph> new_graph(const cp::PlanKey& k, int sm_version) {
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm_version > 0) g->set_sm_version(sm_version);
  g->set_io_data_type(io_type(k.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

inline std::shared_ptr<fe::graph::Graph> forward_graph(const cp::PlanKey& k, int sm_version = 0) {
  auto g = new_graph(k, sm_version);
  const auto q = input(*g, "Q", kQ, cp::bshd(k.B, k.Sq, k.Hq, k.D));
  const auto kk = input(*g, "K", kK, cp::bshd(k.B, k.Sk, k.Hkv, k.D));
  const auto v = input(*g, "V", kV, cp::bshd(k.B, k.Sk, k.Hkv, k.Dv));
  fe::graph::SDPA_attributes a;
  a.set_name("tessera_sdpa").set_generate_stats(true).set_attn_scale(k.scale());
  set_band(a, k);
  auto [o, stats] = g->sdpa(q, kk, v, a);
  as_output(o, kO, cp::bshd(k.B, k.Sq, k.Hq, k.Dv));
  as_output(stats, kStats, cp::stats(k.B, k.Hq, k.Sq));
  stats->set_data_type(fe::DataType_t::FLOAT);
  return g;
}

inline std::shared_ptr<fe::graph::Graph> backward_graph(const cp::PlanKey& k, bool deterministic,
                                                        int sm_version = 0) {
  auto g = new_graph(k, sm_version);
  const auto q = input(*g, "Q", kQ, cp::bshd(k.B, k.Sq, k.Hq, k.D));
  const auto kk = input(*g, "K", kK, cp::bshd(k.B, k.Sk, k.Hkv, k.D));
  const auto v = input(*g, "V", kV, cp::bshd(k.B, k.Sk, k.Hkv, k.Dv));
  const auto o = input(*g, "O", kO, cp::bshd(k.B, k.Sq, k.Hq, k.Dv));
  const auto d_o = input(*g, "dO", kDO, cp::bshd(k.B, k.Sq, k.Hq, k.Dv));
  const auto stats = input(*g, "Stats", kStats, cp::stats(k.B, k.Hq, k.Sq));
  stats->set_data_type(fe::DataType_t::FLOAT);
  fe::graph::SDPA_backward_attributes a;
  a.set_name("tessera_sdpa_backward").set_attn_scale(k.scale()).set_deterministic_algorithm(deterministic);
  set_band(a, k);
  auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, d_o, stats, a);
  as_output(dq, kDQ, cp::bshd(k.B, k.Sq, k.Hq, k.D));
  as_output(dk, kDK, cp::bshd(k.B, k.Sk, k.Hkv, k.D));
  as_output(dv, kDV, cp::bshd(k.B, k.Sk, k.Hkv, k.Dv));
  return g;
}

}  // namespace tessera::attention::cudnn_graphs
