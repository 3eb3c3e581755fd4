#include "tune/device_kind.h"

#include <algorithm>
#include <fstream>
#include <thread>

namespace tessera::tune {
namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    // x86: "model name : AMD EPYC"; some ARM kernels: "Model : ..." or "CPU part".
    for (const char* key : {"model name", "Model", "Hardware"}) {
      if (line.rfind(key, 0) == 0) {
        const auto colon = line.find(':');
        if (colon != std::string::npos) {
          std::string v = clean_device_name(line.substr(colon + 1));
          if (!v.empty()) return v;
        }
      }
    }
  }
  return "unknown";
}

std::string isa_level() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return "avx512";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
  if (__builtin_cpu_supports("sse4.2")) return "sse4";
  return "x86";
#elif defined(__aarch64__)
#if defined(__ARM_FEATURE_SVE)
  return "sve";
#else
  return "neon";
#endif
#else
  return "generic";
#endif
}

}  // namespace

std::string clean_device_name(const std::string& s) {
  std::string out;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    char d = c == '\t' ? ' ' : (u < 0x20 || u == 0x7f || c == '"' || c == '\\') ? '_' : c;
    if (d == ' ' && (out.empty() || out.back() == ' ')) continue;
    out += d;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::string default_device_kind(DeviceType type) {
  return type == DeviceType::kCPU ? cpu_device_kind() : "cuda:unknown";
}

std::string cpu_device_kind() {
  static const std::string kind = [] {
    const unsigned n = std::max(1u, std::thread::hardware_concurrency());
    return "cpu:" + cpu_model_name() + ":" + std::to_string(n) + "c:" + isa_level();
  }();
  return kind;
}

}  // namespace tessera::tune
