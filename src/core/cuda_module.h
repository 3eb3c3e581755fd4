// Tessera internal: registration into the CUDA device module (libtessera_cuda.so).
//
// Every .cu file of the module that provides something to register (a kernel's cuda
// implementations) adds one function with TESSERA_CUDA_MODULE_REGISTRATION; the module's entry
// point, tessera_cuda_module_init (cuda_module.cc), runs them when the core library loads the
// module on first use (core/device_module.h). Nothing is registered when the module's file is
// merely linked (a benchmark linking the module directly calls the entry point itself).
#pragma once

namespace tessera::cuda_module {

using RegisterFn = void (*)();
// Adds `fn` to what the module's entry point runs (in static-initialization order). Returns true.
bool add_registration(RegisterFn fn);

}  // namespace tessera::cuda_module

#define TESSERA_CUDA_MODULE_CONCAT_(a, b) a##b
#define TESSERA_CUDA_MODULE_CONCAT(a, b) TESSERA_CUDA_MODULE_CONCAT_(a, b)
// At namespace scope in a module source: TESSERA_CUDA_MODULE_REGISTRATION([] { ... });
#define TESSERA_CUDA_MODULE_REGISTRATION(fn)                                               \
  [[maybe_unused]] static const bool TESSERA_CUDA_MODULE_CONCAT(tessera_cuda_module_reg_, \
                                                                __LINE__) =               \
      ::tessera::cuda_module::add_registration(fn)
