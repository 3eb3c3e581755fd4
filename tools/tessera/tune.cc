// tessera tune: sweeps the bounded block-size candidates of a kernel over its shape buckets,
// writes every measurement to CSV and JSON, and with --emit-table regenerates the kernel's
// checked-in tuned table. See docs/TUNING.md.
#include <fmt/core.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/time.h"
#include "dispatch/dispatch.h"
#include "kernels/linear_cross_entropy/impl.h"
#include "kernels/linear_cross_entropy/tuning.h"
#include "tessera/commands.h"
#include "tessera/error.h"
#include "tune/progress.h"
#include "tune/records.h"
#include "tune/sweep.h"
#include "tune/table.h"

namespace tessera::cli {
namespace {

namespace lce = linear_cross_entropy;
namespace fs = std::filesystem;

struct TuneArgs {
  std::string kernel;
  std::string impls;    // comma list; "" = every tunable, available implementation
  std::string buckets;  // comma list; "" = all
  std::string dtypes = "f32,bf16";
  std::string op = "forward_backward";
  std::string out = "tune-results";
  bool emit_table = false;
  std::string table = "src/kernels/linear_cross_entropy/tuned_table.cc";
  int warmup = 1;
  int repeats = 3;
  std::string shape;  // "B,H,V": time at this shape instead of the buckets' representatives
  bool list = false;
};

std::string ms_str(double ms) { return fmt::format("{:.3f} ms", ms); }


std::vector<const lce::Implementation*> pick_implementations(const std::string& names) {
  std::vector<const lce::Implementation*> out;
  if (names.empty()) {
    for (const auto* base : lce::registry().implementations()) {
      // find() gives the kernel's implementation (a device module's is loaded first).
      const lce::Implementation* impl = base->available().ok ? lce::find_implementation(base->name()) : nullptr;
      if (impl && impl->tunable()) out.push_back(impl);
    }
    return out;
  }
  for (const std::string& n : dispatch::split_names(names)) {
    const lce::Implementation* impl = lce::find_implementation(n);
    if (!impl) {
      // Listed but not loadable (a device module's implementation without its device), or unknown.
      const auto* listed = static_cast<const dispatch::RegistryView&>(lce::registry()).find(n);
      if (listed)
        throw Error(ErrorCode::kUnsupported, "implementation '" + n + "' cannot run here: " + listed->available().reason);
      throw Error(ErrorCode::kNotFound, std::string(lce::kKernelName) + ": unknown implementation '" + n + "'");
    }
    if (!impl->tunable())
      throw Error(ErrorCode::kInvalidArgument, "implementation '" + n + "' has no tunable block sizes");
    const auto a = impl->available();
    if (!a.ok) throw Error(ErrorCode::kUnsupported, "implementation '" + n + "' cannot run here: " + a.reason);
    out.push_back(impl);
  }
  return out;
}

std::vector<const tune::Bucket*> pick_buckets(const std::string& names) {
  std::vector<const tune::Bucket*> out;
  const auto& all = lce::tuning_buckets();
  if (names.empty()) {
    for (const auto& b : all) out.push_back(&b);
    return out;
  }
  for (const std::string& n : dispatch::split_names(names)) {
    const tune::Bucket* found = nullptr;
    for (const auto& b : all)
      if (b.name == n) found = &b;
    if (!found) {
      std::string known;
      for (const auto& b : all) known += (known.empty() ? "" : ", ") + b.name;
      throw Error(ErrorCode::kInvalidArgument, "unknown bucket '" + n + "' (known: " + known + ")");
    }
    out.push_back(found);
  }
  return out;
}

// A problem with a shape but no data (enough to list candidates).
lce::Problem shape_only(const std::vector<int64_t>& s, DType dtype, const lce::Implementation& impl) {
  lce::Problem p;
  p.B = s[0];
  p.H = s[1];
  p.V = s[2];
  p.dtype = dtype;
  p.device = Device{impl.device_type(), 0};
  p.num_threads = 1;
  return p;
}

void run_tune(const TuneArgs& a) {
  if (a.kernel != lce::kKernelName)
    throw Error(ErrorCode::kNotFound, "tune: unknown kernel '" + a.kernel + "' (known: " + lce::kKernelName + ")");
  const lce::Op op = lce::parse_op(a.op);
  const auto impls = pick_implementations(a.impls);
  const auto buckets = pick_buckets(a.buckets);
  std::vector<DType> dtypes;
  for (const std::string& d : dispatch::split_names(a.dtypes)) {
    const DType t = parse_dtype(d);
    if (!is_float(t)) throw Error(ErrorCode::kInvalidArgument, "tune: --dtype must be float types, got " + d);
    dtypes.push_back(t);
  }

  std::vector<int64_t> shape_override;
  if (!a.shape.empty()) {
    for (const std::string& d : dispatch::split_names(a.shape)) {
      int64_t v = 0;
      try {
        size_t pos = 0;
        v = std::stoll(d, &pos);
        if (pos != d.size()) v = 0;
      } catch (...) {
        v = 0;
      }
      if (v < 1) throw Error(ErrorCode::kInvalidArgument, "tune: --shape wants B,H,V (positive integers), got '" + a.shape + "'");
      shape_override.push_back(v);
    }
    if (shape_override.size() != 3)
      throw Error(ErrorCode::kInvalidArgument, "tune: --shape wants B,H,V, got '" + a.shape + "'");
    for (const tune::Bucket* b : buckets)
      if (!tune::match_bucket({*b}, shape_override))
        throw Error(ErrorCode::kInvalidArgument, "tune: --shape " + a.shape + " is outside bucket '" + b->name +
                                                     "' (" + tune::ranges_str(*b) + ")");
  }
  auto shape_of = [&](const tune::Bucket& b) {
    return shape_override.empty() ? tune::representative_shape(b) : shape_override;
  };
  if (a.emit_table) {  // fail before timing anything
    const fs::path parent = fs::path(a.table).parent_path();
    if (!fs::is_directory(parent.empty() ? fs::path(".") : parent))
      throw Error(ErrorCode::kIo, "tune: no directory for " + a.table +
                                      " (run from the repository root or pass --table PATH)");
  }

  if (a.list) {
    for (const tune::Bucket* b : buckets)
      fmt::print("{:<12} {:<36} representative {}  ({})\n", b->name, tune::ranges_str(*b),
                 tune::shape_str(*b, tune::representative_shape(*b)), b->description);
    for (const auto* impl : impls)
      for (const tune::Bucket* b : buckets) {
        const auto cands = lce::tuning_candidates(*impl, shape_only(shape_of(*b), dtypes.at(0), *impl));
        fmt::print("{} {}: {} candidates:", impl->name(), b->name, cands.size());
        for (const auto& c : cands) fmt::print(" [{}]", c.str());
        fmt::print("\n");
      }
    return;
  }

  if (impls.empty())
    fmt::print(stderr, "tessera tune: no tunable implementation is available in this build; nothing to time\n");

  size_t total = 0;
  for (const auto* impl : impls)
    for (DType d : dtypes)
      for (const tune::Bucket* b : buckets) total += lce::tuning_candidates(*impl, shape_only(shape_of(*b), d, *impl)).size();

  std::vector<tune::Record> records;
  std::vector<tune::TableEntry> winners;
  struct Summary { std::string impl, dtype, bucket, shape, winner; double best = 0, dflt = 0; };
  std::vector<Summary> summary;
  total *= static_cast<size_t>(1 + a.warmup + a.repeats);  // runs, not candidates
  size_t steps_done = 0;
  tune::Progress progress(total);
  tune::SweepPolicy policy;
  policy.warmup = a.warmup;
  policy.repeats = a.repeats;
  policy.min_repeats = a.repeats;
  const std::string date = tune::today();

  for (const auto* impl : impls) {
    for (DType dtype : dtypes) {
      for (const tune::Bucket* b : buckets) {
        const auto shape = shape_of(*b);
        const std::string shape_s = tune::shape_str(*b, shape);
        lce::OwnedProblem owned =
            lce::make_random_problem(shape[0], shape[1], shape[2], dtype, Device{impl->device_type(), 0});
        const lce::Problem& p = owned.problem;
        const std::string kind = impl->device_kind(p);
        const auto cands = lce::tuning_candidates(*impl, p);
        std::vector<tune::Params> params;
        for (const auto& c : cands) params.push_back(lce::to_params(c));
        const std::string label = impl->name() + " " + dtype_name(dtype) + " " + b->name;
        tune::SweepResult r;
        const size_t base = steps_done;
        steps_done += params.size() * static_cast<size_t>(1 + policy.warmup + policy.repeats);
        const auto support = impl->supports(p);
        if (!support.ok) {
          for (const auto& c : params) {
            tune::Measurement m;
            m.candidate = c;
            m.status = tune::Measurement::Status::kFailed;
            m.failure = "unsupported: " + support.reason;
            r.measurements.push_back(m);
          }
          progress.note(label + ": skipped, " + impl->name() + " cannot run it: " + support.reason);
        } else {
          const tune::RunFn run = lce::make_timed_run(*impl, p, op);
          size_t done = 0;
          std::string best_s;
          r = tune::sweep(
              params, run, policy,
              [&](size_t i, const char* phase) {
                progress.update(base + done, label + " " + tune::params_str(params[i]) + " (" + phase + ")", best_s);
              },
              [&](const tune::SweepTick& t) {
                done = t.done;
                if (t.best >= 0) best_s = ms_str(t.best_ms) + " " + tune::params_str(params[static_cast<size_t>(t.best)]);
                progress.update(base + done,
                                label + " " + tune::params_str(params[t.index]) + " " + t.phase + " " +
                                    (t.seconds < 0 ? std::string("failed") : ms_str(t.seconds * 1e3)),
                                best_s);
              });
        }
        for (const auto& m : r.measurements)
          if (m.status == tune::Measurement::Status::kFailed && support.ok)
            progress.note(label + " " + tune::params_str(m.candidate) + ": failed: " + m.failure);
        if (r.best >= 0) {
          const auto& w = r.measurements[static_cast<size_t>(r.best)];
          const auto& d = r.measurements[0];
          progress.note(label + " " + shape_s + ": best " + tune::params_str(w.candidate) + " " +
                        ms_str(w.median_ms) +
                        (d.ok() ? fmt::format(" (default {} {}, {:.2f}x)", tune::params_str(d.candidate),
                                              ms_str(d.median_ms), d.median_ms / w.median_ms)
                                : std::string(" (default failed)")));
        }
        for (const auto& m : r.measurements)
          records.push_back({lce::kKernelName, impl->name(), kind, dtype_name(dtype), b->name,
                             lce::op_name(op), shape_s, m});
        Summary s{impl->name(), dtype_name(dtype), b->name, shape_s, "(none ran)"};
        if (r.best >= 0) {
          const auto& w = r.measurements[static_cast<size_t>(r.best)];
          s.winner = tune::params_str(w.candidate);
          s.best = w.median_ms;
          if (!r.measurements.empty() && r.measurements[0].ok()) s.dflt = r.measurements[0].median_ms;
          winners.push_back({impl->name(), kind, dtype_name(dtype), b->name, w.candidate, shape_s,
                             lce::op_name(op), w.median_ms, date});
        }
        summary.push_back(s);
      }
    }
  }
  progress.finish();

  std::error_code ec;
  fs::create_directories(a.out, ec);
  if (ec) throw Error(ErrorCode::kIo, "tune: cannot create " + a.out + ": " + ec.message());
  const std::string stem = (fs::path(a.out) / (std::string(lce::kKernelName) + "_" + utc_now("%Y%m%d-%H%M%S"))).string();
  nlohmann::json meta = {{"kernel", lce::kKernelName}, {"version", TESSERA_VERSION}, {"date", date},
                         {"op", lce::op_name(op)}, {"warmup", a.warmup}, {"repeats", a.repeats}};
  tune::write_csv(stem + ".csv", records);
  tune::write_json(stem + ".json", records, meta);

  if (!summary.empty()) {
    fmt::print("{:<6} {:<5} {:<11} {:<24} {:<24} {:>12} {:>12} {:>8}\n", "impl", "dtype", "bucket",
               "shape", "winner", "winner", "default", "speedup");
    for (const auto& s : summary)
      fmt::print("{:<6} {:<5} {:<11} {:<24} {:<24} {:>12} {:>12} {:>8}\n", s.impl, s.dtype, s.bucket,
                 s.shape, s.winner, s.best > 0 ? ms_str(s.best) : "-", s.dflt > 0 ? ms_str(s.dflt) : "-",
                 s.best > 0 && s.dflt > 0 ? fmt::format("{:.2f}x", s.dflt / s.best) : "-");
  }
  fmt::print("raw results: {}.csv, {}.json\n", stem, stem);

  if (a.emit_table) {
    tune::TableSource src;
    src.kernel = lce::kKernelName;
    src.include = "kernels/linear_cross_entropy/tuning.h";
    src.cpp_namespace = "tessera::linear_cross_entropy";
    src.function = "tuned_table";
    src.regenerate = "tessera tune linear_cross_entropy --emit-table   (from the repository root, "
                     "on the machine to tune; rebuild first: rows of other machines are kept)";
    src.empty_note = "No rows: no tunable implementation was measured yet. Every lookup misses and "
                     "falls to autotune-on-miss or the backend defaults.";
    const auto rows = tune::merge_tables(lce::tuned_table(), winners);
    const std::string text = tune::emit_table_cc(src, rows, date);
    const std::string tmp = a.table + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << text;
      if (!out) throw Error(ErrorCode::kIo, "tune: cannot write " + tmp);
    }
    fs::rename(tmp, a.table, ec);
    if (ec) throw Error(ErrorCode::kIo, "tune: cannot write " + a.table + ": " + ec.message());
    fmt::print("wrote {} ({} rows, {} from this run); rebuild to use it\n", a.table, rows.size(), winners.size());
  }
}

}  // namespace

