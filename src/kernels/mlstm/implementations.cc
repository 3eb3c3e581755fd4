// mlstm: the registry of implementations, in default dispatch order (fastest first).
#include "kernels/mlstm/impl.h"

namespace tessera::mlstm {

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry(kKernelName);  // never destroyed: device modules hold pointers
#ifdef TESSERA_HAVE_CPU_BACKEND
    reg->add(make_cpu_implementation());
#endif
    reg->add(make_reference_implementation());
    return reg;
  }();
  return *r;
}

}  // namespace tessera::mlstm
