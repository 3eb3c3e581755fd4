#include "harness/compiler_report.h"

#include <cxxabi.h>

#include <cstdlib>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/build_info.h"

namespace tessera::harness {

int CudaCompilerReport::flagged() const {
  int n = 0;
  for (const auto& k : kernels) n += k.spill_flagged;
  return n;
}

std::string demangle(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> p(abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status),
                                            std::free);
  return status == 0 && p ? std::string(p.get()) : mangled;
}

std::string resources_line(const CudaKernelResources& k) {
  std::string s = "regs " + std::to_string(k.registers) + ", spills " + std::to_string(k.spill_store_bytes) + "/" +
                  std::to_string(k.spill_load_bytes) + " B (st/ld), stack " + std::to_string(k.stack_frame_bytes) +
                  " B, smem " + std::to_string(k.shared_bytes) + " B, cmem " + std::to_string(k.constant_bytes) +
                  " B, barriers " + std::to_string(k.barriers);
  if (k.spill_flagged) s += "  SPILLS (flagged: not declared CUDA_MAY_SPILL)";
  else if (k.spill_store_bytes + k.spill_load_bytes > 0) s += "  (spills allowed)";
  return s;
}

std::optional<CudaCompilerReport> load_cuda_compiler_report(const std::string& path_in, std::string* why) {
  const std::string path = path_in.empty() ? build_info::cuda_resources_path() : path_in;
  std::ifstream f(path);
  if (!f) {
    if (why) *why = "no CUDA compiler report at " + path + " (a build without the CUDA module?)";
    return std::nullopt;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    CudaCompilerReport r;
    r.path = path;
    r.compiler = j.value("compiler", "");
    r.architectures = j.value("architectures", "");
    r.generated_at = j.value("generated_at", "");
    for (const auto& e : j.at("kernels")) {
      CudaKernelResources k;
      k.function = e.value("function", "");
      k.name = demangle(k.function);
      k.source = e.value("source", "");
      k.arch = e.value("arch", "");
      k.registers = e.value("registers", 0);
      k.barriers = e.value("barriers", 0);
      k.spill_store_bytes = e.value("spill_store_bytes", 0L);
      k.spill_load_bytes = e.value("spill_load_bytes", 0L);
      k.stack_frame_bytes = e.value("stack_frame_bytes", 0L);
      k.shared_bytes = e.value("shared_bytes", 0L);
      k.constant_bytes = e.value("constant_bytes", 0L);
      k.may_spill = e.value("may_spill", false);
      k.spill_flagged = e.value("spill_flagged", false);
      r.kernels.push_back(std::move(k));
    }
    return r;
  } catch (const std::exception& e) {
    if (why) *why = "cannot read the CUDA compiler report " + path + ": " + e.what();
    return std::nullopt;
  }
}

nlohmann::json build_json(const std::string& kernel) {
  nlohmann::json b;
  const build_info::SimdTargets t = build_info::simd_targets();
  b["simd"] = {{"library", "Highway"}, {"built", t.built}, {"compiled", t.compiled}, {"supported", t.supported},
               {"dispatched", t.dispatched}, {"static", t.static_target}};
  std::string why;
  const auto r = load_cuda_compiler_report({}, &why);
  if (!r) {
    b["cuda_note"] = why;
    return b;
  }
  b["cuda_compiler"] = r->compiler;
  b["cuda_architectures"] = r->architectures;
  nlohmann::json ks = nlohmann::json::array();
  const std::string prefix = "src/kernels/" + kernel + "/";
  for (const auto& k : r->kernels) {
    if (k.source.rfind(prefix, 0) != 0) continue;
    ks.push_back({{"name", k.name}, {"source", k.source}, {"arch", k.arch}, {"registers", k.registers},
                  {"spill_store_bytes", k.spill_store_bytes}, {"spill_load_bytes", k.spill_load_bytes},
                  {"stack_frame_bytes", k.stack_frame_bytes}, {"shared_bytes", k.shared_bytes},
                  {"constant_bytes", k.constant_bytes}, {"barriers", k.barriers}, {"may_spill", k.may_spill},
                  {"spill_flagged", k.spill_flagged}});
  }
  b["cuda_kernels"] = ks;
  return b;
}

}  // namespace tessera::harness
