#include "harness/roofline.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <unistd.h>
#include <vector>

#include "core/env.h"
#include "core/files.h"
#include "core/memory.h"
#include "core/text.h"
#include "harness/blas.h"
#include "harness/device_hooks.h"
#include "harness/process.h"
#include "core/progress.h"
#include "core/random.h"
#include "harness/timer.h"
#include "tessera/error.h"

namespace tessera::harness {

// ---- DeviceCeilings / Roofline ----

PeakLine DeviceCeilings::gemm_line(const std::string& dtype) const {
  auto it = gemm_gflops.find(dtype);
  if (it != gemm_gflops.end() && it->second > 0) return {it->second, "gemm " + dtype, ""};
  auto f32 = gemm_gflops.find("f32");
  if (f32 != gemm_gflops.end() && f32->second > 0)
    return {f32->second, "gemm f32",
            dtype == "f32" ? "" : dtype + " has no measured GEMM ceiling on " + device + "; f32's is used"};
  return {0.0, "", "no GEMM ceiling measured on " + device};
}

PeakLine DeviceCeilings::peak_line(const std::string& dtype) const {
  auto usable = [&](const std::string& line) {
    auto it = peak_gflops_by_line.find(line);
    return it != peak_gflops_by_line.end() && it->second > 0 ? it->second : 0.0;
  };
  if (dtype == "bf16")
    if (const double p = usable("bf16_dot_avx512"); p > 0) return {p, "bf16_dot_avx512", ""};
  PeakLine best;
  for (const auto& [line, gflops] : peak_gflops_by_line)
    if (line.rfind("f32_", 0) == 0 && gflops > best.gflops) best = {gflops, line, ""};
  if (best.gflops > 0) {
    if (dtype == "bf16") best.note = "no bf16 dot-product peak on " + device + "; the f32 FMA peak is used";
    return best;
  }
  PeakLine g = gemm_line(dtype);
  const std::string why = "no physical peak measured on " + device +
                          (device == "cpu" ? " (a roofline file of schema /1: re-measure with `tessera roofline`)" : "") +
                          "; the " + (g.line.empty() ? std::string("GEMM") : g.line) + " line is used";
  g.note = g.gflops > 0 ? (g.note.empty() ? why : why + "; " + g.note) : g.note;
  return g;
}

double DeviceCeilings::peak_gflops(const std::string& dtype, std::string* note) const {
  PeakLine l = peak_line(dtype);
  if (note) *note = l.note;
  return l.gflops;
}

namespace {
double bound(double peak, double ai, double bw) {
  const double mem = ai * bw;
  if (peak <= 0) return mem;
  if (bw <= 0) return peak;
  return std::min(peak, mem);
}
}  // namespace

double DeviceCeilings::attainable_gflops(double ai, const std::string& dtype) const {
  return bound(peak_gflops(dtype), ai, bandwidth_gbs);
}

double DeviceCeilings::attainable_gemm_gflops(double ai, const std::string& dtype) const {
  return bound(gemm_line(dtype).gflops, ai, copy_gbs > 0 ? copy_gbs : bandwidth_gbs);
}

const DeviceCeilings* Roofline::find(const std::string& device) const {
  for (const auto& d : devices)
    if (d.device == device) return &d;
  return nullptr;
}

void to_json(nlohmann::json& j, const DeviceCeilings& d) {
  j = nlohmann::json{{"device", d.device},
                     {"name", d.name},
                     {"peak_gflops", d.peak_gflops_by_line},
                     {"peak_method", d.peak_method},
                     {"gemm_gflops", d.gemm_gflops},
                     {"gemm_method", d.gemm_method},
                     {"bandwidth_gbs", d.bandwidth_gbs},
                     {"bandwidth_method", d.bandwidth_method},
                     {"copy_gbs", d.copy_gbs},
                     {"copy_method", d.copy_method},
                     {"notes", d.notes}};
}

void from_json(const nlohmann::json& j, DeviceCeilings& d) {
  d.device = j.at("device").get<std::string>();
  d.name = j.value("name", "");
  d.gemm_gflops = j.value("gemm_gflops", std::map<std::string, double>{});
  d.gemm_method = j.value("gemm_method", std::map<std::string, std::string>{});
  d.bandwidth_gbs = j.value("bandwidth_gbs", 0.0);
  d.bandwidth_method = j.value("bandwidth_method", "");
  d.peak_gflops_by_line = j.value("peak_gflops", std::map<std::string, double>{});
  d.peak_method = j.value("peak_method", std::map<std::string, std::string>{});
  d.copy_gbs = j.value("copy_gbs", 0.0);
  d.copy_method = j.value("copy_method", "");
  d.notes = j.value("notes", std::vector<std::string>{});
}

namespace {
constexpr const char* kSchema = "tessera-roofline/2";
constexpr const char* kSchemaV1 = "tessera-roofline/1";  // GEMM lines + copy bandwidth only
}  // namespace

void to_json(nlohmann::json& j, const Roofline& r) {
  j = nlohmann::json{{"schema", kSchema},
                     {"measured_at", r.measured_at},
                     {"tessera_version", r.tessera_version},
                     {"quick", r.quick},
                     {"devices", r.devices}};
}

void from_json(const nlohmann::json& j, Roofline& r) {
  const std::string schema = j.value("schema", "");
  check(schema == kSchema || schema == kSchemaV1, ErrorCode::kIo,
        "not a tessera roofline file (schema '" + schema + "', want '" + kSchema + "' or '" + kSchemaV1 + "')");
  r.measured_at = j.value("measured_at", "");
  r.tessera_version = j.value("tessera_version", "");
  r.quick = j.value("quick", false);
  r.devices = j.at("devices").get<std::vector<DeviceCeilings>>();
  if (schema == kSchemaV1)  // it had no physical lines: whatever such keys hold is not ours
    for (DeviceCeilings& d : r.devices) d.peak_gflops_by_line.clear(), d.copy_gbs = 0;
}

std::string default_roofline_path() {
  if (auto p = env::get("TESSERA_ROOFLINE")) return *p;
  if (auto x = env::get("XDG_CACHE_HOME")) return *x + "/tessera/roofline.json";
  if (auto h = env::get("HOME")) return *h + "/.cache/tessera/roofline.json";
  return {};
}

std::optional<Roofline> load_roofline(const std::string& path) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return std::nullopt;
  std::ifstream f(path, std::ios::binary);
  check(static_cast<bool>(f), ErrorCode::kIo, "cannot read roofline file " + path);
  std::ostringstream text;
  text << f.rdbuf();
  return parse_roofline(text.str(), path);
}

