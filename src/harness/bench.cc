#include "harness/bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "core/memory.h"
#include "core/progress.h"
#include "core/random.h"
#include "core/trace.h"
#include "harness/blas.h"
#include "harness/device_hooks.h"
#include "harness/process.h"
#include "tessera/error.h"
#include "tune/choose.h"
#include "tune/device_kind.h"

namespace tessera::harness {
namespace {

double ms(double s) { return s * 1e3; }

// Generic leading fields of every row: the case's dims and dtype, what the kernel's describe() adds.
Row base_row(const BenchProblem& p, const std::string& kind, const std::string& impl,
             const std::string& device, const std::string& mode, const BenchCase& bc, int threads) {
  Row r = bc.fields;
  r.update(p.describe());
  r["kind"] = kind;
  r["implementation"] = impl;
  r["device"] = device;
  r["mode"] = mode;
  r["shape"] = bc.shape_name;
  r["threads"] = threads;
  if (device == "cpu") r["device_kind"] = tune::cpu_device_kind();  // a GPU's is its backend's
  r["blas_core"] = blas::core_name();
  r["tessera_env"] = tessera_env_line();
  return r;
}

// The block sizes the first call chose, and where they came from ("tuned table", "autotune",
// "options" = the caller's, ...); several when the call chose more than once (a pipeline, a
// fallback to another implementation).
void fill_block_sizes(Row& r, const std::vector<tune::ChoiceRecord>& records) {
  if (records.empty()) return;
  std::string sizes, sources;
  for (const auto& c : records) {
    const std::string who = records.size() > 1 ? c.implementation + " " : "";
    sizes += (sizes.empty() ? "" : "; ") + who + tune::params_str(c.params);
    sources += (sources.empty() ? "" : "; ") + who + c.source;
  }
  r["block_sizes"] = sizes;
  r["block_sizes_source"] = sources;
}

// Memory around the first call: tracked host / device scratch and RSS growth.
struct MemoryProbe {
  size_t hbase = 0, dbase = 0, hextra = 0, dextra = 0;
  std::optional<size_t> rss0, rss_growth;
  bool rss_reset = false;
  void before() {
    memory::reset_peak(memory::Space::kHost);
    memory::reset_peak(memory::Space::kDevice);
    hbase = memory::current_bytes(memory::Space::kHost);
    dbase = memory::current_bytes(memory::Space::kDevice);
    rss_reset = reset_peak_rss();
    rss0 = rss_bytes();
  }
  void after() {
    hextra = memory::peak_bytes(memory::Space::kHost) - hbase;
    dextra = memory::peak_bytes(memory::Space::kDevice) - dbase;
    auto peak = peak_rss_bytes();
    if (rss_reset && rss0 && peak) rss_growth = *peak > *rss0 ? *peak - *rss0 : 0;
  }
  void fill(Row& r) const {
    r["extra_host_bytes"] = hextra;
    r["extra_device_bytes"] = dextra;
    r["rss_growth_bytes"] = rss_growth ? nlohmann::json(*rss_growth) : nlohmann::json(nullptr);
  }
};

// The host GEMM floor: sgemm (sbgemm for bf16 where the BLAS has it) on random operands.
Timing time_host_gemm(const GemmFloor& g, const TimingOptions& timing, Cost* cost, std::string* what) {
  const bool sb = g.dtype == DType::kBF16 && blas::has_sbgemm();
  const DType dt = sb ? DType::kBF16 : DType::kF32;
  Tensor a = random_uniform(dt, {g.M, g.K}, 1.0f, 11);
  Tensor b = random_uniform(dt, g.b_transposed ? Shape{g.N, g.K} : Shape{g.K, g.N}, 1.0f, 12);
  Tensor c = Tensor::empty(DType::kF32, {g.M, g.N});
  const int64_t ldb = g.b_transposed ? g.K : g.N;
  auto run = [&] {
    if (sb)
      blas::sbgemm(false, g.b_transposed, g.M, g.N, g.K, 1.f, a.data_as<uint16_t>(), g.K,
                   b.data_as<uint16_t>(), ldb, 0.f, c.data_as<float>(), g.N);
    else
      blas::sgemm(false, g.b_transposed, g.M, g.N, g.K, 1.f, a.data_as<float>(), g.K,
                  b.data_as<float>(), ldb, 0.f, c.data_as<float>(), g.N);
  };
  const double in_size = sb ? 2.0 : 4.0;
  cost->add({"GEMM", 2.0 * g.M * g.N * g.K, 0, 0, false});
  cost->add({"read A, B; write C (f32)", 0,
             (static_cast<double>(g.M) * g.K + static_cast<double>(g.K) * g.N) * in_size +
                 static_cast<double>(g.M) * g.N * 4,
             0, false});
  *what = std::string(sb ? "sbgemm bf16 " : "sgemm f32 ") + std::to_string(g.M) + "x" +
          std::to_string(g.K) + "x" + std::to_string(g.N) + " (" + blas::name() + ")";
  return measure(run, timing);
}

// One bench run's shared state: config, messages, progress.
class Driver {
 public:
  explicit Driver(const BenchConfig& cfg)
      : cfg_(cfg), progress_("bench", total_steps(), cfg.progress) {}

