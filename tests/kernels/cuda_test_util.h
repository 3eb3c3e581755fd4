// Tessera tests: shared by the GPU test files (tests/kernels/*_cuda_test.cc).
#pragma once

#include <gtest/gtest.h>

// A case that a device implementation refuses as unsupported (Error kUnsupported: the parity
// report's `skipped`) is skipped, with the reason printed, when the suite declares that refusal
// (`declared`: a documented limitation, e.g. linear_cross_entropy's class weights on the device);
// any other refusal fails, so that a regression of supports() cannot hide as a skip. Returns
// from the calling (void) function in both cases.
#define TESSERA_SKIP_DECLARED_UNSUPPORTED(skipped, declared, reason)                                   \
  do {                                                                                                 \
    if (skipped) {                                                                                     \
      if (declared) GTEST_SKIP() << "declared unsupported by the device implementation: " << (reason); \
      FAIL() << "refused as unsupported, which this case is not declared to be: " << (reason);        \
    }                                                                                                  \
  } while (0)
