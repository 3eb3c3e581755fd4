// tessera roofline: measure this machine's ceilings (peak GEMM per dtype through the linked
// BLAS, copy bandwidth; a GPU's through its backend's hooks) and store them for `tessera bench`.
#include <fmt/core.h>

#include "harness/roofline.h"
#include "common.h"

namespace tessera::cli {

namespace {
void print_roofline(const harness::Roofline& r) {
  for (const auto& d : r.devices) {
    fmt::print("{}: {}\n", d.device, d.name);
    for (const auto& [dt, m] : d.gemm_method) {
      auto it = d.gemm_gflops.find(dt);
      if (it != d.gemm_gflops.end())
        fmt::print("  GEMM {:<5} {:>9.1f} GFLOP/s   ({})\n", dt, it->second, m);
      else
        fmt::print("  GEMM {:<5} {:>9}           ({})\n", dt, "-", m);
    }
    fmt::print("  bandwidth  {:>9.1f} GB/s      ({})\n", d.bandwidth_gbs, d.bandwidth_method);
    for (const auto& [dt, peak] : d.gemm_gflops)
      if (d.bandwidth_gbs > 0)
        fmt::print("  ridge point {:<5} {:.1f} flop/byte\n", dt, peak / d.bandwidth_gbs);
    for (const auto& n : d.notes) fmt::print("  note: {}\n", n);
  }
}
}  // namespace

void register_roofline(CLI::App& app) {
  auto* cmd = app.add_subcommand("roofline", "Measure and store this machine's ceilings (peak GEMM, bandwidth)");
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
  cmd->add_option("--threads", a->threads, "CPU threads (default: all)");
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
