// Tessera internal: what paged_attention's CUDA backends (cuda.cu, cuda_v2.cu) check of a call
// before launching: every tensor in device memory of the call's device, and a stream that is not
// being captured (the index arrays go to the device through a staged copy, which a graph would
// replay with stale ids). Host code of the CUDA module.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "core/cuda_util.h"
#include "kernels/paged_attention/impl.h"
#include "tessera/error.h"

namespace tessera::paged_attention {

// `who` names the backend in the errors ("paged_attention (cuda_v2)"); `index_copy` says why a
// captured stream is refused.
inline void require_launchable(const Problem& p, const std::string& who, const char* index_copy) {
  const int dev = p.device.index;
  for (const auto& [ptr, what] : {std::pair<const void*, const char*>{p.q, "q"}, {p.k, "k_cache"}, {p.v, "v_cache"},
                                  {p.o, "o"}, {p.lse, "lse"}})
    cuda::require_accessible(ptr, dev, who, what);
  if (p.sinks) cuda::require_accessible(p.sinks, dev, who, "sinks");
  if (const std::string why = cuda::capture_refusal(static_cast<cudaStream_t>(p.stream), index_copy); !why.empty())
    throw Error(ErrorCode::kUnsupported, who + ": " + why);
}

}  // namespace tessera::paged_attention
