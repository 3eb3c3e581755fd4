// Built when TESSERA_CPU_BACKEND is OFF (e.g. the GPU preset): no host BLAS is linked, so the
// BLAS ceilings and baselines are unavailable, with this reason.
#include "harness/blas.h"

#include "tessera/error.h"

namespace tessera::harness::blas {
namespace {
const char* kWhy =
    "no host BLAS in this build (configured with -DTESSERA_CPU_BACKEND=OFF); rebuild with "
    "TESSERA_CPU_BACKEND=ON for BLAS ceilings and GEMM baselines";
}

bool available() { return false; }
std::string unavailable_reason() { return kWhy; }
std::string name() { return "none"; }
std::string core_name() { return {}; }
int threads() { return 1; }
void set_threads(int) {}
void sgemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
           int64_t, float, float*, int64_t) {
  throw Error(ErrorCode::kUnsupported, kWhy);
}
bool has_sbgemm() { return false; }
void sbgemm(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t,
            const uint16_t*, int64_t, float, float*, int64_t) {
  throw Error(ErrorCode::kUnsupported, kWhy);
}

}  // namespace tessera::harness::blas
