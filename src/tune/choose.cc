#include "tune/choose.h"

#include "core/env.h"
#include "core/log.h"
#include "tessera/error.h"
#include "tune/autotune.h"
#include "tune/cache.h"
#include "tune/device_kind.h"

namespace tessera::tune {
namespace {

bool is_valid(const ChoiceRequest& r, const Params& p) {
  try {
    r.validate(p);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Tuned sizes fitted to the shape; the unfitted sizes if fitting breaks a backend constraint;
// nullopt if neither is valid for this backend.
std::optional<Params> fit(const ChoiceRequest& r, const Params& tuned) {
  const Params s = r.fit_to_shape ? r.fit_to_shape(tuned) : tuned;
  if (is_valid(r, s)) return s;
  if (is_valid(r, tuned)) return tuned;
  return std::nullopt;
}

std::optional<Choice> from_table(const ChoiceRequest& r) {
  if (!r.bucket || !r.table || !env::flag("TESSERA_TUNED_TABLE", true)) return std::nullopt;
  std::string kind = r.device_kind, source = "tuned table";
  const TableEntry* row = lookup(*r.table, r.implementation, kind, r.dtype, r.bucket->name);
  if (!row)
    if (auto legacy = legacy_cpu_device_kind(r.device_kind)) {
      row = lookup(*r.table, r.implementation, *legacy, r.dtype, r.bucket->name);
      kind = *legacy, source = "tuned table (legacy key)";
    }
  if (!row) return std::nullopt;
  if (auto p = fit(r, row->params)) {
    log::debug(r.what + ": " + source + " hit (" + kind + ", bucket " + r.bucket->name + "): " + params_str(*p));
    return Choice{*p, source};
  }
  log::warn_once(r.kernel + ": tuned table row " + params_str(row->params) + " for " + r.implementation + " / " +
                 r.device_kind + " / " + r.bucket->name + " is not valid for the backend; ignoring it");
  return std::nullopt;
}

std::optional<Choice> from_autotune(const ChoiceRequest& r) {
  AutotuneRequest req;
  req.prefix = r.kernel + "." + r.implementation;
  req.key = r.cache_key;
  req.candidates = r.candidates();
  req.policy.warmup = 1;
  req.policy.repeats = 3;
  req.policy.min_repeats = 1;
  req.policy.budget_s = autotune_budget_seconds();
  req.make_run = r.make_run;
  const DiskCache cache(r.cache_dir.empty() ? default_cache_dir() : r.cache_dir);
  AutotuneResult res;
  try {
    res = lookup_or_autotune(cache, req);
  } catch (const Error& e) {  // scratch could not be allocated: not the candidates' fault
    log::warn_once(r.what + ": autotune skipped (" + e.what() + ")");
    return std::nullopt;
  }
  switch (res.kind) {
    case AutotuneResult::Kind::kFound:
      if (auto p = fit(r, res.params)) {
        log::debug(r.what + ": " + res.source + " (" + res.path + "): " + params_str(*p) +
                   (res.detail.empty() ? "" : " [" + res.detail + "]"));
        return Choice{*p, res.source};
      }
      return std::nullopt;
    case AutotuneResult::Kind::kNegative:
      throw Error(ErrorCode::kUnsupported, r.kernel + ": implementation '" + r.implementation +
                                               "' has no block sizes that run this problem (" + res.source + " " +
                                               res.path + ": " + res.detail + ")");
    case AutotuneResult::Kind::kInconclusive:
      log::debug(r.what + ": autotune inconclusive (" + res.detail + ")");
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

double autotune_budget_seconds() {
  const int ms = env::integer("TESSERA_AUTOTUNE_BUDGET_MS", 2000);
  return ms > 0 ? ms / 1000.0 : 2.0;
}

namespace {
thread_local ChoiceRecorder* t_recorder = nullptr;

Choice choose_impl(const ChoiceRequest& r) {
  if (r.explicit_sizes) {
    r.validate(*r.explicit_sizes);
    return {*r.explicit_sizes, "options"};
  }
  if (!r.tunable) return {r.defaults, "default"};
  if (auto c = from_table(r)) return *c;
  log::debug(r.what + ": tuned table miss (" + r.device_kind + ", bucket " +
             (r.bucket ? r.bucket->name : std::string("none")) + ")");
  if (r.autotune && r.worth_autotuning) {
    if (auto c = from_autotune(r)) return *c;
  } else if (r.autotune) {
    log::debug(r.what + ": too small to autotune");
  }
  log::debug(r.what + ": default block sizes " + params_str(r.defaults));
  return {r.defaults, "default"};
}
}  // namespace

ChoiceRecorder::ChoiceRecorder() : outer_(t_recorder) { t_recorder = this; }
ChoiceRecorder::~ChoiceRecorder() { t_recorder = outer_; }
void ChoiceRecorder::add(ChoiceRecord r) {
  for (const ChoiceRecord& have : records_)
    if (have == r) return;
  records_.push_back(std::move(r));
}

Choice choose(const ChoiceRequest& r) {
  Choice c = choose_impl(r);
  if (t_recorder)
    t_recorder->add({r.kernel, r.implementation, r.device_kind, r.dtype, r.bucket ? r.bucket->name : "",
                     c.params, c.source});
  return c;
}

}  // namespace tessera::tune
