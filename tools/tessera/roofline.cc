// tessera roofline: measure this machine's ceilings (physical FMA / bf16 dot-product peaks and a
// streaming-read bandwidth; beside them the GEMM rate per dtype through the linked BLAS and a
// copy bandwidth; a GPU's through its backend's hooks) and store them for `tessera bench`.
#include <fmt/core.h>

#include "harness/roofline.h"
#include "common.h"

namespace tessera::cli {

namespace {
void print_roofline(const harness::Roofline& r) {
  for (const auto& d : r.devices) {
    fmt::print("{}: {}\n", d.device, d.name);
    for (const auto& [line, m] : d.peak_method) {
      auto it = d.peak_gflops_by_line.find(line);
      if (it != d.peak_gflops_by_line.end())
        fmt::print("  peak {:<16} {:>9.1f} GFLOP/s   ({})\n", line, it->second, m);
      else
        fmt::print("  peak {:<16} {:>9}           ({})\n", line, "-", m);
    }
    for (const auto& [dt, m] : d.gemm_method) {
      auto it = d.gemm_gflops.find(dt);
      if (it != d.gemm_gflops.end())
        fmt::print("  GEMM {:<16} {:>9.1f} GFLOP/s   ({})\n", dt, it->second, m);
      else
        fmt::print("  GEMM {:<16} {:>9}           ({})\n", dt, "-", m);
    }
    fmt::print("  bandwidth             {:>9.1f} GB/s      ({})\n", d.bandwidth_gbs, d.bandwidth_method);
    if (d.copy_gbs > 0) fmt::print("  copy bandwidth        {:>9.1f} GB/s      ({})\n", d.copy_gbs, d.copy_method);
    for (const char* dt : {"f32", "bf16"}) {
      const harness::PeakLine roof = d.peak_line(dt), gemm = d.gemm_line(dt);
      if (roof.gflops <= 0) continue;
      fmt::print("  {:<4} roof: {} {:.1f} GFLOP/s", dt, roof.line, roof.gflops);
      if (d.bandwidth_gbs > 0) fmt::print(", ridge {:.1f} flop/byte", roof.gflops / d.bandwidth_gbs);
      if (gemm.gflops > 0 && gemm.line != roof.line)
        fmt::print("; BLAS {} = {:.0f} % of it", gemm.line, 100 * gemm.gflops / roof.gflops);
      fmt::print("{}\n", roof.note.empty() ? "" : " (" + roof.note + ")");
    }
    for (const auto& n : d.notes) fmt::print("  note: {}\n", n);
  }
}
}  // namespace

void register_roofline(CLI::App& app) {
  auto* cmd = app.add_subcommand("roofline", "Measure and store this machine's ceilings (FMA / dot-product peaks, bandwidth, BLAS GEMM)");
  struct Args {
    std::string out;
    bool quick = false, no_gpu = false, show = false;
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--out", a->out,
                  "Where to store them (default: $TESSERA_ROOFLINE, else $XDG_CACHE_HOME/tessera/roofline.json, "
                  "else ~/.cache/tessera/roofline.json)");
  cmd->add_flag("--quick", a->quick, "Smaller, faster measurement (rougher)");
  cmd->add_flag("--no-gpu", a->no_gpu, "Skip GPU ceilings even when a GPU backend is built");
  cmd->add_option("--threads", a->threads, "CPU threads (default: all)")
      ->check(CLI::Range(0, 1024));  // 0: all cores; a negative count meant "all" unseen
  cmd->add_flag("--show", a->show, "Print the stored ceilings and exit (measure nothing)");
  cmd->callback([a] {
    const std::string path = a->out.empty() ? harness::default_roofline_path() : a->out;
    if (a->show) {
      auto r = harness::load_roofline(path);
      if (!r) {
        fmt::print(stderr, "tessera roofline: nothing stored at {} (run `tessera roofline`)\n", path);
        set_exit_code(1);
        return;
      }
      fmt::print("stored at {} (measured {}{})\n", path, r->measured_at, r->quick ? ", quick" : "");
      print_roofline(*r);
      return;
    }
    check_outputs({{"--out", path}});  // before the measurement, not after it
    harness::RooflineOptions opt;
    opt.quick = a->quick;
    opt.gpu = !a->no_gpu;
    opt.threads = a->threads;
    const auto r = harness::measure_roofline(opt);
    print_roofline(r);
    harness::save_roofline(r, path);
    fmt::print("stored at {}\n", path);
  });
}

}  // namespace tessera::cli
