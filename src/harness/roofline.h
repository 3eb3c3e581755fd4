// Tessera harness: this machine's measured ceilings (generic) and the roofline bound.
//
// `tessera roofline` measures them and stores them as JSON (schema "tessera-roofline/2"; files
// of schema /1, which had only the GEMM lines and a copy bandwidth, are still read):
//   default path  $TESSERA_ROOFLINE, else $XDG_CACHE_HOME/tessera/roofline.json, else
//                 ~/.cache/tessera/roofline.json
// CPU, the physical roof (roofline_peaks.cc): f32 FMA peak (AVX-512 and AVX2 register-resident
// FMA loops on every thread), bf16 dot-product peak (vdpbf16ps, where the CPU has AVX512-BF16),
// and the memory bandwidth of a multithreaded streaming read of a buffer much larger than the
// last-level cache. Beside it, the practical line: the GEMM rate per dtype through the linked
// BLAS (sgemm for f32; sbgemm for bf16 only when the BLAS exports it) and a memcpy bandwidth
// (read + write bytes). A GPU's ceilings come from its backend's DeviceHooks::measure_ceilings
// (device_hooks.h) when one is built: GEMM lines only, which are then also its roof.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tessera/dtype.h"
#include "tessera/tensor.h"

namespace tessera::harness {

// The compute line a dtype is measured against, and which one it is.
struct PeakLine {
  double gflops = 0;  // 0: none known
  std::string line;   // "f32_fma_avx512", "bf16_dot_avx512", "gemm f32" (BLAS), ""
  std::string note;   // why this one (a fallback), "" when it is the dtype's own
};

struct DeviceCeilings {
  std::string device;  // "cpu", "cuda:0"
  std::string name;    // "AMD EPYC (2 threads, avx2 fma)"
  // Physical compute peaks (schema /2, CPU): line name -> GFLOP/s ("f32_fma_avx512",
  // "f32_fma_avx2", "bf16_dot_avx512"; measured only) and line -> how / why not.
  std::map<std::string, double> peak_gflops_by_line;
  std::map<std::string, std::string> peak_method;
  std::map<std::string, double> gemm_gflops;       // dtype name -> GFLOP/s (measured only)
  std::map<std::string, std::string> gemm_method;  // dtype name -> how / why not
  // The memory roof, GB/s = 1e9 bytes/s: schema /2 CPU: a streaming read (read bytes);
  // schema /1 and GPUs: a copy (read + write bytes).
  double bandwidth_gbs = 0;
  std::string bandwidth_method;
  double copy_gbs = 0;  // schema /2 CPU: memcpy, read + write bytes (the practical line); 0 = none
  std::string copy_method;
  std::vector<std::string> notes;

  // The roof's compute line for `dtype`: bf16 -> the bf16 dot-product peak where measured;
  // every other dtype (f32, f16, integers) and bf16 without it -> the best f32 FMA peak. Where
  // no physical peak was measured (a schema /1 file, a GPU) the GEMM line, with a note.
  PeakLine peak_line(const std::string& dtype) const;
  // The practical line: the BLAS GEMM rate for `dtype`, else f32's (note says so), else none.
  PeakLine gemm_line(const std::string& dtype) const;
  // peak_line(dtype).gflops; *note = its note.
  double peak_gflops(const std::string& dtype, std::string* note = nullptr) const;
  // Roofline bound at arithmetic intensity `ai` (flop/byte): min(peak, ai · bandwidth).
  double attainable_gflops(double ai, const std::string& dtype) const;
  // The same against the practical lines: min(GEMM rate, ai · copy bandwidth (else bandwidth)).
  double attainable_gemm_gflops(double ai, const std::string& dtype) const;
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
  bool quick = false;          // smaller GEMMs / buffers, shorter loops (~2-3 s on 2 cores)
  bool cpu = true;
  bool gpu = true;             // through the registered DeviceHooks, if any
  int threads = 0;             // CPU threads for peaks, BLAS and bandwidth; 0 = all
  size_t copy_bytes = 0;       // 0 = default (256 MiB, quick 64 MiB)
  size_t read_bytes = 0;       // 0 = default (max(256 MiB, 8 x LLC); quick max(64 MiB, 4 x LLC))
  bool progress = true;        // lines on stderr for steps past the first second
};

// Measures the ceilings of this machine.
Roofline measure_roofline(const RooflineOptions& opt = {});
// Individual CPU measurements (exposed for tests and the bench's on-the-fly path).
double measure_cpu_copy_gbs(size_t bytes, int threads, int repeats);
std::optional<double> measure_cpu_gemm_gflops(const std::string& dtype, int64_t n, int repeats,
                                              std::string* method);
// Physical peaks (roofline_peaks.cc): the lines this build has loops for on this architecture
// (whether or not this CPU runs them), and one line's rate on `threads` threads, each running
// its loop for about `seconds` (best of 3); nullopt, *method saying why, when the CPU lacks the
// ISA.
std::vector<std::string> cpu_peak_line_names();
std::optional<double> measure_cpu_peak_gflops(const std::string& line, int threads, double seconds,
                                              std::string* method);
// Streaming read of `bytes` on `threads` threads, read bytes counted, best of `repeats`.
double measure_cpu_read_gbs(size_t bytes, int threads, int repeats);
// The largest CPU cache (sysfs), bytes; 0 when unknown.
size_t last_level_cache_bytes();

}  // namespace tessera::harness
