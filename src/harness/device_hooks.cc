#include "harness/device_hooks.h"

#include <mutex>

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
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = table().find(type);
  return it == table().end() ? nullptr : &it->second;
}

}  // namespace tessera::harness
