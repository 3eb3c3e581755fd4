// mla_decode: the benchmark problem.
#include "kernels/mla_decode/bench.h"

#include "kernels/mla_decode/impl.h"
#include "tessera/error.h"

namespace tessera::mla_decode {

kernels::BenchSpec bench_spec() {
  kernels::BenchSpec b;
  b.make_problem = [](const harness::GridShape&, DType, const harness::OptionValues&, uint64_t)
      -> std::unique_ptr<harness::BenchProblem> {
    throw Error(ErrorCode::kUnsupported, std::string(kKernelName) + ": no benchmark problem yet (bench.cc)");
  };
  return b;
}

}  // namespace tessera::mla_decode
