// Tessera core: the shared execution vocabulary (tessera/exec.h).
#include "tessera/exec.h"

#include <algorithm>
#include <cmath>
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

// At most this many threads: a CPU backend keeps per-thread state (mla_decode's split-KV work
// lists), and 2^31 - 1 threads once asked for 9 GB for a 2-key problem.
constexpr int kMaxThreads = 1024;

// The machine's threads, read once: glibc's hardware_concurrency() opens and reads
// /sys/devices/system/cpu/online on every call (~13 µs here, twice per kernel call: a third of a
// tiny linear_cross_entropy forward). CPUs brought online later are not seen (as OpenMP's count).
namespace {
int machine_threads() noexcept {
  static const int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return n;
}
}  // namespace

int resolve_num_threads(int requested) noexcept {
  if (requested > 0) return std::min(requested, kMaxThreads);
  const int env_threads = env::integer("TESSERA_NUM_THREADS", 0);
  if (env_threads > 0) return std::min(env_threads, kMaxThreads);
  return std::min(kMaxThreads, machine_threads());
}

int resolve_num_threads(int requested, double work) noexcept {
  if (requested > 0 || env::integer("TESSERA_NUM_THREADS", 0) > 0) return resolve_num_threads(requested);
  const int machine = resolve_num_threads(0);
  if (!(work >= kMinWorkPerThread)) return 1;  // NaN too
  const double by_work = std::floor(work / kMinWorkPerThread);
  return by_work >= machine ? machine : static_cast<int>(by_work);
}

}  // namespace tessera
