// Tessera internal: `tessera tune` for a kernel whose tuning is declared (tune/declared.h), from
// its signature — no per-kernel tuning code. The timed problem is the kernel's bench problem at
// the bucket's representative shape; each candidate is one call through the kernel's CallSpec
// with the candidate as options (bind_call), its outputs checked against the default's.
#pragma once

#include "kernels/registry.h"
#include "tune/declared.h"

namespace tessera::kernels {

// `kernel` returns the kernel's registered spec (read when a job runs, so that a spec can build
// its own TuneSpec); its bench problem must implement BenchProblem::call_inputs.
TuneSpec declared_tune_spec(const tune::Declared& d, const KernelSpec& (*kernel)());

}  // namespace tessera::kernels
