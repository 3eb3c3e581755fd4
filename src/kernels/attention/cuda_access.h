// attention: the pointer checks every CUDA implementation (`cuda`, `cudnn`) makes before a
// launch: each input and output must be reachable from the problem's device (null, an empty
// array, passes). `who` prefixes the message: "attention (cuda)".
#pragma once

#include <string>
#include <utility>

#include "core/cuda_util.h"
#include "kernels/attention/impl.h"

namespace tessera::attention::cuda_access {

using Named = std::pair<const void*, const char*>;

inline void require_all(std::initializer_list<Named> ptrs, int device, const std::string& who) {
  for (const auto& [ptr, what] : ptrs) cuda::require_accessible(ptr, device, who, what);
}

inline void inputs(const Problem& p, const std::string& who) {
  require_all({{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {p.alibi, "alibi_slopes"}, {p.seg_q, "segment_ids_q"},
               {p.seg_k, "segment_ids_k"}, {p.dropout_seed, "dropout_seed"}, {p.bias, "bias"}},
              p.device.index, who);
}

inline void forward(const Problem& p, const ForwardOut& out, const std::string& who) {
  inputs(p, who);
  require_all({{out.o, "o"}, {out.lse, "lse"}}, p.device.index, who);
}

inline void backward(const Problem& p, const BackwardIn& in, const GradOut& out, const std::string& who) {
  inputs(p, who);
  require_all({{in.o, "o (backward input)"}, {in.lse, "lse (backward input)"}, {in.grad_o, "grad_o"},
               {out.dq, "dq"}, {out.dk, "dk"}, {out.dv, "dv"}, {out.dbias, "dbias"}},
              p.device.index, who);
}

}  // namespace tessera::attention::cuda_access
