// The CUDA device module's entry point (libtessera_cuda.so; core/device_module.h loads it on
// first use of a CUDA device). Registers the DeviceAllocator for DeviceType::kCUDA, the
// harness's DeviceHooks, the tuner's device kind of a GPU (tune/device_kind.h), and what every
// .cu file of the module added with TESSERA_CUDA_MODULE_REGISTRATION (each kernel's cuda
// implementations).
#include "core/cuda_module.h"

#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda_util.h"
#include "core/device_module.h"
#include "tune/device_kind.h"

namespace tessera::cuda_module {
namespace {
std::vector<RegisterFn>& registrations() {
  static std::vector<RegisterFn> r;
  return r;
}
}  // namespace

bool add_registration(RegisterFn fn) {
  registrations().push_back(fn);
  return true;
}

}  // namespace tessera::cuda_module

// Returns nullptr on success, else why not (valid for the life of the process). Idempotent.
extern "C" __attribute__((visibility("default"))) const char* tessera_cuda_module_init(int abi_version,
                                                                                      const char* library_version) {
  using namespace tessera;
  static std::once_flag once;
  static std::string error;
  if (abi_version != device_module::kAbiVersion)
    return "it was built for another module ABI than this libtessera's";
  if (!library_version || std::strcmp(library_version, TESSERA_VERSION) != 0)
    return "it was built for Tessera " TESSERA_VERSION ", not for this libtessera";
  std::call_once(once, [] {
    try {
      cuda::register_allocator();
      cuda::register_device_hooks();
      tune::register_device_kind(DeviceType::kCUDA, cuda::device_kind);
      for (auto fn : cuda_module::registrations()) fn();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  return error.empty() ? nullptr : error.c_str();
}
