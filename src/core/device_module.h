// Tessera internal: device backends are modules loaded on first use.
//
// A process that never touches a GPU never loads a GPU runtime (DESIGN.md). The core library
// links no device runtime; each device backend (today: CUDA) is a shared module,
// libtessera_cuda.so, that links its runtime (cudart, cuBLAS) and, when loaded, registers what it
// provides through one C entry point, `tessera_cuda_module_init`: the DeviceAllocator, the
// harness DeviceHooks and every kernel's implementations for that device.
//
// load(type) is what triggers it, and is called only on first *use* of the device type:
//   - Tensor::empty / zeros / to() on such a device (the allocator lookup, core.cc), and
//     has_device_allocator(type);
//   - harness::device_hooks(type);
//   - a kernel's listing or dispatch of an implementation that the module provides (the
//     registry holds a placeholder for it, src/dispatch/registry.h, whose available() loads).
// It runs once per device type and process (thread-safe; later calls return the recorded
// status) and never throws: when the module cannot be loaded, the status says why, and the
// callers report that reason (the placeholder's "unavailable" reason, the allocator's
// kUnsupported error). Before loading the runtime it checks cheaply that a driver is there
// (a device node such as /dev/nvidiactl and the driver library libcuda.so.1), so a machine
// without a GPU never maps cudart or cuBLAS.
//
// Where the module is looked for, first match wins:
//   1. $TESSERA_CUDA_MODULE: an explicit path to the module file;
//   2. the directory of libtessera.so (build tree: <build>/lib; install tree: <prefix>/lib);
//   3. the directory of the executable and ../lib next to it.
// TESSERA_CUDA_MODULE_FORCE=1 skips the driver check (tests of the module's own no-device
// paths, diagnostics): the module is then loaded even without a driver.
#pragma once

#include <string>

#include "tessera/tensor.h"

namespace tessera::device_module {

// Bumped whenever what crosses the module boundary changes incompatibly; the module refuses to
// initialize for another value (and for another library version: modules and libtessera come
// from the same build).
inline constexpr int kAbiVersion = 2;  // 2: DeviceAllocator::synchronize, device_of (2026-11-28)

struct Status {
  bool loaded = false;   // the module is loaded and initialized: its registrations are in place
  std::string path;      // the module file that was (or would have been) loaded
  std::string reason;    // why not, when !loaded (one line, starts with what is missing)
};

// Loads the module of `type` once (thread-safe, never throws) and returns what happened.
// kCPU needs no module: always loaded.
const Status& load(DeviceType type);

// Whether load(type) has been attempted in this process, without attempting it.
bool attempted(DeviceType type);

// The file name of the module of `type` ("libtessera_cuda.so"); empty for kCPU.
std::string module_file_name(DeviceType type);

}  // namespace tessera::device_module
