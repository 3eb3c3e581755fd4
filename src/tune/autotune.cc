#include "tune/autotune.h"

#include <chrono>
#include <ctime>
#include <map>
#include <mutex>

#include "core/time.h"
#include "core/log.h"
#include "tune/records.h"

namespace tessera::tune {
namespace {

std::mutex g_memo_mu;
std::map<std::string, AutotuneResult>& memo() {
  static std::map<std::string, AutotuneResult> m;
  return m;
}
std::mutex g_tune_mu;  // one sweep at a time in this process

std::string memo_key(const DiskCache& cache, const AutotuneRequest& req) {
  return cache.dir() + '\n' + req.prefix + '\n' + req.key;
}

std::optional<AutotuneResult> memo_get(const std::string& k) {
  std::lock_guard<std::mutex> lock(g_memo_mu);
  auto it = memo().find(k);
  if (it == memo().end()) return std::nullopt;
  AutotuneResult r = it->second;
  r.source = "autotune cache";
  return r;
}

void memo_put(const std::string& k, const AutotuneResult& r) {
  std::lock_guard<std::mutex> lock(g_memo_mu);
  memo()[k] = r;
}


AutotuneResult from_entry(const CacheEntry& e, const std::string& path) {
  AutotuneResult r;
  r.path = path;
  r.source = "autotune cache";
  if (e.negative) {
    r.kind = AutotuneResult::Kind::kNegative;
    r.detail = "cached negative entry: no candidate could run";
    // The candidates list comes from the file: read it defensively (a non-string "candidate"
    // would make json::value throw out of a kernel call).
    for (const auto& c : e.candidates) {
      if (!c.is_object() || !c.contains("failure") || !c["failure"].is_string()) continue;
      const bool named = c.contains("candidate") && c["candidate"].is_string();
      r.detail += "; " + (named ? c["candidate"].get<std::string>() : std::string("?")) + ": " +
                  c["failure"].get<std::string>();
    }
  } else {
    r.kind = AutotuneResult::Kind::kFound;
    r.params = e.params;
  }
  return r;
}

}  // namespace

nlohmann::json measurements_to_json(const std::vector<Measurement>& ms) {
  nlohmann::json a = nlohmann::json::array();
  for (const Measurement& m : ms) {
    nlohmann::json j;
    j["candidate"] = params_str(m.candidate);
    j["status"] = status_name(m.status);
    if (m.ok()) {
      j["median_ms"] = m.median_ms;
      j["min_ms"] = m.min_ms;
      j["first_call_ms"] = m.first_call_ms;
      j["runs"] = m.runs;
    } else {
      j["failure"] = m.failure;
    }
    add_deviation(j, m);
    a.push_back(j);
  }
  return a;
}

void clear_autotune_memo() {
  std::lock_guard<std::mutex> lock(g_memo_mu);
  memo().clear();
}

AutotuneResult lookup_or_autotune(const DiskCache& cache, const AutotuneRequest& req) {
  const std::string mk = memo_key(cache, req);
  if (auto r = memo_get(mk)) return *r;

  std::lock_guard<std::mutex> tune_lock(g_tune_mu);
  if (auto r = memo_get(mk)) return *r;  // another thread tuned it while we waited
  const std::string path = cache.path_for(req.prefix, req.key);
  if (auto e = cache.read(req.prefix, req.key)) {
    AutotuneResult r = from_entry(*e, path);
    memo_put(mk, r);
    return r;
  }

  const Runner run = req.make_run();
  const SweepResult s = sweep(req.candidates, run, req.policy);
  for (const Measurement& m : s.measurements)  // a kernel bug: say so, and never use it
    if (m.status == Measurement::Status::kWrong)
      log::warn_once("autotune: " + req.prefix + " " + params_str(m.candidate) + " is not used: " + m.failure);
  if (!s.unchecked.empty()) log::warn_once("autotune: " + req.prefix + ": " + s.unchecked);
  AutotuneResult r;
  r.path = path;
  r.source = "autotune";
  CacheEntry e;
  e.key = req.key;
  e.version = cache.version();
  e.created = utc_now();
  e.complete = !s.budget_exhausted;
  e.candidates = measurements_to_json(s.measurements);
  bool all_failed = !s.measurements.empty(), for_memory = false;
  for (const Measurement& m : s.measurements) {
    if (m.status != Measurement::Status::kFailed) all_failed = false;
    for_memory = for_memory || m.out_of_memory;
  }

  if (s.best >= 0) {
    const Measurement& w = s.measurements[static_cast<size_t>(s.best)];
    r.kind = AutotuneResult::Kind::kFound;
    r.params = w.candidate;
    r.detail = "best " + params_str(w.candidate) + " at " + std::to_string(w.median_ms) +
               " ms of " + std::to_string(s.measurements.size()) + " candidates" +
               (s.budget_exhausted ? " (time budget cut the sweep)" : "");
    e.params = w.candidate;
    e.median_ms = w.median_ms;
  } else if (all_failed && for_memory) {
    // Memory was short this time: no negative entry (it would turn the implementation off for
    // this shape in every later process), nothing kept; the call goes on with the defaults.
    r.kind = AutotuneResult::Kind::kInconclusive;
    r.detail = "every candidate failed, some for memory: nothing cached";
    for (const Measurement& m : s.measurements) r.detail += "; " + params_str(m.candidate) + ": " + m.failure;
    return r;
  } else if (all_failed) {
    r.kind = AutotuneResult::Kind::kNegative;
    r.detail = "no candidate could run";
    for (const Measurement& m : s.measurements)
      r.detail += "; " + params_str(m.candidate) + ": " + m.failure;
    e.negative = true;
  } else {
    r.kind = AutotuneResult::Kind::kInconclusive;
    r.detail = "no candidate measured within the time budget";
    memo_put(mk, r);
    return r;  // nothing worth persisting
  }
  try {
    cache.write(req.prefix, e);
  } catch (const std::exception& ex) {
    log::warn_once(std::string(ex.what()) + " (the result is kept for this process only)");
  }
  memo_put(mk, r);
  return r;
}

}  // namespace tessera::tune
