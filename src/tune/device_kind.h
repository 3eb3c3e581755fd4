// Tessera internal (tuning): "device kind", a short stable string naming a machine class, so
// that a tuned result measured on one machine is only trusted on the same kind of machine.
#pragma once

#include <string>

#include "tessera/tensor.h"

namespace tessera::tune {

// CPU: "cpu:<model name>:<N>c:<isa>", e.g. "cpu:AMD EPYC:2c:avx2". N = hardware threads
// available to this process (timings scale with it); isa = the widest SIMD level the CPU and
// OS support (avx512, avx2, sse4, neon, sve, or the architecture name). Cached after the first
// call. Backends for other devices provide their own (e.g. "cuda:NVIDIA H100 80GB HBM3").
std::string cpu_device_kind();
// The default device kind of an implementation running on `type`: cpu_device_kind() for the
// CPU, "cuda:unknown" otherwise (a CUDA backend overrides it with the GPU's name).
std::string default_device_kind(DeviceType type);

// Makes `s` safe in a one-line identifier: control characters and '"' / '\\' become '_',
// runs of spaces collapse to one, leading/trailing spaces are dropped.
std::string clean_device_name(const std::string& s);

}  // namespace tessera::tune
