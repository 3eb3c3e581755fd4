// Tessera primitives: where every CUDA implementation's available() starts — a usable CUDA
// device, or the reason there is none (no driver, no device). Compiled into the CUDA module only.
#pragma once

#include <memory>
#include <string>

#include "core/cuda_util.h"
#include "dispatch/dispatch.h"
#include "tessera/tensor.h"

namespace tessera::primitives {

inline dispatch::Availability cuda_available() {
  std::string why;
  if (cuda::device_count(&why) == 0) return dispatch::Availability::no(why);
  return dispatch::Availability::yes();
}

// What every cuda backend's class says the same way: its device and when it is available. A kernel
// derives `class Cuda final : public primitives::CudaBackend<Implementation>`.
template <class Base>
class CudaBackend : public Base {
 public:
  DeviceType device_type() const override { return DeviceType::kCUDA; }
  dispatch::Availability available() const override { return cuda_available(); }
};

// A kernel's cuda implementation `Impl`, made after the module's allocator and device hooks are
// registered (every cuda backend's make_cuda_implementation; the call also keeps
// cuda_device_hooks.cu, whose registration runs at load time, linked into the module).
template <class Impl>
std::unique_ptr<Impl> make_cuda() {
  cuda::register_allocator();
  cuda::register_device_hooks();
  return std::make_unique<Impl>();
}

}  // namespace tessera::primitives
