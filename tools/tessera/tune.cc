// tessera tune KERNEL: sweeps the bounded block-size candidates of a kernel over its shape
// buckets, writes every measurement to CSV and JSON, and with --emit-table regenerates the
// kernel's checked-in tuned table (written atomically). See docs/TUNING.md.
#include <fmt/core.h>

#include <filesystem>
#include <fstream>

#include "common.h"
#include "core/progress.h"
#include "core/time.h"
#include "dispatch/dispatch.h"
#include "harness/table.h"
#include "tessera/error.h"
#include "tune/records.h"
#include "tune/sweep.h"
#include "tune/table.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

struct TuneArgs {
  std::string impls;    // comma list; "" = every tunable, available implementation
  std::string buckets;  // comma list; "" = all
  std::string dtypes = "f32,bf16";
  std::vector<std::string> passes;  // one pass; default fused (or the kernel's last)
  std::string out = "tune-results";
  bool emit_table = false;
  std::string table;    // default: the kernel's table_path
  int warmup = 1;
  int repeats = 3;
  std::string shape;    // time at this shape instead of the buckets' representatives
  bool list = false;
};

std::string ms_str(double ms) { return fmt::format("{:.3f} ms", ms); }

struct Summary {
  std::string impl, dtype, bucket, shape, winner = "(none ran)";
  double best = 0, dflt = 0;
};

// Everything one `tessera tune` run decided before timing anything.
struct Plan {
  const kernels::KernelSpec* k = nullptr;
  std::vector<std::string> impls;
  std::vector<const tune::Bucket*> buckets;
  std::vector<DType> dtypes;
  Pass pass = Pass::kFused;
  std::vector<int64_t> shape_override;
  std::vector<int64_t> shape_of(const tune::Bucket& b) const {
    return shape_override.empty() ? tune::representative_shape(b) : shape_override;
  }
};

std::vector<std::string> pick_tunable(const kernels::KernelSpec& k, const std::string& names) {
  const bool all = names.find_first_not_of(" ,") == std::string::npos;  // skip, don't fail
  std::vector<std::string> out;
  for (const std::string& n : kernels::pick_implementations(k, names, true)) {
    if (!k.tune.tunable(n)) {
      if (all) continue;
      throw Error(ErrorCode::kInvalidArgument, "implementation '" + n + "' has no tunable block sizes");
    }
    const dispatch::Availability a = k.implementations().find(n)->available();
    if (!a.ok) {
      if (all) continue;
      throw Error(ErrorCode::kUnsupported, "implementation '" + n + "' cannot run here: " + a.reason);
    }
    out.push_back(n);
  }
  return out;
}

