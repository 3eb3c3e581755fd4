#include "harness/predict.h"

#include <algorithm>
#include <memory>

#include "tessera/error.h"

namespace tessera::harness {
namespace {

Row base(const BenchProblem& p, const BenchCase& bc, const std::string& impl, const std::string& device,
         const std::string& mode) {
  Row r = bc.fields;
  r.update(p.describe());
  r["kind"] = "prediction";
  r["implementation"] = impl;
  r["device"] = device;
  r["mode"] = mode;
  r["shape"] = bc.shape_name;
  return r;
}

std::string device_name(DeviceType t) { return t == DeviceType::kCPU ? "cpu" : Device{t, 0}.str(); }

void predict_case(const BenchConfig& cfg, const BenchCase& bc, const Roofline* roofline, std::vector<Row>& rows) {
  const std::unique_ptr<BenchProblem> p = bc.make_cost_model ? bc.make_cost_model() : bc.make();
  std::vector<std::string> devices;  // each device timed gets its GEMM floor row
  for (DeviceType t : cfg.devices)
    if (std::find(devices.begin(), devices.end(), device_name(t)) == devices.end()) devices.push_back(device_name(t));
  if (const auto g = p->gemm_floor(); g && g->M > 0 && cfg.gemm_baseline) {
    Cost c;
    const double in_size = static_cast<double>(dtype_size(g->dtype));
    c.add({"GEMM", 2.0 * g->M * g->N * g->K, 0, 0, false});
    c.add({"read A, B; write C (f32)", 0,
           (static_cast<double>(g->M) * g->K + static_cast<double>(g->K) * g->N) * in_size +
               static_cast<double>(g->M) * g->N * 4,
           0, false});
    for (const std::string& device : devices) {
      Row r = base(*p, bc, device == "cpu" ? "blas-gemm" : "device-gemm", device, "gemm");
      fill_prediction(r, c, device, dtype_name(g->dtype), roofline);
      r["note"] = "one plain GEMM " + std::to_string(g->M) + "x" + std::to_string(g->K) + "x" + std::to_string(g->N);
      rows.push_back(std::move(r));
    }
  }
  for (size_t i = 0; i < cfg.implementations.size(); ++i) {
    const std::string& impl = cfg.implementations[i];
    const std::string device = device_name(cfg.devices[i]);
    for (Pass pass : cfg.passes) {
      const Cost c = p->cost(pass, impl);
      Row r = base(*p, bc, impl, device, pass_name(pass));
      fill_prediction(r, c, device, r.value("dtype", "f32"), roofline);
      std::string note;
      for (const auto& a : c.assumptions) note += (note.empty() ? "" : "; ") + a;
      if (!note.empty()) r["note"] = note;
      rows.push_back(std::move(r));
    }
  }
}

}  // namespace

void fill_prediction(Row& row, const Cost& c, const std::string& device, const std::string& dtype,
                     const Roofline* roofline) {
  row["gflop_useful"] = c.flops_useful / 1e9;
  row["gflop_issued"] = c.flops_issued / 1e9;
  row["mbytes_min"] = c.bytes / 1e6;
  row["transcendentals"] = c.transcendentals;
  row["ai"] = c.arithmetic_intensity();
  for (const char* k : {"peak_gflops", "bandwidth_gbs", "compute_ms", "memory_ms", "predicted_ms"}) row[k] = nullptr;
  const DeviceCeilings* d = roofline ? roofline->find(device) : nullptr;
  if (!d) {
    row["roofline_note"] = roofline ? "the stored ceilings have no " + device + "; measure them with `tessera roofline`"
                                    : "no stored ceilings: run `tessera roofline` to predict times";
    return;
  }
  std::string note;
  const double peak = d->peak_gflops(dtype, &note);
  std::optional<double> compute_ms, memory_ms;
  if (peak > 0) compute_ms = c.flops_issued / (peak * 1e9) * 1e3;
  if (d->bandwidth_gbs > 0) memory_ms = c.bytes / (d->bandwidth_gbs * 1e9) * 1e3;
  if (peak > 0) row["peak_gflops"] = peak;
  if (d->bandwidth_gbs > 0) row["bandwidth_gbs"] = d->bandwidth_gbs;
  if (compute_ms) row["compute_ms"] = *compute_ms;
  if (memory_ms) row["memory_ms"] = *memory_ms;
  if (compute_ms && memory_ms) {
    row["predicted_ms"] = std::max(*compute_ms, *memory_ms);
    row["bound"] = *compute_ms >= *memory_ms ? "compute" : "memory";
  } else {
    note += std::string(note.empty() ? "" : "; ") + "no " + (compute_ms ? "bandwidth" : "GEMM") +
            " ceiling on " + device + ": no predicted time";
  }
  if (!note.empty()) row["roofline_note"] = note;
}

std::vector<Row> predict(const BenchConfig& cfg, const Roofline* roofline, std::vector<std::string>* messages) {
  check(cfg.implementations.size() == cfg.devices.size(), ErrorCode::kInternal, "predict: one device per implementation");
  std::vector<Row> rows;
  for (const BenchCase& bc : cfg.cases) {
    try {
      predict_case(cfg, bc, roofline, rows);
    } catch (const Error& e) {
      if (messages) messages->push_back("skipping " + bc.label + ": " + e.what());
    }
  }
  return rows;
}

}  // namespace tessera::harness
