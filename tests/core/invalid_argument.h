// Test helper: the message of the Error(kInvalidArgument) a call throws, for the tests of the
// one-line argument errors (dispatch::ArgCheck, dispatch::TensorRules).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tessera/error.h"

namespace tessera::testing_errors {

// The message of the Error `f` throws, which must be kInvalidArgument ("" when it throws none).
template <class F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "";
}

}  // namespace tessera::testing_errors
