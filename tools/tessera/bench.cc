// tessera bench <kernel>: time implementations over a shape grid through the public API, with
// cost model, fraction of roofline, memory, and BLAS baselines timed in the same run.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "harness/blas.h"
#include "harness/device_hooks.h"
#include "harness/grid.h"
#include "harness/process.h"
#include "harness/roofline.h"
#include "harness/table.h"
#include "kernels/linear_cross_entropy/bench.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "tessera/commands.h"
#include "tessera/error.h"

namespace tessera::cli {
namespace {

namespace lce = tessera::linear_cross_entropy;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) {
    cur.erase(0, cur.find_first_not_of(" \t"));
    cur.erase(cur.find_last_not_of(" \t") + 1);
    if (!cur.empty()) out.push_back(cur);
  }
  return out;
}

lce::BenchShape parse_shape(const std::string& s) {
  auto parts = split(s, ',');
  check(parts.size() == 3, ErrorCode::kInvalidArgument, "--shape wants B,H,V (e.g. 2048,1024,32768), got '" + s + "'");
  lce::BenchShape sh;
  int64_t v[3];
  for (int i = 0; i < 3; ++i) {
    try {
      size_t pos = 0;
      v[i] = std::stoll(parts[static_cast<size_t>(i)], &pos);
      check(pos == parts[static_cast<size_t>(i)].size() && v[i] > 0, ErrorCode::kInvalidArgument, "");
    } catch (...) {
      throw Error(ErrorCode::kInvalidArgument, "--shape wants three positive integers B,H,V, got '" + s + "'");
    }
  }
  sh.B = v[0], sh.H = v[1], sh.V = v[2];
  sh.name = fmt::format("{}x{}x{}", sh.B, sh.H, sh.V);
  return sh;
}

std::string cell(const nlohmann::json& r, const char* k, const char* fmtspec = "{:.3g}") {
  auto it = r.find(k);
  if (it == r.end() || !it->is_number()) return "-";
  return fmt::format(fmt::runtime(fmtspec), it->get<double>());
}

