// tessera bench KERNEL: time implementations over a shape grid through the public API, with
// cost model, fraction of roofline, memory, and baselines timed in the same run (the generic
// driver, harness/bench.h; the kernel supplies its problems and extra flags).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>

#include "common.h"
#include "core/trace.h"
#include "dispatch/dispatch.h"
#include "harness/blas.h"
#include "harness/compiler_report.h"
#include "harness/device_hooks.h"
#include "harness/grid.h"
#include "harness/predict.h"
#include "harness/process.h"
#include "harness/roofline.h"
#include "harness/table.h"
#include "tessera/error.h"

namespace tessera::cli {
namespace {

struct BenchArgs {
  std::string impl, grid, grid_file, dtype, json, csv, roofline;
  std::vector<std::string> shapes, passes;
  int repeats = 7, threads = 0;
  int64_t memory_budget_mib = 0;
  double max_seconds = 10;
  bool compare = false, no_gemm = false, include_reference = false, no_roofline = false, quiet = false,
       check_finite = false;
  uint64_t seed = 1;
  std::string trace;                                 // --trace FILE.json
  size_t trace_max_events = trace::kDefaultMaxEvents;
  bool predict = false;
};

std::string cell(const nlohmann::json& r, const char* k, const char* fmtspec = "{:.3g}") {
  auto it = r.find(k);
  if (it == r.end() || !it->is_number()) return "-";
  return fmt::format(fmt::runtime(fmtspec), it->get<double>());
}

std::string dims_label(const harness::Row& r, const std::vector<std::string>& dims) {
  std::string s;
  for (const auto& d : dims) s += (s.empty() ? "" : ",") + d + "=" + (r.contains(d) ? r[d].dump() : "?");
  return s;
}

std::string roof_cell(const harness::Row& r) {
  if (r.value("roofline_stale", false)) return "STALE";
  return r.contains("roofline_fraction") && r["roofline_fraction"].is_number()
             ? fmt::format("{:.1f}", 100 * r["roofline_fraction"].get<double>()) : "-";
}

std::string extra_cell(const harness::Row& r) {
  if (!r.contains("extra_host_bytes") || !r["extra_host_bytes"].is_number()) return "-";
  double b = r["extra_host_bytes"].get<double>();
  if (r.contains("extra_device_bytes") && r["extra_device_bytes"].is_number() && r["extra_device_bytes"].get<double>() > 0)
    b = r["extra_device_bytes"].get<double>();
  return fmt::format("{:.1f}", b / 1048576.0);
}

// "0.93 cpu": this version's median over its base version's (same shape, dtype and pass).
std::string version_cell(const harness::Row& r) {
  if (!r.contains("vs_version") || !r["vs_version"].is_number()) return "-";
  return fmt::format("{:.2f} {}", r["vs_version"].get<double>(), r.value("version_base", ""));
}

void print_table(const std::vector<harness::Row>& rows, const std::vector<std::string>& dims) {
  bool versions = false;
  for (const auto& r : rows) versions |= r.contains("vs_version");
  const std::string ver_head = versions ? fmt::format(" {:<12}", "vs version") : "";
  fmt::print("{:>3} {:<18} {:<8} {:<24} {:<4} {:>10} {:>19} {:>10} {:>8} {:>7} {:>6} {:>8} {:>7} {:>7}{}\n", "#",
             "implementation", "pass", "shape", "dt", "median ms", "min..max ms", "first ms", "GFLOP/s", "GB/s",
             "%roof", "xtraMiB", "xGEMM", "xbase", ver_head);
  bool stale = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    stale |= r.value("roofline_stale", false);
    fmt::print("{:>3} {:<18} {:<8} {:<24} {:<4} {:>10} {:>19} {:>10} {:>8} {:>7} {:>6} {:>8} {:>7} {:>7}{}\n", i + 1,
               r.value("implementation", ""), r.value("mode", ""), dims_label(r, dims), r.value("dtype", ""),
               cell(r, "median_ms", "{:.4g}"), cell(r, "min_ms", "{:.4g}") + ".." + cell(r, "max_ms", "{:.4g}"),
               cell(r, "first_call_ms", "{:.4g}"), cell(r, "gflops", "{:.4g}"), cell(r, "gbs", "{:.3g}"),
               roof_cell(r), extra_cell(r), cell(r, "vs_gemm", "{:.2f}"), cell(r, "vs_baseline", "{:.2f}"),
               versions ? fmt::format(" {:<12}", version_cell(r)) : std::string());
  }
  if (stale)
    fmt::print("STALE: faster than the stored ceilings allow; they were measured on a busy or another machine. "
               "Re-measure with `tessera roofline` on an idle machine.\n");
}

harness::GridShape parse_shape(const std::string& s, const kernels::KernelSpec& k) {
  const auto parts = dispatch::split_names(s);
  std::string want;
  for (const auto& d : k.dims) want += (want.empty() ? "" : ",") + d;
  check(parts.size() == k.dims.size(), ErrorCode::kInvalidArgument, "--shape wants " + want + ", got '" + s + "'");
  harness::GridShape g;
  for (size_t i = 0; i < parts.size(); ++i) {
    int64_t v = 0;
    try {
      size_t pos = 0;
      v = std::stoll(parts[i], &pos);
      if (pos != parts[i].size()) v = 0;
    } catch (...) {
      v = 0;
    }
    check(v > 0, ErrorCode::kInvalidArgument, "--shape wants positive integers " + want + ", got '" + s + "'");
    g.dims[k.dims[i]] = v;
    g.name += (g.name.empty() ? "" : "x") + std::to_string(v);
  }
  return g;
}

// The shapes and dtypes to time: --shape, else the named grid (smoke by default).
struct Plan {
  std::vector<harness::GridShape> shapes;
  std::vector<std::string> dtypes;
  std::string description;
};

Plan plan_shapes(const kernels::KernelSpec& k, const BenchArgs& a) {
  Plan p;
  if (!a.shapes.empty()) {
    check(a.grid.empty(), ErrorCode::kInvalidArgument, "give --grid or --shape, not both");
    for (const auto& s : a.shapes) p.shapes.push_back(parse_shape(s, k));
    p.description = "--shape";
  } else {
    const std::string path = harness::find_grid_file(k.name, a.grid_file);
    const auto file = harness::load_grid_file(path);
    check(file.kernel == k.name, ErrorCode::kInvalidArgument,
          path + " holds grids of " + file.kernel + ", not of " + k.name);
    const auto& g = file.grid(a.grid.empty() ? "smoke" : a.grid);
    p.shapes = g.shapes;
    p.dtypes = g.dtypes;
    p.description = "grid '" + g.name + "' from " + path;
  }
  if (!a.dtype.empty()) p.dtypes = dispatch::split_names(a.dtype);
  if (p.dtypes.empty()) p.dtypes = {"f32"};
  return p;
}

std::optional<harness::Roofline> load_ceilings(const BenchArgs& a, bool gpu_rows, std::string* source) {
  if (a.no_roofline) return std::nullopt;
  const std::string path = a.roofline.empty() ? harness::default_roofline_path() : a.roofline;
  auto roof = harness::load_roofline(path);
  if (roof) {
    *source = "ceilings stored at " + path + " (measured " + roof->measured_at + (roof->quick ? ", quick" : "") + ")";
  } else {
    fmt::print(stderr, "bench: no stored ceilings at {}: measuring quick ones now (rougher; run `tessera "
                       "roofline` to store accurate ones)\n", path);
    harness::RooflineOptions ro;
    ro.quick = true;
    ro.threads = a.threads;
    roof = harness::measure_roofline(ro);
    *source = "ceilings measured on the fly (quick) because none were stored at " + path;
  }
  const auto* hooks = harness::device_hooks(DeviceType::kCUDA);
  if (gpu_rows && !roof->find(Device::cuda(0).str()) && hooks && hooks->measure_ceilings) {
    fmt::print(stderr, "bench: the ceilings have no {}: measuring quick GPU ceilings now\n", Device::cuda(0).str());
    harness::RooflineOptions ro;
    ro.quick = true;
    ro.cpu = false;
    ro.progress = !a.quiet;
    for (auto& d : harness::measure_roofline(ro).devices) roof->devices.push_back(std::move(d));
    *source += "; GPU ceilings measured on the fly (quick) because none were stored";
  }
  return roof;
}

harness::BenchConfig make_config(const kernels::KernelSpec& k, const BenchArgs& a,
                                 const harness::OptionValues& options, std::vector<std::string>& messages) {
  const Plan plan = plan_shapes(k, a);
  std::string dtype_list;
  for (const auto& d : plan.dtypes) dtype_list += (dtype_list.empty() ? "" : ",") + d;
  harness::BenchConfig cfg = kernels::bench_config(k, a.impl, plan.shapes, parse_float_dtypes(dtype_list, k),
                                                   options, a.seed, &messages);
  for (const auto& m : messages) fmt::print(stderr, "bench: {}\n", m);
  cfg.passes = parse_passes(a.passes, k);
  check(a.repeats >= 1, ErrorCode::kInvalidArgument, "--repeats must be >= 1");
  check(a.max_seconds > 0 && std::isfinite(a.max_seconds), ErrorCode::kInvalidArgument,
        "--max-seconds must be a positive number of seconds, got " + fmt::format("{}", a.max_seconds));
  cfg.timing.repeats = a.repeats;
  cfg.timing.min_repeats = std::min(3, a.repeats);
  cfg.timing.max_seconds = a.max_seconds;
  cfg.exec.num_threads = a.threads;
  cfg.exec.memory_budget = static_cast<size_t>(a.memory_budget_mib) << 20;
  cfg.exec.check_finite = a.check_finite;
  cfg.gemm_baseline = !a.no_gemm;
  cfg.compare = a.compare;
  cfg.include_reference_large = a.include_reference;
  cfg.progress = !a.quiet;
  return cfg;
}

void write_json(const kernels::KernelSpec& k, const BenchArgs& a, const harness::OptionValues& options,
                const std::optional<harness::Roofline>& roof, const std::string& roof_source,
                const harness::BenchResult& res, const std::string& grid_desc) {
  nlohmann::json doc;
  doc["schema"] = "tessera-bench/2";
  doc["kernel"] = k.name;
  doc["dims"] = k.dims;
  doc["created_at"] = harness::utc_timestamp();
  doc["tessera_version"] = TESSERA_VERSION;
  doc["command"] = harness::command_line();
  doc["machine"] = harness::machine_json();  // CPU family/model/ISA, BLAS and core, TESSERA_* env
  if (roof) doc["roofline"] = *roof;
  doc["roofline_source"] = roof_source.empty() ? "no ceilings (--no-roofline)" : roof_source;
  nlohmann::json settings = {{"grid", grid_desc}, {"repeats", a.repeats}, {"max_seconds", a.max_seconds},
                             {"threads", a.threads}, {"memory_budget_mib", a.memory_budget_mib}, {"check_finite", a.check_finite}};
  for (const auto& [name, value] : options.all()) settings[name] = value;
  doc["settings"] = settings;
  doc["build"] = harness::build_json(k.name);  // what the compiler did (the report shows it)
  doc["rows"] = res.rows;
  doc["messages"] = res.messages;
  harness::write_json_file(a.json, doc);
  fmt::print("wrote {}\n", a.json);
}

// ---- --predict: the cost model against the stored ceilings, nothing run ----

void print_predictions(const std::vector<harness::Row>& rows, const std::vector<std::string>& dims) {
  fmt::print("{:>3} {:<18} {:<8} {:<24} {:<4} {:>10} {:>10} {:>8} {:>9} {:>8} {:>8} {:>12}\n", "#", "implementation",
             "pass", "shape", "dt", "GFLOP", "MB", "AI", "peak GF/s", "GB/s", "bound", "predicted ms");
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    fmt::print("{:>3} {:<18} {:<8} {:<24} {:<4} {:>10} {:>10} {:>8} {:>9} {:>8} {:>8} {:>12}\n", i + 1,
               r.value("implementation", ""), r.value("mode", ""), dims_label(r, dims), r.value("dtype", ""),
               cell(r, "gflop_issued", "{:.4g}"), cell(r, "mbytes_min", "{:.4g}"), cell(r, "ai", "{:.3g}"),
               cell(r, "peak_gflops", "{:.4g}"), cell(r, "bandwidth_gbs", "{:.3g}"), r.value("bound", "-"),
               cell(r, "predicted_ms", "{:.4g}"));
  }
}