  BenchResult run() {
    any_cpu_ = false;
    for (DeviceType d : cfg_.devices) any_cpu_ |= d == DeviceType::kCPU;
    have_blas_ = blas::available() && any_cpu_;
    if ((cfg_.gemm_baseline || cfg_.compare) && !blas::available())
      say("BLAS baselines unavailable: " + blas::unavailable_reason());
    else if ((cfg_.gemm_baseline || cfg_.compare) && !any_cpu_)
      say("host BLAS baselines skipped: no CPU implementation is timed");
    if (have_blas_ && cfg_.exec.num_threads > 0) blas::set_threads(cfg_.exec.num_threads);
    threads_ = resolve_num_threads(cfg_.exec.num_threads);
    if (cfg_.implementations.empty()) say("no implementation to time");
    else
      for (const BenchCase& bc : cfg_.cases) run_case(bc);
    progress_.finish();
    return std::move(res_);
  }

 private:
  int total_steps() const {
    const int per = static_cast<int>(cfg_.implementations.size() * cfg_.passes.size()) + 1 +
                    (cfg_.compare ? static_cast<int>(cfg_.passes.size()) : 0);
    return std::max(1, static_cast<int>(cfg_.cases.size()) * per);
  }

  void say(const std::string& m) {
    res_.messages.push_back(m);
    progress_.note(m);
  }

  void run_case(const BenchCase& bc) {
    progress_.update(step_, "generating inputs for " + bc.label);
    std::unique_ptr<BenchProblem> p;
    try {
      p = bc.make();
    } catch (const Error& e) {
      say("skipping " + bc.label + (e.code() == ErrorCode::kOutOfMemory ? ": cannot allocate the inputs: " : ": ") +
          e.what());
      return;
    }
    gemm_s_.reset();
    device_gemm_s_.clear();
    baseline_s_.clear();
    time_gemm_floor(*p, bc);
    if (cfg_.compare && have_blas_) time_baselines(*p, bc);
    const size_t first_row = res_.rows.size();
    for (size_t i = 0; i < cfg_.implementations.size(); ++i)
      run_implementation(*p, bc, cfg_.implementations[i], cfg_.devices[i]);
    add_version_ratios(first_row);
  }

  // vs_version of this case's rows: a version's median over its base version's median in the
  // same pass (both timed here, in either order).
  void add_version_ratios(size_t first_row) {
    if (cfg_.version_bases.size() != cfg_.implementations.size()) return;
    for (size_t i = first_row; i < res_.rows.size(); ++i) {
      Row& r = res_.rows[i];
      if (r.value("kind", "") != "kernel") continue;
      const std::string impl = r.value("implementation", "");
      std::string base;
      for (size_t k = 0; k < cfg_.implementations.size(); ++k)
        if (cfg_.implementations[k] == impl) base = cfg_.version_bases[k];
      if (base.empty()) continue;
      for (size_t j = first_row; j < res_.rows.size(); ++j) {
        const Row& b = res_.rows[j];
        if (b.value("kind", "") != "kernel" || b.value("implementation", "") != base ||
            b.value("mode", "") != r.value("mode", "") || !b.contains("median_ms") || !r.contains("median_ms"))
          continue;
        const double bm = b["median_ms"].get<double>();
        r["version_base"] = base;
        if (bm > 0) r["vs_version"] = r["median_ms"].get<double>() / bm;
      }
    }
  }

