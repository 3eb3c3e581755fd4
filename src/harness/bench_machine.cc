// How a result was made: the machine, the SIMD target, the BLAS and the TESSERA_* settings of
// this process, for the bench's JSON document and rows (bench.h).
#include <unistd.h>

#include <cstring>

#include "core/build_info.h"
#include "harness/bench.h"
#include "harness/blas.h"
#include "harness/process.h"
#include "tune/device_kind.h"

extern char** environ;

namespace tessera::harness {

std::map<std::string, std::string> tessera_env() {
  std::map<std::string, std::string> out;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "TESSERA_", 8) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    if (eq) out.emplace(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
  }
  return out;
}

std::string tessera_env_line() {
  std::string out;
  for (const auto& [k, v] : tessera_env()) out += (out.empty() ? "" : " ") + k + "=" + v;
  return out;
}

nlohmann::json machine_json() {
  const tune::CpuInfo& c = tune::cpu_info();
  const auto simd = build_info::simd_targets();
  nlohmann::json j = {{"cpu", cpu_model()},
                      {"vendor", c.vendor},
                      {"family", c.family},
                      {"model", c.model},
                      {"stepping", c.stepping},
                      {"microarch", tune::cpu_microarch(c)},
                      {"device_kind", tune::cpu_device_kind()},
                      {"isa", tune::cpu_isa_level()},
                      {"highway_target", simd.built ? simd.dispatched : "none (no CPU backend)"},
                      {"hardware_threads", hardware_threads()},
                      {"cpu_features", cpu_features()},
                      {"blas", blas::available() ? blas::name() : "none"},
                      {"blas_core", blas::core_name()},
                      {"tessera_env", tessera_env()}};
  return j;
}

}  // namespace tessera::harness