// Stored ceilings only: a prediction never measures anything (nullopt when none are stored).
std::optional<harness::Roofline> stored_ceilings(const BenchArgs& a, std::string* source) {
  if (a.no_roofline) return std::nullopt;
  const std::string path = a.roofline.empty() ? harness::default_roofline_path() : a.roofline;
  auto roof = path.empty() ? std::nullopt : harness::load_roofline(path);
  *source = roof ? "ceilings stored at " + path + " (measured " + roof->measured_at + (roof->quick ? ", quick" : "") + ")"
                 : "no ceilings stored at " + path + ": run `tessera roofline` to predict times";
  return roof;
}

void run_predict(const kernels::KernelSpec& k, const BenchArgs& a, const harness::OptionValues& options) {
  std::vector<std::string> messages;
  const harness::BenchConfig cfg = make_config(k, a, options, messages);
  std::string roof_source;
  const auto roof = stored_ceilings(a, &roof_source);
  std::vector<std::string> skipped;
  const std::vector<harness::Row> rows = harness::predict(cfg, roof ? &*roof : nullptr, &skipped);
  for (const auto& m : skipped) fmt::print(stderr, "bench: {}\n", m);
  print_predictions(rows, k.dims);
  fmt::print("predicted ms = max(issued FLOPs / peak GEMM rate, minimum bytes / bandwidth): a roofline lower "
             "bound, nothing was run\n{}\n", roof_source.empty() ? "no ceilings (--no-roofline)" : roof_source);
  if (!a.json.empty()) {
    nlohmann::json doc = {{"schema", "tessera-predict/1"}, {"kernel", k.name}, {"dims", k.dims},
                          {"created_at", harness::utc_timestamp()}, {"tessera_version", TESSERA_VERSION},
                          {"command", harness::command_line()}, {"roofline_source", roof_source}, {"rows", rows}};
    messages.insert(messages.end(), skipped.begin(), skipped.end());
    doc["messages"] = messages;
    if (roof) doc["roofline"] = *roof;
    harness::write_json_file(a.json, doc);
    fmt::print("wrote {}\n", a.json);
  }
  if (!a.csv.empty()) {
    std::vector<std::string> cols = {"kind", "implementation", "device", "mode", "shape"};
    cols.insert(cols.end(), k.dims.begin(), k.dims.end());
    for (const char* c : {"dtype", "gflop_useful", "gflop_issued", "mbytes_min", "transcendentals", "ai", "peak_gflops",
                          "bandwidth_gbs", "compute_ms", "memory_ms", "predicted_ms", "bound", "roofline_note", "note"})
      cols.push_back(c);
    harness::write_csv_file(a.csv, rows, cols);
    fmt::print("wrote {}\n", a.csv);
  }
  if (rows.empty()) {
    fmt::print(stderr, "bench: nothing was predicted\n");
    set_exit_code(1);
  }
}

