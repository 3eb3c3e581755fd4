#include "tune/records.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <fstream>

#include "core/files.h"
#include "tessera/error.h"

namespace tessera::tune {
namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += (c == '\n' || c == '\r') ? ' ' : c;
  }
  return out + "\"";
}

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", x);
  return buf;
}

// A deviation: "" when not checked, "inf" for a non-finite mismatch, else %.3g.
std::string dev_num(double x) {
  if (std::isnan(x)) return "";
  if (std::isinf(x)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

// JSON has no inf: a non-finite mismatch is the string "inf".
nlohmann::json dev_json(double x) { return std::isinf(x) ? nlohmann::json("inf") : nlohmann::json(x); }

// Atomic: a temp file beside `path`, renamed over it once complete, so an interrupted
// `tessera tune` never leaves a partial CSV or JSON (at most a *.tmp.* file).
void save(const std::string& path, const std::string& text) { files::write_atomically(path, text); }

}  // namespace

void add_deviation(nlohmann::json& o, const Measurement& m) {
  if (!m.checked()) return;
  o["max_abs_dev"] = dev_json(m.max_abs_dev);
  o["tolerance"] = m.tolerance;
  if (!m.dev_output.empty()) o["dev_output"] = m.dev_output;
}

void write_csv(const std::string& path, const std::vector<Record>& rows) {
  std::string t =
      "kernel,implementation,device_kind,dtype,bucket,op,shape,candidate,status,median_ms,min_ms,"
      "first_call_ms,runs,max_abs_dev,tolerance,dev_output,failure\n";
  for (const Record& r : rows) {
    const bool ok = r.m.ok();
    for (const std::string& f : {r.kernel, r.implementation, r.device_kind, r.dtype, r.bucket, r.op,
                                 r.shape, params_str(r.m.candidate),
                                 std::string(status_name(r.m.status))})
      t += csv_field(f) + ",";
    t += (ok ? num(r.m.median_ms) : "") + "," + (ok ? num(r.m.min_ms) : "") + "," +
         (ok ? num(r.m.first_call_ms) : "") + "," + (ok ? std::to_string(r.m.runs) : "") + "," +
         dev_num(r.m.max_abs_dev) + "," + dev_num(r.m.tolerance) + "," + csv_field(r.m.dev_output) + "," +
         csv_field(r.m.failure) + "\n";
  }
  save(path, t);
}

void write_json(const std::string& path, const std::vector<Record>& rows, const nlohmann::json& meta) {
  nlohmann::json j;
  j["meta"] = meta;
  j["records"] = nlohmann::json::array();
  for (const Record& r : rows) {
    nlohmann::json o;
    o["kernel"] = r.kernel;
    o["implementation"] = r.implementation;
    o["device_kind"] = r.device_kind;
    o["dtype"] = r.dtype;
    o["bucket"] = r.bucket;
    o["op"] = r.op;
    o["shape"] = r.shape;
    o["candidate"] = params_to_json(r.m.candidate);
    o["status"] = status_name(r.m.status);
    if (r.m.ok()) {
      o["median_ms"] = r.m.median_ms;
      o["min_ms"] = r.m.min_ms;
      o["first_call_ms"] = r.m.first_call_ms;
      o["runs"] = r.m.runs;
    } else {
      o["failure"] = r.m.failure;
    }
    add_deviation(o, r.m);
    j["records"].push_back(o);
  }
  save(path, j.dump(2) + "\n");
}

}  // namespace tessera::tune
