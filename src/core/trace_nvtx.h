// Tessera internal, CUDA module only: NVTX ranges around the phases of the CUDA backends.
//
//   TESSERA_NVTX_RANGE("lce.cuda.chunk");
//
// A push/pop pair in the "tessera" NVTX domain (nvtx3, header-only, from the CUDA toolkit).
// Nsight Systems (nsys profile --trace=cuda,nvtx) shows each range on the host thread with the
// kernels it launched; with no tool attached NVTX calls are a no-op function pointer. The host
// CPU backends record into the Chrome trace instead (core/trace.h). Only the CUDA module
// includes this header: libtessera itself never links or includes NVTX.
#pragma once

#include <nvtx3/nvToolsExt.h>

namespace tessera::nvtx {

inline nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("tessera");
  return d;
}

class Range {
 public:
  explicit Range(const char* name) noexcept {
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    nvtxDomainRangePushEx(domain(), &a);
  }
  ~Range() { nvtxDomainRangePop(domain()); }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;
};

}  // namespace tessera::nvtx

#define TESSERA_NVTX_CONCAT2(a, b) a##b
#define TESSERA_NVTX_CONCAT(a, b) TESSERA_NVTX_CONCAT2(a, b)
#define TESSERA_NVTX_RANGE(name) ::tessera::nvtx::Range TESSERA_NVTX_CONCAT(tessera_nvtx_range_, __COUNTER__)(name)
