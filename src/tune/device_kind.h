// Tessera internal (tuning): "device kind", a short stable string naming a machine class, so
// that a tuned result measured on one machine is only trusted on the same kind of machine.
#pragma once

#include <string>

#include "tessera/tensor.h"

namespace tessera::tune {

// CPU: "cpu:<model name>:<N>c:<isa>", e.g. "cpu:AMD EPYC:2c:avx2". N = hardware threads
// available to this process (timings scale with it); isa = the widest SIMD level the CPU and
// OS support (avx512, avx2, sse4, neon, sve, or the architecture name). Cached after the first
// call. Other devices: default_device_kind below (e.g. "cuda:NVIDIA H100 80GB HBM3:132sm").
std::string cpu_device_kind();
// The default device kind of an implementation running on device `index` of `type`:
// cpu_device_kind() for the CPU; for another device type what its module registered
// (register_device_kind; the CUDA module: gpu_device_kind("cuda", GPU name, SM count), e.g.
// "cuda:NVIDIA H100 80GB HBM3:132sm"), the module being loaded first; "<type>:unknown" when
// nothing is registered (no module, no driver) or the device cannot be queried.
std::string default_device_kind(DeviceType type, int index = 0);

// How a device module names device `index` of its type (may throw; then "<type>:unknown").
using DeviceKindFn = std::string (*)(int index);
// Registers (or, with nullptr, removes) the namer of `type`'s devices and returns the previous
// one. Thread-safe.
DeviceKindFn register_device_kind(DeviceType type, DeviceKindFn fn);

// "<prefix>:<name>:<N>sm": the GPU's name (cleaned) and its number of multiprocessors, which
// tells apart parts sold under one name (a MIG slice, a cut-down SKU) whose timings differ.
std::string gpu_device_kind(const std::string& prefix, const std::string& name, int multiprocessors);

// Makes `s` safe in a one-line identifier: control characters and '"' / '\\' become '_',
// runs of spaces collapse to one, leading/trailing spaces are dropped.
std::string clean_device_name(const std::string& s);

}  // namespace tessera::tune