// ---- --trace: the named scopes of the run as a Chrome / Perfetto trace ----

void write_trace(const kernels::KernelSpec& k, const BenchArgs& a) {
  trace::stop();
  trace::write(a.trace, "tessera bench " + k.name);
  fmt::print("wrote {} ({} events{})\n", a.trace, trace::event_count(),
             trace::dropped() ? fmt::format(", {} dropped past --trace-max-events {}", trace::dropped(),
                                            a.trace_max_events)
                              : std::string());
}

void run_bench(const kernels::KernelSpec& k, const BenchArgs& a, const harness::OptionValues& options) {
  // The grid file as found (--grid-file, $TESSERA_BENCH_DIR, the tool's or the source tree's bench/).
  const std::string grid = a.shapes.empty() ? harness::find_grid_file(k.name, a.grid_file) : a.grid_file;
  check_outputs({{"--json", a.json}, {"--csv", a.csv}, {"--trace", a.trace}}, {},
                {{"--grid-file", grid}, {"--roofline", a.roofline}});
  if (a.predict) {
    check(a.trace.empty(), ErrorCode::kInvalidArgument, "--trace records a run; --predict runs nothing");
    return run_predict(k, a, options);
  }
  std::vector<std::string> messages;
  harness::BenchConfig cfg = make_config(k, a, options, messages);
  bool gpu_rows = false;
  for (DeviceType d : cfg.devices) gpu_rows |= d != DeviceType::kCPU;
  std::string roof_source;
  const auto roof = load_ceilings(a, gpu_rows, &roof_source);
  cfg.roofline = roof ? &*roof : nullptr;
  if (!a.trace.empty()) {
    check(a.trace_max_events >= 1, ErrorCode::kInvalidArgument, "--trace-max-events must be >= 1");
    trace::start(a.trace_max_events);
  }
  harness::BenchResult res = harness::run_bench(cfg);
  if (!a.trace.empty()) write_trace(k, a);
  res.messages.insert(res.messages.begin(), messages.begin(), messages.end());
  print_table(res.rows, k.dims);
  if (!roof_source.empty()) fmt::print("{}\n", roof_source);
  if (!a.json.empty()) write_json(k, a, options, roof, roof_source, res, plan_shapes(k, a).description);
  if (!a.csv.empty()) {
    harness::write_csv_file(a.csv, res.rows, harness::bench_columns(k.dims));
    fmt::print("wrote {}\n", a.csv);
  }
  if (res.rows.empty()) {
    fmt::print(stderr, "bench: nothing was timed\n");
    set_exit_code(1);
  }
}

