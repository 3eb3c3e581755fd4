#include "harness/device_hooks.h"

#include <mutex>

#include "core/device_module.h"

namespace tessera::harness {
namespace {
std::mutex g_mu;
std::map<DeviceType, DeviceHooks>& table() {
  static std::map<DeviceType, DeviceHooks> t;
  return t;
}
}  // namespace

void register_device_hooks(DeviceType type, DeviceHooks hooks) {
  std::lock_guard<std::mutex> lock(g_mu);
  table()[type] = std::move(hooks);
}

const DeviceHooks* device_hooks(DeviceType type) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (table().count(type)) return &table()[type];
  }
  // First use of this device type's hooks: load its backend module (which registers them).
  if (type != DeviceType::kCPU) (void)device_module::load(type);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = table().find(type);
  return it == table().end() ? nullptr : &it->second;
}

}  // namespace tessera::harness
