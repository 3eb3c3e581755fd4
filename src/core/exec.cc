// Tessera core: the shared execution vocabulary (tessera/exec.h).
#include "tessera/exec.h"

#include <algorithm>
#include <thread>

#include "core/env.h"
#include "tessera/error.h"

namespace tessera {

const char* pass_name(Pass p) noexcept {
  switch (p) {
    case Pass::kForward: return "forward";
    case Pass::kBackward: return "backward";
    case Pass::kFused: return "fused";
  }
  return "?";
}

Pass parse_pass(const std::string& s) {
  if (s == "forward" || s == "fwd") return Pass::kForward;
  if (s == "backward" || s == "bwd") return Pass::kBackward;
  if (s == "fused" || s == "forward_backward") return Pass::kFused;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown pass '" + s + "' (expected forward, backward or fused)");
}

const char* version_status_name(VersionStatus s) noexcept {
  switch (s) {
    case VersionStatus::kCurrent: return "current";
    case VersionStatus::kExperimental: return "experimental";
    case VersionStatus::kRetired: return "retired";
  }
  return "?";
}

int resolve_num_threads(int requested) noexcept {
  if (requested > 0) return requested;
  const int env_threads = env::integer("TESSERA_NUM_THREADS", 0);
  if (env_threads > 0) return env_threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace tessera