  void time_gemm_floor(BenchProblem& p, const BenchCase& bc) {
    ++step_;
    const auto g = p.gemm_floor();
    if (!g || !cfg_.gemm_baseline || !have_blas_) return;
    progress_.update(step_, "blas-gemm " + bc.label);
    try {
      Cost c;
      std::string what;
      const Timing t = time_host_gemm(*g, cfg_.timing, &c, &what);
      gemm_s_ = t.stats.median;
      Row r = base_row(p, "baseline", "blas-gemm", "cpu", "gemm", bc, threads_);
      fill_rates(r, t, c, "cpu", g->dtype == DType::kBF16 && blas::has_sbgemm() ? "bf16" : "f32",
                 cfg_.roofline);
      r["gemm_count"] = 1;
      r["note"] = what;
      res_.rows.push_back(std::move(r));
    } catch (const Error& e) {
      say("blas-gemm " + bc.label + " failed: " + e.what());
    }
  }

  void time_baselines(BenchProblem& p, const BenchCase& bc) {
    std::vector<BaselineCall> calls;
    try {
      calls = p.baselines(cfg_.passes, threads_);
    } catch (const Error& e) {
      say("baselines of " + bc.label + " unavailable: " + e.what());
      return;
    }
    for (BaselineCall& b : calls) {
      progress_.update(++step_, b.name + " " + pass_name(b.pass) + " " + bc.label);
      try {
        MemoryProbe mem;
        TimingOptions topt = cfg_.timing;
        topt.before_first = [&] { mem.before(); };
        topt.after_first = [&] { mem.after(); };
        const Timing t = measure(b.run, topt);
        baseline_s_[b.pass] = t.stats.median;
        Row r = base_row(p, "baseline", b.name, "cpu", pass_name(b.pass), bc, threads_);
        fill_rates(r, t, b.cost, "cpu", b.roofline_dtype, cfg_.roofline);
        mem.fill(r);
        if (b.loss)
          if (auto l = b.loss(); l && std::isfinite(*l)) r["loss"] = *l;
        r["note"] = b.description;
        res_.rows.push_back(std::move(r));
      } catch (const Error& e) {
        say(b.name + " " + pass_name(b.pass) + " " + bc.label + " failed: " + e.what());
      }
    }
  }

  bool too_big_for_reference(const BenchProblem& p, const std::string& name) const {
    return name == "reference" && p.work() > cfg_.reference_max_work && !cfg_.include_reference_large;
  }

  void run_implementation(BenchProblem& p, const BenchCase& bc, const std::string& name,
                          DeviceType type) {
    const int n = static_cast<int>(cfg_.passes.size());
    if (too_big_for_reference(p, name)) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "work %.3g is above %.3g multiply-adds and the reference is plain double loops "
                    "(minutes or hours here); pass --include-reference to time it anyway",
                    p.work(), cfg_.reference_max_work);
      say("skipping " + name + " on " + bc.label + ": " + buf);
      step_ += n;
      return;
    }
    const Device dev = type == DeviceType::kCPU ? Device::cpu() : Device{type, 0};
    const DeviceHooks* hooks = type == DeviceType::kCPU ? nullptr : device_hooks(type);
    if (type != DeviceType::kCPU && (!hooks || !hooks->synchronize)) {
      say("skipping " + name + " on " + bc.label + ": no device hooks registered for " + dev.str());
      step_ += n;
      return;
    }
    for (Pass pass : cfg_.passes) {
      progress_.update(++step_, name + " " + pass_name(pass) + " " + bc.label);
      try {
        time_pass(p, bc, name, dev, hooks, pass);
      } catch (const Error& e) {
        say(name + " " + pass_name(pass) + " " + bc.label + " failed: " + e.what());
      }
    }
  }

