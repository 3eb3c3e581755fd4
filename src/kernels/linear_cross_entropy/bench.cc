#include "kernels/linear_cross_entropy/bench.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>

#include "core/log.h"
#include "core/memory.h"
#include "harness/blas.h"
#include "harness/device_hooks.h"
#include "harness/process.h"
#include "harness/progress.h"
#include "kernels/linear_cross_entropy/baseline.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "tessera/error.h"

namespace tessera::linear_cross_entropy {
namespace {

using harness::Row;

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
float uniform(uint64_t& s) {  // [-1, 1)
  return static_cast<float>(static_cast<double>(splitmix(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

Tensor random_tensor(DType t, Shape shape, float scale, uint64_t seed) {
  Tensor out = Tensor::empty(t, std::move(shape));
  const int64_t n = out.numel();
  // Split into independent streams so threads fill in parallel and results stay deterministic.
  harness::parallel_for(n, 0, [&](int64_t b, int64_t e) {
    uint64_t s = seed * 0x100000001b3ull + static_cast<uint64_t>(b);
    for (int64_t i = b; i < e; ++i) store_from_f32(out.data(), t, i, scale * uniform(s));
  });
  return out;
}

struct HostInputs {
  Tensor x, w, bias, labels;
};

HostInputs make_inputs(const BenchShape& sh, DType dt, const BenchConfig& cfg) {
  HostInputs in;
  // Logits z = x·W with x, W uniform: scale W by 3/sqrt(H) so z has unit variance.
  in.x = random_tensor(dt, {sh.B, sh.H}, 1.0f, cfg.seed * 3 + 1);
  const float ws = 3.0f / std::sqrt(static_cast<float>(sh.H));
  in.w = random_tensor(dt, cfg.layout == WLayout::kVH ? Shape{sh.V, sh.H} : Shape{sh.H, sh.V}, ws,
                       cfg.seed * 3 + 2);
  if (cfg.bias) in.bias = random_tensor(dt, {sh.V}, 0.5f, cfg.seed * 3 + 3);
  in.labels = Tensor::empty(DType::kI64, {sh.B});
  uint64_t s = cfg.seed * 7919 + 5;
  for (int64_t t = 0; t < sh.B; ++t)
    in.labels.data_as<int64_t>()[t] = static_cast<int64_t>(splitmix(s) % static_cast<uint64_t>(sh.V));
  return in;
}

double ms(double s) { return s * 1e3; }

std::string fmt_bhv(const BenchShape& s) {
  return "B=" + std::to_string(s.B) + ",H=" + std::to_string(s.H) + ",V=" + std::to_string(s.V);
}

// Fills timing, rate and roofline fields of `row` for a measurement with cost `c`.
void fill_rates(Row& row, const harness::Timing& t, const harness::Cost& c, const std::string& device,
                const std::string& dtype, const harness::Roofline* roofline) {
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
  if (roofline) {
    if (const auto* d = roofline->find(device)) {
      std::string note;
      const double peak = d->peak_gflops(dtype, &note);
      const double bound = d->attainable_gflops(c.arithmetic_intensity(), dtype);
      if (bound > 0) {
        row["roofline_gflops"] = bound;
        row["roofline_fraction"] = row["gflops"].get<double>() / bound;
        row["bound"] = bound < peak ? "memory" : "compute";
      }
      if (!note.empty()) row["roofline_note"] = note;
    }
  }
}

}  // namespace

std::vector<std::string> bench_columns() {
  return {"kind", "implementation", "device", "mode", "shape", "B", "H", "V", "dtype", "layout",
          "bias", "soft_cap", "threads", "first_call_ms", "median_ms", "min_ms", "max_ms", "q1_ms",
          "q3_ms", "samples", "gflop_useful", "gflop_issued", "mbytes_min", "transcendentals", "ai",
          "gflops", "gflops_issued", "gbs", "roofline_gflops", "roofline_fraction", "bound",
          "extra_host_bytes", "extra_device_bytes", "rss_growth_bytes", "gemm_ms", "gemm_count",
          "vs_gemm", "baseline_ms", "vs_baseline", "loss", "roofline_note", "note"};
}

BenchResult run_bench(const BenchConfig& cfg) {
  BenchResult res;
  auto say = [&](const std::string& m) {
    res.messages.push_back(m);
    std::fprintf(stderr, "bench: %s\n", m.c_str());
  };

  // Implementations to time.
  std::vector<const Implementation*> impls;
  if (cfg.implementations.empty()) {
    for (const auto* base : registry().implementations()) {
      auto a = base->available();  // a device module's placeholder loads its module here
      const Implementation* i = a.ok ? find_implementation(base->name()) : nullptr;
      if (i)
        impls.push_back(i);
      else
        say("implementation '" + base->name() + "' unavailable here: " + a.reason);
    }
  } else {
    for (const auto& n : cfg.implementations) {
      const dispatch::ImplementationBase* listed = static_cast<const dispatch::RegistryView&>(registry()).find(n);
      if (!listed) {
        std::string names;
        for (const auto* r : registry().implementations()) names += (names.empty() ? "" : ", ") + r->name();
        throw Error(ErrorCode::kNotFound, "no implementation '" + n + "' of " + kKernelName + " (have: " + names + ")");
      }
      auto a = listed->available();
      const Implementation* i = a.ok ? find_implementation(n) : nullptr;
      if (!i) {
        say("implementation '" + n + "' unavailable here: " + a.reason);
        continue;
      }
      impls.push_back(i);
    }
  }

  if (impls.empty()) {
    say("no implementation to time");
    return res;
  }
  // The host BLAS baselines are the ratios of CPU rows (device rows use the device's own GEMM,
  // DeviceHooks::time_gemm): with only device implementations they would cost minutes of host
  // GEMMs at GPU-sized shapes for nothing.
  bool any_cpu = false;
  for (const Implementation* i : impls) any_cpu |= i->device_type() == DeviceType::kCPU;
  const bool have_blas = harness::blas::available() && any_cpu;
  if ((cfg.gemm_baseline || cfg.compare) && !harness::blas::available())
    say("BLAS baselines unavailable: " + harness::blas::unavailable_reason());
  else if ((cfg.gemm_baseline || cfg.compare) && !any_cpu)
    say("host BLAS baselines skipped: no CPU implementation is timed");
  if (have_blas && cfg.threads > 0) harness::blas::set_threads(cfg.threads);
  const int threads = cfg.threads > 0 ? cfg.threads : harness::hardware_threads();

  const int per_sd = static_cast<int>(impls.size() * cfg.passes.size()) + (cfg.gemm_baseline && have_blas ? 1 : 0) +
                     (cfg.compare && have_blas ? static_cast<int>(cfg.passes.size()) : 0);
  const int total = static_cast<int>(cfg.shapes.size() * cfg.dtypes.size()) * per_sd;
  harness::Progress progress("bench", std::max(1, total), cfg.progress);
  int step = 0;

  for (const BenchShape& sh : cfg.shapes) {
    for (DType dt : cfg.dtypes) {
      const std::string dts = dtype_name(dt);
      const std::string label = (sh.name.empty() ? fmt_bhv(sh) : sh.name) + " " + dts;
      progress.note("generating inputs for " + label + " (" + fmt_bhv(sh) + ")");
      HostInputs host;
      try {
        host = make_inputs(sh, dt, cfg);
      } catch (const Error& e) {
        say("skipping " + label + ": cannot allocate the inputs: " + e.what());
        step += per_sd;
        continue;
      }
      CostShape cs;
      cs.B = sh.B, cs.H = sh.H, cs.V = sh.V, cs.dtype = dt, cs.bias = cfg.bias, cs.bias_dtype = dt;
      cs.soft_cap = cfg.soft_cap, cs.grad_dtype = dt;

      auto base_row = [&](const std::string& kind, const std::string& impl, const std::string& device,
                          const std::string& mode) {
        Row r = Row::object();
        r["kind"] = kind;
        r["implementation"] = impl;
        r["device"] = device;
        r["mode"] = mode;
        r["shape"] = sh.name;
        r["B"] = sh.B, r["H"] = sh.H, r["V"] = sh.V;
        r["dtype"] = dts;
        r["layout"] = w_layout_name(cfg.layout);
        r["bias"] = cfg.bias;
        r["soft_cap"] = cfg.soft_cap;
        r["threads"] = threads;
        return r;
      };

      BaselineInputs bin;
      bin.B = sh.B, bin.H = sh.H, bin.V = sh.V, bin.dtype = dt, bin.layout = cfg.layout;
      bin.x = host.x.data(), bin.w = host.w.data(), bin.bias = cfg.bias ? host.bias.data() : nullptr;
      bin.bias_dtype = dt, bin.labels = host.labels.data_as<int64_t>(), bin.soft_cap = cfg.soft_cap;
      bin.threads = threads;

      // Plain GEMM of the same shape.
      std::optional<double> gemm_s;
      if (cfg.gemm_baseline && have_blas) {
        progress.step(++step, "blas-gemm " + label);
        try {
          auto g = make_gemm_baseline(bin);
          const auto t = harness::measure([&] { g->run(); }, cfg.timing);
          gemm_s = t.stats.median;
          const bool sb = dt == DType::kBF16 && harness::blas::has_sbgemm();
          const double in_size = sb ? 2.0 : 4.0;
          harness::Cost c;
          c.add({"GEMM", 2.0 * sh.B * sh.H * sh.V, 0, 0, false});
          c.add({"read x, w; write C (f32)", 0,
                 (static_cast<double>(sh.B) * sh.H + static_cast<double>(sh.H) * sh.V) * in_size +
                     static_cast<double>(sh.B) * sh.V * 4,
                 0, false});
          Row r = base_row("baseline", "blas-gemm", "cpu", "gemm");
          fill_rates(r, t, c, "cpu", sb ? "bf16" : "f32", cfg.roofline);
          r["gemm_count"] = 1;
          r["note"] = g->description();
          res.rows.push_back(std::move(r));
        } catch (const Error& e) {
          say("blas-gemm " + label + " failed: " + e.what());
        }
      }

      // Materialized baseline per pass.
      std::map<Pass, double> baseline_s;
      if (cfg.compare && have_blas) {
        for (Pass pass : cfg.passes) {
          progress.step(++step, std::string("blas-materialized ") + pass_name(pass) + " " + label);
          try {
            auto m = make_materialized_baseline(bin, pass);
            size_t base = 0;
            size_t extra = 0;
            harness::TimingOptions topt = cfg.timing;
            topt.before_first = [&] {
              memory::reset_peak(memory::Space::kHost);
              base = memory::current_bytes(memory::Space::kHost);
            };
            topt.after_first = [&] { extra = memory::peak_bytes(memory::Space::kHost) - base; };
            const auto t = harness::measure([&] { m->run(); }, topt);
            baseline_s[pass] = t.stats.median;
            Row r = base_row("baseline", "blas-materialized", "cpu", pass_name(pass));
            fill_rates(r, t, cost(cs, pass, "blas-materialized"), "cpu", "f32", cfg.roofline);
            r["extra_host_bytes"] = extra;
            if (std::isfinite(m->loss())) r["loss"] = m->loss();
            r["note"] = m->description();
            res.rows.push_back(std::move(r));
          } catch (const Error& e) {
            say(std::string("blas-materialized ") + pass_name(pass) + " " + label + " failed: " + e.what());
          }
        }
      }

      // The device's plain GEMM of the same shape (DeviceHooks::time_gemm), timed once per
      // (shape, dtype, device) on first use by a device row.
      std::map<std::string, std::optional<double>> device_gemm_s;

      for (const Implementation* impl : impls) {
        const std::string name = impl->name();
        auto skip_all = [&](const std::string& why) {
          say("skipping " + name + " on " + label + ": " + why);
          step += static_cast<int>(cfg.passes.size());
        };
        const double bhv = static_cast<double>(sh.B) * sh.H * sh.V;
        if (name == "reference" && bhv > cfg.reference_max_bhv && !cfg.include_reference_large) {
          char buf[256];
          std::snprintf(buf, sizeof buf,
                        "B·H·V = %.3g is above %.3g and the reference is plain double loops (minutes "
                        "or hours here); pass --include-reference to time it anyway",
                        bhv, cfg.reference_max_bhv);
          skip_all(buf);
          continue;
        }
        const DeviceType dtype_dev = impl->device_type();
        const Device dev = dtype_dev == DeviceType::kCPU ? Device::cpu() : Device::cuda(0);
        std::function<void()> sync;
        if (dtype_dev != DeviceType::kCPU) {
          const auto* hooks = harness::device_hooks(dtype_dev);
          if (!hooks || !hooks->synchronize) {
            skip_all("no device hooks registered for " + dev.str() +
                     " (the backend must call harness::register_device_hooks to be timed)");
            continue;
          }
          sync = [hooks, dev] { hooks->synchronize(dev.index); };
        }
        // Inputs and outputs on the implementation's device.
        Tensor x, w, bias, labels, loss, lse, dx, dw, dbias, grad_loss;
        try {
          x = host.x.to(dev), w = host.w.to(dev), labels = host.labels.to(dev);
          if (cfg.bias) bias = host.bias.to(dev);
          loss = Tensor::zeros(DType::kF32, {}, dev);
          lse = Tensor::zeros(DType::kF32, {sh.B}, dev);
          Tensor one = Tensor::empty(DType::kF32, {});
          one.data_as<float>()[0] = 1.0f;
          grad_loss = one.to(dev);
          bool any_bwd = false;
          for (Pass p : cfg.passes) any_bwd |= p != Pass::kForward;
          if (any_bwd) {
            dx = Tensor::zeros(dt, {sh.B, sh.H}, dev);
            dw = Tensor::zeros(dt, w.shape(), dev);
            if (cfg.bias) dbias = Tensor::zeros(dt, {sh.V}, dev);
          }
        } catch (const Error& e) {
          skip_all(std::string("cannot place inputs / outputs on ") + dev.str() + ": " + e.what());
          continue;
        }
        Inputs in;
        in.x = x, in.w = w, in.labels = labels;
        if (cfg.bias) in.bias = bias.view();
        ForwardOutputs fo{loss, lse, std::nullopt};
        Gradients gr;
        if (dx.defined()) {
          gr.dx = dx, gr.dw = dw;
          if (cfg.bias) gr.dbias = dbias.view();
        }
        Options opt;
        opt.implementation = name;
        opt.num_threads = cfg.threads;
        opt.check_finite = cfg.check_finite;
        opt.soft_cap = cfg.soft_cap;
        opt.w_layout = cfg.layout;

        for (Pass pass : cfg.passes) {
          progress.step(++step, name + " " + pass_name(pass) + " " + label);
          std::function<void()> fn;
          switch (pass) {
            case Pass::kForward: fn = [&] { forward(in, fo, opt); }; break;
            case Pass::kBackward: fn = [&] { backward(in, grad_loss, gr, opt, lse.view()); }; break;
            case Pass::kFused: fn = [&] { forward_backward(in, grad_loss, fo, gr, opt); }; break;
          }
          try {
            if (pass == Pass::kBackward) {  // backward takes the forward's lse
              forward(in, fo, opt);
              if (sync) sync();
            }
            size_t hbase = 0, dbase = 0, hextra = 0, dextra = 0;
            std::optional<size_t> rss0, rss_growth;
            bool rss_reset = false;
            harness::TimingOptions topt = cfg.timing;
            topt.before_first = [&] {
              memory::reset_peak(memory::Space::kHost);
              memory::reset_peak(memory::Space::kDevice);
              hbase = memory::current_bytes(memory::Space::kHost);
              dbase = memory::current_bytes(memory::Space::kDevice);
              rss_reset = harness::reset_peak_rss();
              rss0 = harness::rss_bytes();
            };
            topt.after_first = [&] {
              hextra = memory::peak_bytes(memory::Space::kHost) - hbase;
              dextra = memory::peak_bytes(memory::Space::kDevice) - dbase;
              auto peak = harness::peak_rss_bytes();
              if (rss_reset && rss0 && peak) rss_growth = *peak > *rss0 ? *peak - *rss0 : 0;
            };
            // Device rows: start the clock on an idle device; measure() syncs after every call, so
            // each sample is host wall time of one call until its device work is finished
            // (the cuda backend synchronizes once per call anyway, so launch overhead is part of
            // what a caller sees).
            if (sync) sync();
            const auto t = harness::measure(fn, topt, sync);
            const std::string ran = last_implementation();
            Row r = base_row("kernel", name, dev.str(), pass_name(pass));
            const harness::Cost c = cost(cs, pass, name);
            fill_rates(r, t, c, dev.str(), dts, cfg.roofline);
            r["extra_host_bytes"] = hextra;
            r["extra_device_bytes"] = dextra;
            r["rss_growth_bytes"] = rss_growth ? nlohmann::json(*rss_growth) : nlohmann::json(nullptr);
            const int ng = useful_gemms(pass);
            r["gemm_count"] = ng;
            if (gemm_s && dtype_dev == DeviceType::kCPU) {
              r["gemm_ms"] = ms(*gemm_s);
              r["vs_gemm"] = t.stats.median / (ng * *gemm_s);
            } else if (dtype_dev != DeviceType::kCPU) {
              const auto* hooks = harness::device_hooks(dtype_dev);
              if (hooks && hooks->time_gemm) {
                auto it = device_gemm_s.find(dev.str());
                if (it == device_gemm_s.end()) {
                  progress.note("timing the plain GEMM of " + label + " on " + dev.str());
                  it = device_gemm_s
                           .emplace(dev.str(), hooks->time_gemm(dev.index, sh.B, sh.V, sh.H, dt,
                                                                 cfg.layout == WLayout::kVH))
                           .first;
                }
                if (const auto& g = it->second) {
                  r["gemm_ms"] = ms(*g);
                  r["vs_gemm"] = t.stats.median / (ng * *g);
                }
              }
            }
            if (auto it = baseline_s.find(pass); it != baseline_s.end()) {
              r["baseline_ms"] = ms(it->second);
              r["vs_baseline"] = t.stats.median / it->second;
            }
            if (pass != Pass::kBackward)
              r["loss"] = dev.type == DeviceType::kCPU ? loss.data_as<float>()[0]
                                                       : loss.to(Device::cpu()).data_as<float>()[0];
            std::string note;
            for (const auto& a : c.assumptions) note += (note.empty() ? "" : "; ") + a;
            if (ran != name) note += (note.empty() ? "" : "; ") + std::string("ran '") + ran + "'";
            if (!note.empty()) r["note"] = note;
            res.rows.push_back(std::move(r));
          } catch (const Error& e) {
            say(name + " " + pass_name(pass) + " " + label + " failed: " + e.what());
          }
        }
      }
    }
  }
  return res;
}

}  // namespace tessera::linear_cross_entropy