Roofline parse_roofline(const std::string& text, const std::string& path) {
  try {
    return nlohmann::json::parse(text).get<Roofline>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kIo, text::printable("roofline file " + path + " is not valid: " + e.what() +
                                                    " (re-measure with `tessera roofline`)"));
  } catch (const Error& e) {
    throw Error(ErrorCode::kIo, text::printable("roofline file " + path + ": " + e.what() +
                                                    " (re-measure with `tessera roofline`)"));
  }
}

void save_roofline(const Roofline& r, const std::string& path) {
  check(!path.empty(), ErrorCode::kIo,
        "no place to store the roofline: set TESSERA_ROOFLINE, XDG_CACHE_HOME or HOME, or pass --out");
  files::write_atomically(path, nlohmann::json(r).dump(2) + "\n");
}

// ---- measurements ----

double measure_cpu_copy_gbs(size_t bytes, int threads, int repeats) {
  if (threads <= 0) threads = hardware_threads();
  bytes = std::max<size_t>(bytes / 64 * 64, 1 << 20);
  auto src = memory::host_alloc(bytes);
  auto dst = memory::host_alloc(bytes);
  char* s = memory::as<char>(src);
  char* d = memory::as<char>(dst);
  // First touch from the threads that will copy (page placement), then one untimed copy.
  const int64_t n = static_cast<int64_t>(bytes);
  parallel_for(n, threads, [&](int64_t b, int64_t e) {
    std::memset(s + b, 1, static_cast<size_t>(e - b));
    std::memset(d + b, 0, static_cast<size_t>(e - b));
  });
  auto copy = [&] {
    parallel_for(n, threads, [&](int64_t b, int64_t e) {
      std::memcpy(d + b, s + b, static_cast<size_t>(e - b));
    });
  };
  copy();
  double best = 0;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    Stopwatch sw;
    copy();
    const double t = sw.seconds();
    if (t > 0) best = std::max(best, 2.0 * static_cast<double>(bytes) / t / 1e9);
  }
  return best;
}

