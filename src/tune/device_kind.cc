#include "tune/device_kind.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "core/device_module.h"

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

namespace {

std::mutex& namers_mu() {
  static std::mutex mu;
  return mu;
}
std::map<DeviceType, DeviceKindFn>& namers() {
  static std::map<DeviceType, DeviceKindFn> m;
  return m;
}

DeviceKindFn namer_of(DeviceType type) {
  std::lock_guard<std::mutex> lock(namers_mu());
  const auto it = namers().find(type);
  return it == namers().end() ? nullptr : it->second;
}

}  // namespace

DeviceKindFn register_device_kind(DeviceType type, DeviceKindFn fn) {
  std::lock_guard<std::mutex> lock(namers_mu());
  const auto it = namers().find(type);
  const DeviceKindFn before = it == namers().end() ? nullptr : it->second;
  if (fn)
    namers()[type] = fn;
  else
    namers().erase(type);
  return before;
}

std::string gpu_device_kind(const std::string& prefix, const std::string& name, int multiprocessors) {
  std::string n = clean_device_name(name);
  for (char& c : n)
    if (c == ':') c = '_';  // ':' separates the fields
  return prefix + ":" + (n.empty() ? "unknown" : n) + ":" + std::to_string(multiprocessors) + "sm";
}

std::string default_device_kind(DeviceType type, int index) {
  if (type == DeviceType::kCPU) return cpu_device_kind();
  const std::string dev = Device{type, 0}.str();  // "cuda:0"
  const std::string unknown = dev.substr(0, dev.find(':')) + ":unknown";
  DeviceKindFn fn = namer_of(type);
  if (!fn && device_module::load(type).loaded) fn = namer_of(type);
  if (!fn) return unknown;
  try {
    const std::string k = fn(index);
    return k.empty() ? unknown : k;
  } catch (...) {
    return unknown;
  }
}

std::string cpu_device_kind() {
  static const std::string kind = [] {
    const unsigned n = std::max(1u, std::thread::hardware_concurrency());
    return "cpu:" + cpu_model_name() + ":" + std::to_string(n) + "c:" + isa_level();
  }();
  return kind;
}

}  // namespace tessera::tune
