// Fuzz target: the .npy reader (magic, version, header dict, descr, shape, declared size,
// truncated data). The same code path as npy::load on a file.
#include <sstream>

#include "fuzz_util.h"
#include "harness/npy.h"
#include "tessera/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(tessera::fuzz::as_string(data, size), std::ios::binary);
  try {
    tessera::Tensor t = tessera::npy::read(in, "fuzz.npy");
    // A tensor that loads must be as large as it says: touch its last byte.
    if (t.view().nbytes() > 0) {
      volatile char c = static_cast<const char*>(t.data())[t.view().nbytes() - 1];
      (void)c;
    }
  } catch (const tessera::Error&) {
  }
  return 0;
}
