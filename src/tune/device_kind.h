// Tessera internal (tuning): "device kind", a short stable string naming a machine class, so
// that a tuned result measured on one machine is only trusted on the same kind of machine.
#pragma once

#include <optional>
#include <string>

#include "tessera/tensor.h"

namespace tessera::tune {

// The /proc/cpuinfo fields a CPU device kind is made of (first processor only).
struct CpuInfo {
  std::string vendor;      // "AuthenticAMD", "GenuineIntel", "" (ARM: "CPU implementer" hex)
  std::string model_name;  // "AMD EPYC" ("model name"; some ARM kernels: "Model" / "Hardware")
  int family = -1;         // "cpu family" (x86); -1 when absent
  int model = -1;          // "model" (x86) or "CPU part" (ARM, hex); -1 when absent
  int stepping = -1;       // "stepping"; -1 when absent
};
// Parses cpuinfo text (what /proc/cpuinfo holds); missing fields stay at their defaults.
CpuInfo parse_cpuinfo(const std::string& text);
// This machine's, read once from /proc/cpuinfo.
const CpuInfo& cpu_info();

// The microarchitecture of `c`, named where vector throughput differs between generations:
// AMD zen/zen2/zen3/zen4/zen5, Intel hsw/bdw/skl/skx/icl/icx/tgl/adl/spr/emr/gnr/rpl/mtl;
// anything else "f<family>m<model>" (decimal, x86), "arm<implementer>p<part>" (hex, ARM), or
// "unknown" when cpuinfo has neither.
std::string cpu_microarch(const CpuInfo& c);

// CPU: "cpu:<model name>:<microarch>:<N>c:<isa>", e.g. "cpu:AMD EPYC:zen4:2c:avx512".
// N = hardware threads available to this process (timings scale with it); isa = the widest
// SIMD level the CPU and OS support (avx512, avx2, sse4, neon, sve, or the architecture name).
// The microarch is there because one model name and ISA can hide a 2x difference (a Zen 4
// runs 512-bit FMAs at the 256-bit rate, a Zen 5 at twice that). Cached after the first call.
std::string cpu_device_kind();
// The same from given parts (tests; cpu_device_kind() is this for this machine).
std::string make_cpu_device_kind(const CpuInfo& c, unsigned threads, const std::string& isa);
// The widest SIMD level of this CPU ("avx512", "avx2", ...).
std::string cpu_isa_level();

// The tuned-table key a row written before the microarch was part of the key
// ("cpu:<model>:<N>c:<isa>", before 2026-11-25) would have had on the machine of `kind`, when
// such a row may be used there: only below avx512 (256-bit and narrower FMAs run at the same
// per-cycle rate on every x86 core this library targets, so the microarch does not change the
// ranking much); nullopt for avx512 (where it does: Zen 4 vs Zen 5) and for non-CPU kinds.
// See docs/TUNING.md, "Device kind".
std::optional<std::string> legacy_cpu_device_kind(const std::string& kind);

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