void add_kernel(CLI::App* bench, const kernels::KernelSpec& k) {
  auto* cmd = bench->add_subcommand(k.name, "Benchmark " + k.name + " (" + k.description + ")");
  auto a = std::make_shared<BenchArgs>();
  std::string dims;
  for (const auto& d : k.dims) dims += (dims.empty() ? "" : ",") + d;
  cmd->add_option("--impl", a->impl, "Implementations, comma separated (default: every available one)");
  cmd->add_option("--grid", a->grid, "Named grid from bench/" + k.name + ".json (default: smoke)");
  cmd->add_option("--grid-file", a->grid_file, "Grid file (default: next to the tool, $TESSERA_BENCH_DIR, or the source tree)");
  cmd->add_option("--shape", a->shapes, dims + " (repeatable; instead of --grid)")->allow_extra_args(false);
  cmd->add_option("--dtype", a->dtype, "Comma-separated dtypes (default: the grid's, else f32)");
  add_pass_option(cmd, a->passes);
  cmd->add_option("--json", a->json, "Write the results (rows + ceilings + settings) as JSON");
  cmd->add_option("--csv", a->csv, "Write the rows as CSV");
  cmd->add_option("--repeats", a->repeats, "Timed repeats per row (median reported)")->capture_default_str();
  cmd->add_option("--max-seconds", a->max_seconds, "Timed-work budget per row (at least 3 repeats)")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the generated inputs")->capture_default_str();
  cmd->add_flag("--compare", a->compare, "Also time the kernel's baselines (e.g. the BLAS-materialized math)");
  cmd->add_flag("--no-gemm", a->no_gemm, "Do not time the plain GEMM floor");
  cmd->add_option("--threads", a->threads, "Threads for the implementations and the BLAS (default: all)")
      ->check(CLI::Range(0, 1024));  // 0: all cores; a negative count meant "all" unseen
  cmd->add_option("--memory-budget-mib", a->memory_budget_mib,
                  "Extra memory an implementation may use, MiB (ExecOptions::memory_budget; 0: its default)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));  // up to 1 PiB: MiB << 20 fits in size_t
  cmd->add_flag("--include-reference", a->include_reference, "Time the reference even on large shapes (slow)");
  cmd->add_option("--roofline", a->roofline, "Stored ceilings (default: the `tessera roofline` store)");
  cmd->add_flag("--no-roofline", a->no_roofline, "No ceilings: skip the fraction-of-roofline column");
  cmd->add_flag("--check-finite", a->check_finite, "Keep ExecOptions::check_finite on (off by default)");
  cmd->add_flag("-q,--quiet", a->quiet, "No progress lines");
  cmd->add_option("--trace", a->trace, "Write a Chrome / Perfetto trace of the run (the kernels' named phases per thread)")
      ->type_name("FILE");
  cmd->add_option("--trace-max-events", a->trace_max_events, "Events kept in the --trace file (later ones are counted as dropped)")
      ->capture_default_str();
  cmd->add_flag("--predict", a->predict, "Print each row's roofline prediction from the cost model and the stored "
                                         "ceilings; runs nothing, allocates no inputs");
  auto options = add_kernel_options(cmd, k.bench.options);
  cmd->callback([a, options, &k] { run_bench(k, *a, options()); });
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmark a kernel's implementations over a shape grid (roofline, baselines)");
  require_kernel(bench);
  for (const kernels::KernelSpec* k : kernels::all()) add_kernel(bench, *k);
}

}  // namespace tessera::cli
