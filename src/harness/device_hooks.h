// Tessera harness: hooks a device backend fills so the generic harness can time work on its
// device and measure its ceilings, without the harness knowing the device's API.
//
// The CUDA module (libtessera_cuda.so, src/core/cuda_device_hooks.cu) registers hooks for
// DeviceType::kCUDA when it is loaded, which device_hooks(kCUDA) itself triggers on first call
// (core/device_module.h). Without hooks (no module, no driver), `tessera roofline` reports no GPU
// ceilings and `tessera bench` cannot time implementations on that device (it says so).
// This file is compiled into the core library so backends can register without depending on
// the harness.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/tensor.h"

namespace tessera::harness {

// Ceilings of one device, as a backend measures them.
struct DeviceCeilingsRaw {
  std::string name;                          // "NVIDIA H100 80GB HBM3"
  std::map<std::string, double> gemm_gflops; // per dtype name ("f32", "bf16", "f16")
  std::map<std::string, std::string> gemm_method;  // how each was measured ("cublasGemmEx 8192^3")
  double bandwidth_gbs = 0;                  // device copy, read + write counted
  std::string bandwidth_method;
  std::vector<std::string> notes;            // device facts; why something was not measured
};

struct DeviceHooks {
  // Blocks until all work queued on device `index` (every stream) is finished; throws
  // tessera::Error when the device cannot be synchronized. Required for timing.
  std::function<void(int index)> synchronize;
  // Measures the device's ceilings (peak GEMM per dtype through the vendor BLAS, copy
  // bandwidth). `quick` asks for a fast, rougher measurement. Optional. What cannot be measured
  // (no device, out of memory) is said in the method strings / notes, not thrown.
  std::function<std::optional<DeviceCeilingsRaw>(int index, bool quick)> measure_ceilings;
  // Seconds of one GEMM C[M,N] = A[M,K]·B[K,N] (B transposed when b_transposed) in `dtype` on
  // the device (median of a few runs, buffers allocated and freed by the hook). Optional: the
  // bench's "vs GEMM" column is empty without it.
  std::function<std::optional<double>(int index, int64_t M, int64_t N, int64_t K, DType dtype,
                                      bool b_transposed)>
      time_gemm;
  // Seconds of one call of `fn` on device `index`, measured with device events recorded on the
  // default stream around it (the device is synchronized first and after). Optional: without
  // it the bench times device rows with the host clock after a synchronize.
  std::function<double(int index, const std::function<void()>& fn)> time_call;
  // Number of devices of this type present (0 when none). Optional (then 1 is assumed).
  std::function<int()> device_count;
};

void register_device_hooks(DeviceType type, DeviceHooks hooks);
// nullptr when no backend registered hooks for `type` (after trying to load its module once).
const DeviceHooks* device_hooks(DeviceType type);

}  // namespace tessera::harness
