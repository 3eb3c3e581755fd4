#include "tune/device_kind.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/device_module.h"

namespace tessera::tune {
namespace {

// "key<spaces/tabs>: value" -> value (cleaned) when the line's key is exactly `key`.
std::optional<std::string> field(const std::string& line, const char* key) {
  const auto colon = line.find(':');
  if (colon == std::string::npos) return std::nullopt;
  std::string k = line.substr(0, colon);
  while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
  if (k != key) return std::nullopt;
  return clean_device_name(line.substr(colon + 1));
}

int to_int(const std::string& s) {
  if (s.empty()) return -1;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 0);  // ARM's "CPU part : 0xd0c" is hex
  return end && *end == '\0' && v >= 0 && v <= 0xffffff ? static_cast<int>(v) : -1;
}

std::string amd_microarch(int family, int model) {
  if (family == 0x17) return model < 0x30 ? "zen" : "zen2";
  if (family == 0x19) {
    if ((model >= 0x10 && model <= 0x1f) || (model >= 0x60 && model <= 0x7f) || (model >= 0xa0 && model <= 0xaf))
      return "zen4";
    if (model <= 0x5f) return "zen3";
  }
  if (family == 0x1a && (model <= 0x4f || (model >= 0x60 && model <= 0x7f))) return "zen5";
  return {};
}

std::string intel_microarch(int family, int model) {
  if (family != 6) return {};
  struct M { int model; const char* name; };
  static const M kModels[] = {
      {0x3c, "hsw"}, {0x3f, "hsw"}, {0x45, "hsw"}, {0x46, "hsw"}, {0x3d, "bdw"}, {0x47, "bdw"},
      {0x4f, "bdw"}, {0x56, "bdw"}, {0x4e, "skl"}, {0x5e, "skl"}, {0x8e, "skl"}, {0x9e, "skl"},
      {0xa5, "skl"}, {0xa6, "skl"}, {0x55, "skx"}, {0x7d, "icl"}, {0x7e, "icl"}, {0x6a, "icx"},
      {0x6c, "icx"}, {0x8c, "tgl"}, {0x8d, "tgl"}, {0x97, "adl"}, {0x9a, "adl"}, {0xb7, "rpl"},
      {0xba, "rpl"}, {0xbf, "rpl"}, {0xaa, "mtl"}, {0xac, "mtl"}, {0x8f, "spr"}, {0xcf, "emr"},
      {0xad, "gnr"}, {0xae, "gnr"}};
  for (const M& m : kModels)
    if (m.model == model) return m.name;
  return {};
}

}  // namespace

CpuInfo parse_cpuinfo(const std::string& text) {
  CpuInfo c;
  std::istringstream in(text);
  std::string line, arm_part;
  while (std::getline(in, line)) {
    if (line.empty() && !c.model_name.empty()) break;  // first processor only
    if (auto v = field(line, "vendor_id"); v && c.vendor.empty()) c.vendor = *v;
    if (auto v = field(line, "CPU implementer"); v && c.vendor.empty()) c.vendor = *v;
    for (const char* key : {"model name", "Model", "Hardware"})
      if (auto v = field(line, key); v && !v->empty() && c.model_name.empty()) c.model_name = *v;
    if (auto v = field(line, "cpu family"); v && c.family < 0) c.family = to_int(*v);
    if (auto v = field(line, "model"); v && c.model < 0) c.model = to_int(*v);
    if (auto v = field(line, "CPU part"); v && c.model < 0) c.model = to_int(*v);
    if (auto v = field(line, "stepping"); v && c.stepping < 0) c.stepping = to_int(*v);
    if (auto v = field(line, "CPU variant"); v && c.stepping < 0) c.stepping = to_int(*v);
  }
  return c;
}

const CpuInfo& cpu_info() {
  static const CpuInfo info = [] {
    std::ifstream in("/proc/cpuinfo");
    std::ostringstream text;
    text << in.rdbuf();
    return parse_cpuinfo(text.str());
  }();
  return info;
}

std::string cpu_microarch(const CpuInfo& c) {
  std::string name;
  if (c.vendor == "AuthenticAMD" || c.vendor == "HygonGenuine") name = amd_microarch(c.family, c.model);
  else if (c.vendor == "GenuineIntel") name = intel_microarch(c.family, c.model);
  if (!name.empty()) return name;
  if (c.family >= 0 && c.model >= 0) return "f" + std::to_string(c.family) + "m" + std::to_string(c.model);
  if (!c.vendor.empty() && c.model >= 0) {  // ARM: implementer and part, as cpuinfo spells them (hex)
    char buf[48];
    std::snprintf(buf, sizeof buf, "arm%sp%x", c.vendor.c_str(), static_cast<unsigned>(c.model));
    return clean_device_name(buf);
  }
  return "unknown";
}

std::string cpu_isa_level() {
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

std::string make_cpu_device_kind(const CpuInfo& c, unsigned threads, const std::string& isa) {
  const std::string model = c.model_name.empty() ? "unknown" : c.model_name;
  return "cpu:" + model + ":" + cpu_microarch(c) + ":" + std::to_string(std::max(1u, threads)) + "c:" + isa;
}

std::string cpu_device_kind() {
  static const std::string kind =
      make_cpu_device_kind(cpu_info(), std::thread::hardware_concurrency(), cpu_isa_level());
  return kind;
}

std::optional<std::string> legacy_cpu_device_kind(const std::string& kind) {
  // "cpu:<model>:<microarch>:<N>c:<isa>", parsed from the right (a model name may hold ':').
  if (kind.rfind("cpu:", 0) != 0) return std::nullopt;
  const auto isa_colon = kind.rfind(':');
  if (isa_colon == std::string::npos || isa_colon < 4) return std::nullopt;
  const auto threads_colon = kind.rfind(':', isa_colon - 1);
  if (threads_colon == std::string::npos || threads_colon < 4) return std::nullopt;
  const auto arch_colon = kind.rfind(':', threads_colon - 1);
  if (arch_colon == std::string::npos || arch_colon < 4) return std::nullopt;  // already legacy
  const std::string isa = kind.substr(isa_colon + 1);
  const std::string threads = kind.substr(threads_colon + 1, isa_colon - threads_colon - 1);
  if (isa == "avx512" || threads.size() < 2 || threads.back() != 'c') return std::nullopt;
  return kind.substr(0, arch_colon) + kind.substr(threads_colon);
}

}  // namespace tessera::tune