void print_table(const std::vector<harness::Row>& rows) {
  fmt::print("{:>3} {:<18} {:<5} {:<14} {:<4} {:>10} {:>19} {:>10} {:>8} {:>7} {:>6} {:>8} {:>7} {:>7}\n", "#",
             "implementation", "mode", "shape", "dt", "median ms", "min..max ms", "first ms", "GFLOP/s", "GB/s",
             "%roof", "xtraMiB", "xGEMM", "xmat");
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    std::string frac = "-";
    if (r.contains("roofline_fraction") && r["roofline_fraction"].is_number())
      frac = fmt::format("{:.1f}", 100 * r["roofline_fraction"].get<double>());
    std::string extra = "-";
    if (r.contains("extra_host_bytes") && r["extra_host_bytes"].is_number()) {
      double b = r["extra_host_bytes"].get<double>();
      if (r.contains("extra_device_bytes") && r["extra_device_bytes"].is_number() &&
          r["extra_device_bytes"].get<double>() > 0)
        b = r["extra_device_bytes"].get<double>();
      extra = fmt::format("{:.1f}", b / 1048576.0);
    }
    fmt::print("{:>3} {:<18} {:<5} {:<14} {:<4} {:>10} {:>19} {:>10} {:>8} {:>7} {:>6} {:>8} {:>7} {:>7}\n", i + 1,
               r.value("implementation", ""), r.value("mode", ""), r.value("shape", ""), r.value("dtype", ""),
               cell(r, "median_ms", "{:.4g}"), cell(r, "min_ms", "{:.4g}") + ".." + cell(r, "max_ms", "{:.4g}"),
               cell(r, "first_call_ms", "{:.4g}"), cell(r, "gflops", "{:.4g}"), cell(r, "gbs", "{:.3g}"), frac,
               extra, cell(r, "vs_gemm", "{:.2f}"), cell(r, "vs_baseline", "{:.2f}"));
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Benchmark a kernel's implementations over a shape grid (roofline, baselines)");
  struct Args {
    std::string kernel, impl, grid, grid_file, dtype, mode = "all", json, csv, roofline, layout = "hv";
    std::vector<std::string> shapes;
    int repeats = 7, threads = 0;
    double max_seconds = 10, soft_cap = 0;
    bool compare = false, no_gemm = false, bias = false, include_reference = false, no_roofline = false,
         quiet = false, check_finite = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("kernel", a->kernel, "Kernel (linear_cross_entropy)")->required();
  cmd->add_option("--impl", a->impl, "Implementations, comma separated (default: every available one)");
  cmd->add_option("--grid", a->grid, "Named grid from bench/<kernel>.json (default: smoke)");
  cmd->add_option("--grid-file", a->grid_file, "Grid file (default: found next to the tool, in $TESSERA_BENCH_DIR, or the source tree)");
  cmd->add_option("--shape", a->shapes, "B,H,V (repeatable; instead of --grid)");
  cmd->add_option("--dtype", a->dtype, "Comma-separated dtypes (default: the grid's, else f32)");
  cmd->add_option("--mode", a->mode, "fwd | bwd | fused | all, or a comma list")->capture_default_str();
  cmd->add_option("--json", a->json, "Write the results (rows + ceilings + settings) as JSON");
  cmd->add_option("--csv", a->csv, "Write the rows as CSV");
  cmd->add_option("--repeats", a->repeats, "Timed repeats per row (median reported)")->capture_default_str();
  cmd->add_option("--max-seconds", a->max_seconds, "Timed-work budget per row (at least 3 repeats)")->capture_default_str();
  cmd->add_flag("--compare", a->compare, "Also time a materialized baseline (BLAS GEMM into B×V logits + softmax CE)");
  cmd->add_flag("--no-gemm", a->no_gemm, "Do not time the plain GEMM baseline");
  cmd->add_flag("--bias", a->bias, "Benchmark with a bias");
  cmd->add_option("--soft-cap", a->soft_cap, "Logit soft cap (0 = off)");
  cmd->add_option("--layout", a->layout, "w layout: hv ([H,V]) or vh ([V,H])")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Threads for the implementations and the BLAS (default: all)");
  cmd->add_flag("--include-reference", a->include_reference, "Time the reference even on large shapes (slow)");
  cmd->add_option("--roofline", a->roofline, "Stored ceilings (default: the `tessera roofline` store)");
  cmd->add_flag("--no-roofline", a->no_roofline, "No ceilings: skip the fraction-of-roofline column");
  cmd->add_flag("--check-finite", a->check_finite, "Keep Options::check_finite on (off by default: time the kernel)");
  cmd->add_flag("-q,--quiet", a->quiet, "No progress lines");
  cmd->callback([a] {
    check(a->kernel == lce::kKernelName, ErrorCode::kNotFound,
          "no benchmark for kernel '" + a->kernel + "' (kernels: " + lce::kKernelName + ")");
    lce::BenchConfig cfg;
    cfg.implementations = split(a->impl, ',');
    // Shapes: --shape, else the grid (smoke by default).
    std::vector<std::string> grid_dtypes;
    std::string grid_desc;
    if (!a->shapes.empty()) {
      check(a->grid.empty(), ErrorCode::kInvalidArgument, "give --grid or --shape, not both");
      for (const auto& s : a->shapes) cfg.shapes.push_back(parse_shape(s));
    } else {
      const std::string path = harness::find_grid_file(a->kernel, a->grid_file);
      const auto file = harness::load_grid_file(path);
      const auto& g = file.grid(a->grid.empty() ? "smoke" : a->grid);
      for (const auto& s : g.shapes) cfg.shapes.push_back({s.name, s.dim("B"), s.dim("H"), s.dim("V")});
      grid_dtypes = g.dtypes;
      grid_desc = "grid '" + g.name + "' from " + path;
    }
    cfg.dtypes.clear();
    for (const auto& d : a->dtype.empty() ? (grid_dtypes.empty() ? std::vector<std::string>{"f32"} : grid_dtypes)
                                          : split(a->dtype, ',')) {
      const DType t = parse_dtype(d);
      check(is_float(t), ErrorCode::kInvalidArgument, "--dtype must be f32, bf16 or f16, got " + d);
      cfg.dtypes.push_back(t);
    }
    cfg.passes.clear();
    for (const auto& m : split(a->mode, ',')) {
      if (m == "all") {
        cfg.passes = {lce::Pass::kForward, lce::Pass::kBackward, lce::Pass::kFused};
        break;
      }
      cfg.passes.push_back(lce::parse_pass(m));
    }
    check(!cfg.passes.empty(), ErrorCode::kInvalidArgument, "--mode is empty");
    cfg.layout = lce::parse_w_layout(a->layout);
    check(cfg.layout != lce::WLayout::kAuto, ErrorCode::kInvalidArgument, "--layout must be hv or vh");
    cfg.bias = a->bias;
    cfg.soft_cap = a->soft_cap;
    check(a->repeats >= 1, ErrorCode::kInvalidArgument, "--repeats must be >= 1");
    cfg.timing.repeats = a->repeats;
    cfg.timing.min_repeats = std::min(3, a->repeats);
    cfg.timing.max_seconds = a->max_seconds;
    cfg.threads = a->threads;
    cfg.gemm_baseline = !a->no_gemm;
    cfg.compare = a->compare;
    cfg.include_reference_large = a->include_reference;
    cfg.check_finite = a->check_finite;
    cfg.progress = !a->quiet;

    // Ceilings: stored, else measured quickly now.
    std::optional<harness::Roofline> roof;
    std::string roof_source;
    if (!a->no_roofline) {
      const std::string path = a->roofline.empty() ? harness::default_roofline_path() : a->roofline;
      roof = harness::load_roofline(path);
      if (roof) {
        roof_source = "ceilings stored at " + path + " (measured " + roof->measured_at + (roof->quick ? ", quick" : "") + ")";
      } else {
        fmt::print(stderr,
                   "bench: no stored ceilings at {}: measuring quick ones now (rougher; run `tessera roofline` "
                   "to store accurate ones)\n",
                   path);
        harness::RooflineOptions ro;
        ro.quick = true;
        ro.threads = a->threads;
        roof = harness::measure_roofline(ro);
        roof_source = "ceilings measured on the fly (quick) because none were stored at " + path;
      }
      // GPU rows need the GPU's ceilings; a file stored without them (measured with --no-gpu, or
      // on another build) gets quick ones measured now, for this run only.
      // Selected by device and name before available(), which loads the CUDA module: a CPU-only
      // bench never loads it.
      bool gpu_rows = false;
      for (const auto* impl : lce::registry().implementations())
        if (impl->device_type() == DeviceType::kCUDA &&
            (cfg.implementations.empty() ||
             std::find(cfg.implementations.begin(), cfg.implementations.end(), impl->name()) != cfg.implementations.end()) &&
            impl->available().ok)
          gpu_rows = true;
      const auto* hooks = gpu_rows ? harness::device_hooks(DeviceType::kCUDA) : nullptr;
      if (gpu_rows && !roof->find(Device::cuda(0).str()) && hooks && hooks->measure_ceilings) {
        fmt::print(stderr, "bench: the ceilings have no {}: measuring quick GPU ceilings now\n", Device::cuda(0).str());
        harness::RooflineOptions ro;
        ro.quick = true;
        ro.cpu = false;
        ro.progress = !a->quiet;
        for (auto& d : harness::measure_roofline(ro).devices) roof->devices.push_back(std::move(d));
        roof_source += "; GPU ceilings measured on the fly (quick) because none were stored";
      }
      cfg.roofline = &*roof;
    }

    const auto res = lce::run_bench(cfg);
    print_table(res.rows);
    if (!roof_source.empty()) fmt::print("{}\n", roof_source);

    if (!a->json.empty()) {
      nlohmann::json doc;
      doc["schema"] = "tessera-bench/1";
      doc["kernel"] = a->kernel;
      doc["created_at"] = harness::utc_timestamp();
      doc["tessera_version"] = TESSERA_VERSION;
      doc["command"] = harness::command_line();
      doc["machine"] = {{"cpu", harness::cpu_model()},
                        {"hardware_threads", harness::hardware_threads()},
                        {"cpu_features", harness::cpu_features()},
                        {"blas", harness::blas::available() ? harness::blas::name() : "none"}};
      if (roof) doc["roofline"] = *roof;
      doc["roofline_source"] = roof_source.empty() ? "no ceilings (--no-roofline)" : roof_source;
      doc["settings"] = {{"grid", grid_desc},
                         {"repeats", a->repeats},
                         {"max_seconds", a->max_seconds},
                         {"threads", a->threads},
                         {"layout", a->layout},
                         {"bias", a->bias},
                         {"soft_cap", a->soft_cap},
                         {"reduction", "mean"},
                         {"check_finite", a->check_finite}};
      doc["rows"] = res.rows;
      doc["messages"] = res.messages;
      harness::write_json_file(a->json, doc);
      fmt::print("wrote {}\n", a->json);
    }
    if (!a->csv.empty()) {
      harness::write_csv_file(a->csv, res.rows, lce::bench_columns());
      fmt::print("wrote {}\n", a->csv);
    }
    if (res.rows.empty()) {
      fmt::print(stderr, "bench: nothing was timed\n");
      set_exit_code(1);
    }
  });
}

}  // namespace tessera::cli