std::vector<const tune::Bucket*> pick_buckets(const kernels::KernelSpec& k, const std::string& names) {
  std::vector<const tune::Bucket*> out;
  const auto& all = k.tune.buckets();
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

std::vector<int64_t> parse_shape(const std::string& s, const kernels::KernelSpec& k,
                                 const std::vector<const tune::Bucket*>& buckets) {
  std::string want;
  for (const auto& d : k.dims) want += (want.empty() ? "" : ",") + d;
  std::vector<int64_t> out;
  for (const std::string& d : dispatch::split_names(s)) {
    int64_t v = 0;
    try {
      size_t pos = 0;
      v = std::stoll(d, &pos);
      if (pos != d.size()) v = 0;
    } catch (...) {
      v = 0;
    }
    check(v >= 1, ErrorCode::kInvalidArgument, "tune: --shape wants " + want + " (positive integers), got '" + s + "'");
    out.push_back(v);
  }
  check(out.size() == k.dims.size(), ErrorCode::kInvalidArgument, "tune: --shape wants " + want + ", got '" + s + "'");
  for (const tune::Bucket* b : buckets)
    check(tune::match_bucket({*b}, out) != nullptr, ErrorCode::kInvalidArgument,
          "tune: --shape " + s + " is outside bucket '" + b->name + "' (" + tune::ranges_str(*b) + ")");
  return out;
}

Plan make_plan(const kernels::KernelSpec& k, const TuneArgs& a) {
  Plan p;
  p.k = &k;
  p.impls = pick_tunable(k, a.impls);
  p.buckets = pick_buckets(k, a.buckets);
  p.dtypes = parse_float_dtypes(a.dtypes, k);
  const auto passes = parse_passes(a.passes, k);
  check(a.passes.empty() || passes.size() == 1, ErrorCode::kInvalidArgument, "tune: --pass takes one pass");
  p.pass = a.passes.empty() ? k.passes.back() : passes.front();
  if (!a.shape.empty()) p.shape_override = parse_shape(a.shape, k, p.buckets);
  return p;
}

void list_candidates(const Plan& p) {
  for (const tune::Bucket* b : p.buckets)
    fmt::print("{:<12} {:<36} representative {}  ({})\n", b->name, tune::ranges_str(*b),
               tune::shape_str(*b, tune::representative_shape(*b)), b->description);
  for (const std::string& impl : p.impls)
    for (const tune::Bucket* b : p.buckets) {
      const auto job = p.k->tune.job(impl, p.shape_of(*b), p.dtypes.at(0), p.pass, false);
      fmt::print("{} {}: {} candidates:", impl, b->name, job.candidates.size());
      for (const auto& c : job.candidates) fmt::print(" [{}]", tune::params_str(c));
      fmt::print("\n");
    }
}

// The sweep of one (implementation, dtype, bucket), with progress.
tune::SweepResult sweep_one(const kernels::TuneJob& job, const tune::SweepPolicy& policy, Progress& progress,
                            size_t base, const std::string& label) {
  tune::SweepResult r;
  if (!job.support.ok) {
    for (const auto& c : job.candidates) {
      tune::Measurement m;
      m.candidate = c;
      m.status = tune::Measurement::Status::kFailed;
      m.failure = "unsupported: " + job.support.reason;
      r.measurements.push_back(m);
    }
    progress.note(label + ": skipped, cannot run it: " + job.support.reason);
    return r;
  }
  const tune::Runner run = job.make_run();
  const auto& params = job.candidates;
  size_t done = 0;
  std::string best_s;
  return tune::sweep(
      params, run, policy,
      [&](size_t i, const char* phase) {
        progress.update(base + done, label + " " + tune::params_str(params[i]) + " (" + phase + ")", best_s);
      },
      [&](const tune::SweepTick& t) {
        done = t.done;
        if (t.best >= 0) best_s = ms_str(t.best_ms) + " " + tune::params_str(params[static_cast<size_t>(t.best)]);
        progress.update(base + done, label + " " + tune::params_str(params[t.index]) + " " + t.phase + " " +
                                         (t.seconds < 0 ? std::string("failed") : ms_str(t.seconds * 1e3)),
                        best_s);
      });
}

void report_sweep(const tune::SweepResult& r, bool supported, Progress& progress, const std::string& label) {
  for (const auto& m : r.measurements) {
    if (m.status == tune::Measurement::Status::kFailed && supported)
      progress.note(label + " " + tune::params_str(m.candidate) + ": failed: " + m.failure);
    if (m.status == tune::Measurement::Status::kWrong)  // a kernel bug: never a winner
      progress.note(label + " " + tune::params_str(m.candidate) + ": WRONG: " + m.failure);
  }
  if (!r.unchecked.empty()) progress.note(label + ": " + r.unchecked);
  if (r.best < 0) return;
  const auto& w = r.measurements[static_cast<size_t>(r.best)];
  const auto& d = r.measurements[0];
  progress.note(label + ": best " + tune::params_str(w.candidate) + " " + ms_str(w.median_ms) +
                (d.ok() ? fmt::format(" (default {} {}, {:.2f}x)", tune::params_str(d.candidate),
                                      ms_str(d.median_ms), d.median_ms / w.median_ms)
                        : std::string(" (default failed)")));
}

void print_summary(const std::vector<Summary>& summary) {
  if (summary.empty()) return;
  fmt::print("{:<8} {:<5} {:<11} {:<24} {:<24} {:>12} {:>12} {:>8}\n", "impl", "dtype", "bucket", "shape",
             "winner", "winner", "default", "speedup");
  for (const auto& s : summary)
    fmt::print("{:<8} {:<5} {:<11} {:<24} {:<24} {:>12} {:>12} {:>8}\n", s.impl, s.dtype, s.bucket, s.shape,
               s.winner, s.best > 0 ? ms_str(s.best) : "-", s.dflt > 0 ? ms_str(s.dflt) : "-",
               s.best > 0 && s.dflt > 0 ? fmt::format("{:.2f}x", s.dflt / s.best) : "-");
}

void emit_table(const kernels::KernelSpec& k, const std::string& path, const std::vector<tune::TableEntry>& winners,
                const std::string& date) {
  const auto rows = tune::merge_tables(k.tune.table(), winners);
  harness::write_text_file(path, tune::emit_table_cc(k.tune.source, rows, date));  // atomic
  fmt::print("wrote {} ({} rows, {} from this run); rebuild to use it\n", path, rows.size(), winners.size());
}

void run_tune(const kernels::KernelSpec& k, const TuneArgs& a) {
  const Plan p = make_plan(k, a);
  const std::string table = a.table.empty() ? k.tune.table_path : a.table;
  check(a.table.empty() || a.emit_table, ErrorCode::kInvalidArgument, "--table names the file --emit-table writes: "
        "give both (without --emit-table no table is written)");
  if (a.emit_table) {  // fail before timing anything
    const fs::path parent = fs::path(table).parent_path();
    check(fs::is_directory(parent.empty() ? fs::path(".") : parent), ErrorCode::kIo,
          "tune: no directory for " + table + " (run from the repository root or pass --table PATH)");
  }
  check_outputs({{"--table", a.emit_table ? table : ""}}, {{"--out", a.list ? "" : a.out}});
  if (a.list) return list_candidates(p);
  if (p.impls.empty())
    fmt::print(stderr, "tessera tune: no tunable implementation is available in this build; nothing to time\n");

  tune::SweepPolicy policy;
  policy.warmup = a.warmup;
  policy.repeats = a.repeats;
  policy.min_repeats = a.repeats;
  const size_t runs_per = static_cast<size_t>(1 + a.warmup + a.repeats);
  size_t total = 0;
  for (const auto& impl : p.impls)
    for (DType d : p.dtypes)
      for (const tune::Bucket* b : p.buckets) total += k.tune.job(impl, p.shape_of(*b), d, p.pass, false).candidates.size();
  Progress progress("tune", total * runs_per);
  const std::string date = tune::today();
  std::vector<tune::Record> records;
  std::vector<tune::TableEntry> winners;
  std::vector<Summary> summary;
  size_t steps = 0;
  for (const auto& impl : p.impls)
    for (DType dtype : p.dtypes)
      for (const tune::Bucket* b : p.buckets) {
        const auto shape = p.shape_of(*b);
        const std::string shape_s = tune::shape_str(*b, shape);
        const kernels::TuneJob job = k.tune.job(impl, shape, dtype, p.pass, true);
        const std::string label = impl + " " + dtype_name(dtype) + " " + b->name;
        const size_t base = steps;
        steps += job.candidates.size() * runs_per;
        const tune::SweepResult r = sweep_one(job, policy, progress, base, label);
        report_sweep(r, job.support.ok, progress, label + " " + shape_s);
        for (const auto& m : r.measurements)
          records.push_back({k.name, impl, job.device_kind, dtype_name(dtype), b->name, pass_name(p.pass), shape_s, m});
        Summary s{impl, dtype_name(dtype), b->name, shape_s};
        if (r.best >= 0) {
          const auto& w = r.measurements[static_cast<size_t>(r.best)];
          s.winner = tune::params_str(w.candidate);
          s.best = w.median_ms;
          if (r.measurements[0].ok()) s.dflt = r.measurements[0].median_ms;
          winners.push_back({impl, job.device_kind, dtype_name(dtype), b->name, w.candidate, shape_s,
                             pass_name(p.pass), w.median_ms, date});
        }
        summary.push_back(s);
      }
  progress.finish();
  if (records.empty()) {  // no implementation, bucket or candidate: no empty result files either
    fmt::print(stderr, "tune: nothing was timed\n");
    return set_exit_code(1);
  }

  std::error_code ec;
  fs::create_directories(a.out, ec);
  check(!ec, ErrorCode::kIo, "tune: cannot create " + a.out + ": " + ec.message());
  const std::string stem = (fs::path(a.out) / (k.name + "_" + utc_now("%Y%m%d-%H%M%S"))).string();
  const nlohmann::json meta = {{"kernel", k.name}, {"version", TESSERA_VERSION}, {"date", date},
                               {"pass", pass_name(p.pass)}, {"warmup", a.warmup}, {"repeats", a.repeats}};
  tune::write_csv(stem + ".csv", records);
  tune::write_json(stem + ".json", records, meta);
  print_summary(summary);
  fmt::print("raw results: {}.csv, {}.json\n", stem, stem);
  if (a.emit_table) emit_table(k, table, winners, date);
}

void add_kernel(CLI::App* tune, const kernels::KernelSpec& k) {
  auto a = std::make_shared<TuneArgs>();
  std::string dims;
  for (const auto& d : k.dims) dims += (dims.empty() ? "" : ",") + d;
  auto* cmd = tune->add_subcommand(k.name, "Tune " + k.name + "'s block sizes");
  cmd->add_option("--impl", a->impls, "Implementations, comma-separated (default: every tunable one available)");
  cmd->add_option("--buckets", a->buckets, "Shape buckets, comma-separated (default: all)");
  cmd->add_option("--dtype", a->dtypes, "Input dtypes, comma-separated")->capture_default_str();
  add_pass_option(cmd, a->passes);
  cmd->add_option("--out", a->out, "Directory for the raw CSV / JSON results")->capture_default_str();
  cmd->add_flag("--emit-table", a->emit_table, "Regenerate the kernel's tuned_table.cc from the winners");
  cmd->add_option("--table", a->table, "Path of the tuned table to write (default: " + k.tune.table_path + ")");
  cmd->add_option("--warmup", a->warmup, "Untimed runs per candidate after its first call")->capture_default_str()->check(CLI::Range(0, 1000000));
  cmd->add_option("--repeats", a->repeats, "Timed runs per candidate (median)")->capture_default_str()->check(CLI::Range(1, 1000000));
  cmd->add_option("--shape", a->shape, "Time at " + dims + " instead of each bucket's representative shape (must lie in the buckets)");
  cmd->add_flag("--list", a->list, "List buckets and candidates without timing anything");
  cmd->callback([a, &k] { run_tune(k, *a); });
}

}  // namespace

void register_tune(CLI::App& app) {
  auto* tune = app.add_subcommand("tune", "Sweep block-size candidates over shape buckets; write raw "
                                          "results and (--emit-table) the tuned table");
  require_kernel(tune);
  for (const kernels::KernelSpec* k : kernels::all())
    if (k->tune.buckets) add_kernel(tune, *k);
}

}  // namespace tessera::cli
