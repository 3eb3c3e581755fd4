// Tessera harness: what the compiler did for the CUDA kernels of this build (docs/VERSIONS.md).
//
// The build writes libtessera_cuda.resources.json beside the CUDA module
// (cmake/TesseraCudaResources.cmake, from ptxas's resource usage): per kernel and architecture,
// registers per thread, spill stores / loads, stack frame (local memory), static shared memory,
// constant memory, barriers, and whether a spill is flagged (the kernel spills and its
// tessera_add_kernel declares no CUDA_MAY_SPILL for it). Reading it loads no CUDA runtime.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <vector>

namespace tessera::harness {

struct CudaKernelResources {
  std::string function;  // mangled
  std::string name;      // demangled
  std::string source;    // the .cu file
  std::string arch;      // "sm_90a"
  int registers = 0, barriers = 0;
  long spill_store_bytes = 0, spill_load_bytes = 0, stack_frame_bytes = 0, shared_bytes = 0,
       constant_bytes = 0;
  bool may_spill = false, spill_flagged = false;
};

struct CudaCompilerReport {
  std::string path, compiler, architectures, generated_at;
  std::vector<CudaKernelResources> kernels;
  int flagged() const;
};

// The report at `path` (default: build_info::cuda_resources_path()); nullopt with `why` when
// there is none (a build without CUDA) or it cannot be read.
std::optional<CudaCompilerReport> load_cuda_compiler_report(const std::string& path = {},
                                                            std::string* why = nullptr);

// "kernel<128>(float*, int)" from "_Z...": the demangled name, or the input when it is not one.
std::string demangle(const std::string& mangled);
// One line: "regs 40, spills 0/0 B, stack 0 B, smem 4096 B, cmem 412 B" (+ " SPILLS (flagged)").
std::string resources_line(const CudaKernelResources& k);

// For bench JSON documents (doc["build"]), which the HTML report shows: the SIMD targets
// (compiled, supported, dispatched here) and the CUDA kernels of `kernel` (sources under
// src/kernels/<kernel>/) with their resources, or why there are none.
nlohmann::json build_json(const std::string& kernel);

}  // namespace tessera::harness