  void time_pass(BenchProblem& p, const BenchCase& bc, const std::string& name, const Device& dev,
                 const DeviceHooks* hooks, Pass pass) {
    const trace::Scope row(trace::enabled() ? trace::intern(name + " " + pass_name(pass) + " " + bc.label) : nullptr);
    ExecOptions exec = cfg_.exec;
    exec.implementation = name;
    BenchCall call = p.bind(name, dev, pass, exec);
    std::function<void()> sync;
    if (hooks) sync = [hooks, dev] { hooks->synchronize(dev.index); };
    // The choices of the first call (prepare's included): later calls repeat them from a table
    // or cache, so their source would hide an autotune.
    auto recorder = std::make_unique<tune::ChoiceRecorder>();
    std::vector<tune::ChoiceRecord> choices;
    if (call.prepare) call.prepare();
    if (sync) sync();
    MemoryProbe mem;
    TimingOptions topt = cfg_.timing;
    topt.before_first = [&] { mem.before(); };
    topt.after_first = [&] {
      mem.after();
      choices = recorder->records();
      recorder.reset();
    };
    if (hooks && hooks->time_call)
      topt.time_one = [hooks, dev](const std::function<void()>& fn) { return hooks->time_call(dev.index, fn); };
    const Timing t = measure(call.run, topt, sync);
    if (recorder) choices = recorder->records(), recorder.reset();
    Row r = base_row(p, "kernel", name, dev.str(), pass_name(pass), bc, threads_);
    fill_block_sizes(r, choices);
    const Cost c = p.cost(pass, name);
    fill_rates(r, t, c, dev.str(), r.value("dtype", "f32"), cfg_.roofline);
    r["timer"] = topt.time_one ? "device events" : hooks ? "host clock after sync" : "host clock";
    mem.fill(r);
    if (!hooks) time_stages(r, call);
    add_ratios(r, p, bc, dev, hooks, pass, t.stats.median);
    if (call.loss)
      if (auto l = call.loss()) r["loss"] = *l;
    std::string note;
    for (const auto& a : c.assumptions) note += (note.empty() ? "" : "; ") + a;
    const std::string ran = call.ran ? call.ran() : name;
    if (ran != name) note += (note.empty() ? "" : "; ") + std::string("ran '") + ran + "'";
    if (!note.empty()) r["note"] = note;
    res_.rows.push_back(std::move(r));
  }

  // Pipeline stages (BenchConfig::stages): each stage's median wall-clock span over traced calls.
  void time_stages(Row& r, const BenchCall& call) {
    if (cfg_.stages.empty() || trace::enabled()) return;
    std::vector<std::vector<double>> ms_of(cfg_.stages.size());
    for (int i = 0; i < std::max(cfg_.stage_runs, 1); ++i) {
      trace::start();
      call.run();
      trace::stop();
      for (size_t s = 0; s < cfg_.stages.size(); ++s) ms_of[s].push_back(trace::span(cfg_.stages[s].scope).ns * 1e-6);
    }
    std::string line;
    for (size_t s = 0; s < cfg_.stages.size(); ++s) {
      std::sort(ms_of[s].begin(), ms_of[s].end());
      const double med = ms_of[s][ms_of[s].size() / 2];
      const std::string& full = cfg_.stages[s].scope;
      const std::string label = full.substr(full.find_last_of('.') + 1);
      r["stage_" + label + "_ms"] = med;
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.3f", med);
      const char* sep = cfg_.stages[s].concurrent ? " || " : " + ";
      line += (line.empty() ? "" : sep) + label + " " + buf + " ms";
    }
    trace::start();  // leave no events behind
    trace::stop();
    r["stages"] = line;
  }

  void add_ratios(Row& r, BenchProblem& p, const BenchCase& bc, const Device& dev,
                  const DeviceHooks* hooks, Pass pass, double median) {
    const auto g = p.gemm_floor();
    if (g && g->count) {
      const int ng = g->count(pass);
      r["gemm_count"] = ng;
      std::optional<double> floor_s;
      if (dev.type == DeviceType::kCPU) {
        floor_s = gemm_s_;
      } else if (hooks && hooks->time_gemm && cfg_.gemm_baseline) {
        auto it = device_gemm_s_.find(dev.str());
        if (it == device_gemm_s_.end()) {
          progress_.note("timing the plain GEMM of " + bc.label + " on " + dev.str());
          it = device_gemm_s_.emplace(dev.str(), hooks->time_gemm(dev.index, g->M, g->N, g->K, g->dtype,
                                                                  g->b_transposed)).first;
        }
        floor_s = it->second;
      }
      if (floor_s && ng > 0) {
        r["gemm_ms"] = ms(*floor_s);
        r["vs_gemm"] = median / (ng * *floor_s);
      }
    }
    if (auto it = baseline_s_.find(pass); it != baseline_s_.end()) {
      r["baseline_ms"] = ms(it->second);
      r["vs_baseline"] = median / it->second;
    }
  }