std::optional<double> measure_cpu_gemm_gflops(const std::string& dtype, int64_t n, int repeats,
                                              std::string* method) {
  auto say = [&](const std::string& m) {
    if (method) *method = m;
  };
  if (!blas::available()) {
    say("no BLAS ceiling: " + blas::unavailable_reason());
    return std::nullopt;
  }
  if (dtype != "f32" && dtype != "bf16") {
    say("no BLAS ceiling: the linked BLAS has no " + dtype + " GEMM; f32's is used");
    return std::nullopt;
  }
  if (dtype == "bf16" && !blas::has_sbgemm()) {
    say("no BLAS ceiling: the linked BLAS (" + blas::name() +
        ") does not export cblas_sbgemm (OpenBLAS built without BUILD_BFLOAT16); f32's is used");
    return std::nullopt;
  }
  const size_t nn = static_cast<size_t>(n) * static_cast<size_t>(n);
  std::vector<float> a(nn), b(nn), c(nn, 0.f);
  for (size_t i = 0; i < nn; ++i) a[i] = static_cast<float>(2 * random_unit(42, i) - 1);
  for (size_t i = 0; i < nn; ++i) b[i] = static_cast<float>(2 * random_unit(43, i) - 1);
  std::vector<uint16_t> a16, b16;
  if (dtype == "bf16") {
    a16.resize(nn);
    b16.resize(nn);
    for (size_t i = 0; i < nn; ++i) a16[i] = f32_to_bf16(a[i]), b16[i] = f32_to_bf16(b[i]);
  }
  auto run = [&] {
    if (dtype == "bf16")
      blas::sbgemm(false, false, n, n, n, 1.f, a16.data(), n, b16.data(), n, 0.f, c.data(), n);
    else
      blas::sgemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  };
  run();  // warm-up: BLAS thread start-up, buffer allocation
  double best = 0;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    Stopwatch sw;
    run();
    const double t = sw.seconds();
    if (t > 0) best = std::max(best, 2.0 * static_cast<double>(n) * n * n / t / 1e9);
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "cblas_%s %lldx%lldx%lld, best of %d, %d BLAS threads",
                dtype == "bf16" ? "sbgemm" : "sgemm", static_cast<long long>(n),
                static_cast<long long>(n), static_cast<long long>(n), std::max(1, repeats),
                blas::threads());
  say(buf);
  return best;
}

namespace {

// The physical peaks: every line this build has a loop for (a note for those the CPU lacks).
void measure_cpu_peaks(DeviceCeilings& c, int threads, bool quick, Progress& progress, int& step) {
  for (const std::string& line : cpu_peak_line_names()) {
    progress.update(++step, "CPU peak " + line);
    std::string method;
    if (auto g = measure_cpu_peak_gflops(line, threads, quick ? 0.05 : 0.15, &method)) c.peak_gflops_by_line[line] = *g;
    c.peak_method[line] = method;
  }
  if (cpu_features().find("amx_bf16") != std::string::npos)
    c.peak_method["bf16_amx"] = "not measured: this CPU has AMX (amx_bf16) but no AMX tile loop is written yet";
}

// The practical compute line: the BLAS GEMM per dtype, the best over `sizes`.
void measure_cpu_gemms(DeviceCeilings& c, const std::vector<int64_t>& sizes, int repeats, Progress& progress,
                       int& step) {
  for (const std::string dtype : {"f32", "bf16"}) {
    double best = 0;
    std::string method;
    for (int64_t n : sizes) {
      progress.update(++step, "CPU " + dtype + " GEMM " + std::to_string(n) + "^3");
      std::string m;
      auto g = measure_cpu_gemm_gflops(dtype, n, repeats, &m);
      if (!g) {
        method = m;
        step += static_cast<int>(sizes.size()) - 1;
        break;
      }
      if (*g > best) best = *g, method = m;
    }
    if (best > 0) c.gemm_gflops[dtype] = best;
    c.gemm_method[dtype] = method;
  }
  c.gemm_method["f16"] = "no BLAS ceiling: no f16 GEMM in a CBLAS; f32's is used";
}

void measure_cpu_bandwidths(DeviceCeilings& c, const RooflineOptions& opt, int threads, Progress& progress,
                            int& step) {
  const size_t llc = last_level_cache_bytes();
  const size_t read_bytes =
      opt.read_bytes ? opt.read_bytes : std::max<size_t>(opt.quick ? (64u << 20) : (256u << 20), (opt.quick ? 4 : 8) * llc);
  const size_t copy_bytes = opt.copy_bytes ? opt.copy_bytes : (opt.quick ? (64u << 20) : (256u << 20));
  const int repeats = opt.quick ? 3 : 5;
  progress.update(++step, "CPU read bandwidth (" + std::to_string(read_bytes >> 20) + " MiB)");
  c.bandwidth_gbs = measure_cpu_read_gbs(read_bytes, threads, repeats);
  c.bandwidth_method = "streaming read (256-bit loads summed) of " + std::to_string(read_bytes >> 20) + " MiB" +
                       (llc ? " (last-level cache " + std::to_string(llc >> 20) + " MiB)" : std::string()) +
                       " on " + std::to_string(threads) + " threads, read bytes counted, best of " +
                       std::to_string(repeats);
  progress.update(++step, "CPU copy bandwidth (" + std::to_string(copy_bytes >> 20) + " MiB)");
  c.copy_gbs = measure_cpu_copy_gbs(copy_bytes, threads, repeats);
  c.copy_method = "memcpy of " + std::to_string(copy_bytes >> 20) + " MiB on " + std::to_string(threads) +
                  " threads, read + write bytes counted, best of " + std::to_string(repeats);
}

}  // namespace

