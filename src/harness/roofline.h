// Tessera harness: this machine's measured ceilings (generic) and the roofline bound.
//
// `tessera roofline` measures them and stores them as JSON (schema "tessera-roofline/1"):
//   default path  $TESSERA_ROOFLINE, else $XDG_CACHE_HOME/tessera/roofline.json, else
//                 ~/.cache/tessera/roofline.json
// CPU: peak GEMM rate per dtype through the linked BLAS (sgemm for f32; sbgemm for bf16 only
// when the BLAS exports it, otherwise bf16 has no BLAS ceiling and f32's is used, with a note),
// memory bandwidth of a large multithreaded copy counting read + write bytes. A GPU's ceilings
// come from its backend's DeviceHooks::measure_ceilings (device_hooks.h) when one is built.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tessera/dtype.h"
#include "tessera/tensor.h"

namespace tessera::harness {

struct DeviceCeilings {
  std::string device;  // "cpu", "cuda:0"
  std::string name;    // "AMD EPYC (2 threads, avx2 fma)"
  std::map<std::string, double> gemm_gflops;       // dtype name -> GFLOP/s (measured only)
  std::map<std::string, std::string> gemm_method;  // dtype name -> how / why not
  double bandwidth_gbs = 0;                        // GB/s = 1e9 bytes/s, read + write
  std::string bandwidth_method;
  std::vector<std::string> notes;

  // Peak GEMM GFLOP/s for `dtype`: its own measurement, else f32's (note set to say so),
  // else 0. Integer dtypes fall back to f32 too.
  double peak_gflops(const std::string& dtype, std::string* note = nullptr) const;
  // Roofline bound at arithmetic intensity `ai` (flop/byte): min(peak, ai · bandwidth).
  double attainable_gflops(double ai, const std::string& dtype) const;
};

struct Roofline {
  std::string measured_at;  // UTC timestamp
  std::string tessera_version;
  bool quick = false;       // measured with the quick (rougher) settings
  std::vector<DeviceCeilings> devices;

  const DeviceCeilings* find(const std::string& device) const;  // "cpu", "cuda:0"
};

void to_json(nlohmann::json& j, const DeviceCeilings& d);
void from_json(const nlohmann::json& j, DeviceCeilings& d);
void to_json(nlohmann::json& j, const Roofline& r);
void from_json(const nlohmann::json& j, Roofline& r);

// The default store path (see above); "" when neither HOME nor XDG_CACHE_HOME is set.
std::string default_roofline_path();
// Reads a stored roofline; nullopt when the file does not exist. Throws Error(kIo) when it
// exists but cannot be parsed (a corrupt file is reported, never silently trusted).
std::optional<Roofline> load_roofline(const std::string& path);
// The parser behind load_roofline: `text` is the file's content, `path` names it in messages.
// Throws Error(kIo) for anything that is not a valid roofline document.
Roofline parse_roofline(const std::string& text, const std::string& path);
// Writes atomically (temp file + rename), creating parent directories. Throws Error(kIo).
void save_roofline(const Roofline& r, const std::string& path);

struct RooflineOptions {
  bool quick = false;          // smaller GEMMs / copies, fewer repeats (~1-2 s on 2 cores)
  bool cpu = true;
  bool gpu = true;             // through the registered DeviceHooks, if any
  int threads = 0;             // CPU threads for BLAS and copy; 0 = all
  size_t copy_bytes = 0;       // 0 = default (256 MiB, quick 64 MiB)
  bool progress = true;        // lines on stderr for steps past the first second
};

// Measures the ceilings of this machine.
Roofline measure_roofline(const RooflineOptions& opt = {});
// Individual CPU measurements (exposed for tests and the bench's on-the-fly path).
double measure_cpu_copy_gbs(size_t bytes, int threads, int repeats);
std::optional<double> measure_cpu_gemm_gflops(const std::string& dtype, int64_t n, int repeats,
                                              std::string* method);

}  // namespace tessera::harness