void register_tune(CLI::App& app) {
  auto a = std::make_shared<TuneArgs>();
  auto* cmd = app.add_subcommand("tune", "Sweep block-size candidates over shape buckets; write raw "
                                         "results and (--emit-table) the tuned table");
  cmd->add_option("kernel", a->kernel, "Kernel to tune (linear_cross_entropy)")->required();
  cmd->add_option("--impl", a->impls, "Implementations, comma-separated (default: every tunable one available)");
  cmd->add_option("--buckets", a->buckets, "Shape buckets, comma-separated (default: all)");
  cmd->add_option("--dtype", a->dtypes, "Input dtypes, comma-separated")->capture_default_str();
  cmd->add_option("--op", a->op, "What is timed: forward, backward or forward_backward")->capture_default_str();
  cmd->add_option("--out", a->out, "Directory for the raw CSV / JSON results")->capture_default_str();
  cmd->add_flag("--emit-table", a->emit_table, "Regenerate the kernel's tuned_table.cc from the winners");
  cmd->add_option("--table", a->table, "Path of the tuned table to write")->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "Untimed runs per candidate after its first call")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--repeats", a->repeats, "Timed runs per candidate (median)")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--shape", a->shape, "Time at B,H,V instead of each bucket's representative shape (must lie in the buckets)");
  cmd->add_flag("--list", a->list, "List buckets and candidates without timing anything");
  cmd->callback([a] { run_tune(*a); });
}

}  // namespace tessera::cli