  const BenchConfig& cfg_;
  BenchResult res_;
  Progress progress_;
  int step_ = 0;
  int threads_ = 1;
  bool any_cpu_ = false, have_blas_ = false;
  std::optional<double> gemm_s_;
  std::map<std::string, std::optional<double>> device_gemm_s_;
  std::map<Pass, double> baseline_s_;
};

}  // namespace

void fill_rates(Row& row, const Timing& t, const Cost& c, const std::string& device,
                const std::string& dtype, const Roofline* roofline) {
  const double med = t.stats.median;
  row["first_call_ms"] = ms(t.first_call_s);
  row["median_ms"] = ms(med);
  row["min_ms"] = ms(t.stats.min);
  row["max_ms"] = ms(t.stats.max);
  row["q1_ms"] = ms(t.stats.q1);
  row["q3_ms"] = ms(t.stats.q3);
  row["samples"] = t.stats.n;
  row["gflop_useful"] = c.flops_useful / 1e9;
  row["gflop_issued"] = c.flops_issued / 1e9;
  row["mbytes_min"] = c.bytes / 1e6;
  row["transcendentals"] = c.transcendentals;
  row["ai"] = c.arithmetic_intensity();
  row["gflops"] = med > 0 ? c.flops_useful / med / 1e9 : 0.0;
  row["gflops_issued"] = med > 0 ? c.flops_issued / med / 1e9 : 0.0;
  row["gbs"] = med > 0 ? c.bytes / med / 1e9 : 0.0;
  row["roofline_gflops"] = nullptr;
  row["roofline_fraction"] = nullptr;
  if (!roofline) return;
  const auto* d = roofline->find(device);
  if (!d) return;
  const PeakLine line = d->peak_line(dtype);
  std::string note = line.note;
  const double ai = c.arithmetic_intensity();
  const double bound = d->attainable_gflops(ai, dtype);
  const double gflops = row["gflops"].get<double>();
  if (!line.line.empty()) row["roofline_line"] = line.line;
  if (const double g = d->attainable_gemm_gflops(ai, dtype); g > 0) {
    row["gemm_line_gflops"] = g;
    row["gemm_line_fraction"] = gflops / g;
  }
  if (bound > 0) {
    const double fraction = gflops / bound;
    row["roofline_gflops"] = bound;
    row["bound"] = line.gflops > 0 && bound >= line.gflops ? "compute" : "memory";
    if (fraction > 1.0) {
      // Faster than the ceiling: the ceilings are stale (measured on a busy machine or another
      // one), not the kernel superhuman. Say so instead of printing it as a result.
      row["roofline_stale"] = true;
      row["roofline_measured_fraction"] = fraction;
      note += std::string(note.empty() ? "" : "; ") + "above 100 % of the stored ceilings (" +
              std::to_string(static_cast<int>(fraction * 100 + 0.5)) +
              " %): they are stale; re-measure with `tessera roofline` on an idle machine";
    } else {
      row["roofline_fraction"] = fraction;
    }
  }
  if (!note.empty()) row["roofline_note"] = note;
}

std::vector<std::string> bench_columns(const std::vector<std::string>& dims) {
  std::vector<std::string> cols = {"kind", "implementation", "device", "mode", "shape"};
  cols.insert(cols.end(), dims.begin(), dims.end());
  for (const char* c : {"dtype", "threads", "timer", "first_call_ms", "median_ms", "min_ms", "max_ms",
                        "q1_ms", "q3_ms", "samples", "gflop_useful", "gflop_issued", "mbytes_min",
                        "transcendentals", "ai", "gflops", "gflops_issued", "gbs", "roofline_gflops",
                        "roofline_fraction", "roofline_line", "bound", "roofline_stale", "gemm_line_gflops",
                        "gemm_line_fraction", "block_sizes", "block_sizes_source", "extra_host_bytes",
                        "extra_device_bytes", "rss_growth_bytes", "gemm_ms", "gemm_count", "vs_gemm",
                        "baseline_ms", "vs_baseline", "version_base", "vs_version", "loss", "roofline_note", "note", "device_kind", "blas_core", "tessera_env"})
    cols.push_back(c);
  return cols;
}

BenchResult run_bench(const BenchConfig& cfg) {
  check(cfg.implementations.size() == cfg.devices.size(), ErrorCode::kInternal,
        "bench: one device per implementation");
  return Driver(cfg).run();
}

}  // namespace tessera::harness
