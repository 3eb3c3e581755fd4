// mla_decode: the benchmark problem (bench.cc) as the registration (spec.cc) takes it.
#pragma once

#include "kernels/registry.h"

namespace tessera::mla_decode {

const kernels::KernelSpec& spec();
kernels::BenchSpec bench_spec();

}  // namespace tessera::mla_decode
