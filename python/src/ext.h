// tessera._ext internals shared by the nanobind module (ext.cc) and the XLA FFI handlers (ffi.cc).
#pragma once

#include <nanobind/nanobind.h>

#include <map>
#include <string>

#include "kernels/registry.h"

namespace tessera::python {

// Every declared option, the given ones (by name, as text) over the defaults; an unknown name is
// Error(kInvalidArgument) listing the options.
harness::OptionValues option_values(const kernels::CallSpec& spec, const std::string& kernel,
                                    const std::map<std::string, std::string>& given);

// {"cpu": capsule, "cuda": capsule (when built with CUDA)}: XLA FFI handlers for jax.ffi.
nanobind::dict ffi_targets();

}  // namespace tessera::python