Roofline measure_roofline(const RooflineOptions& opt) {
  Roofline r;
  r.measured_at = utc_timestamp();
#ifdef TESSERA_VERSION
  r.tessera_version = TESSERA_VERSION;
#endif
  r.quick = opt.quick;
  const std::vector<int64_t> sizes = opt.quick ? std::vector<int64_t>{1024}
                                               : std::vector<int64_t>{1024, 2048, 3072};
  const int gemm_repeats = opt.quick ? 2 : 3;

  const DeviceHooks* gpu = opt.gpu ? device_hooks(DeviceType::kCUDA) : nullptr;
  const int gpus = gpu && gpu->measure_ceilings ? (gpu->device_count ? gpu->device_count() : 1) : 0;
  const int cpu_steps = static_cast<int>(cpu_peak_line_names().size() + sizes.size() * 2) + 2;
  const int steps = (opt.cpu ? cpu_steps : 0) + gpus;
  Progress progress("roofline", std::max(1, steps), opt.progress);
  int step = 0;

  if (opt.cpu) {
    DeviceCeilings c;
    c.device = "cpu";
    const int threads = opt.threads > 0 ? opt.threads : hardware_threads();
    std::string model = cpu_model();
    c.name = (model.empty() ? std::string("unknown CPU") : model) + " (" + std::to_string(threads) +
             " threads; " + cpu_features() + ")";
    measure_cpu_peaks(c, threads, opt.quick, progress, step);
    if (blas::available()) blas::set_threads(threads);
    measure_cpu_gemms(c, sizes, gemm_repeats, progress, step);
    measure_cpu_bandwidths(c, opt, threads, progress, step);
    if (blas::available())
      c.notes.push_back("BLAS: " + blas::name() + (blas::core_name().empty() ? "" : " (core " + blas::core_name() + ")"));
    r.devices.push_back(std::move(c));
  }
  for (int i = 0; i < gpus; ++i) {
    progress.update(++step, "GPU " + std::to_string(i) + " ceilings");
    auto raw = gpu->measure_ceilings(i, opt.quick);
    if (!raw) continue;
    DeviceCeilings d;
    d.device = Device::cuda(i).str();
    d.name = raw->name;
    d.gemm_gflops = raw->gemm_gflops;
    d.gemm_method = raw->gemm_method;
    d.bandwidth_gbs = raw->bandwidth_gbs;
    d.bandwidth_method = raw->bandwidth_method;
    d.notes = raw->notes;
    r.devices.push_back(std::move(d));
  }
  return r;
}

}  // namespace tessera::harness
