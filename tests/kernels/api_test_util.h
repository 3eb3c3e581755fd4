// Output sentinels for the API error-path tests: every rejected call must leave every output
// byte as it was (validation runs before anything is written).
#pragma once

#include <cstring>
#include <functional>
#include <string>

#include "tessera/error.h"
#include "tessera/tensor.h"

namespace tessera::api_test {

constexpr unsigned char kSentinel = 0x5A;

// A host tensor whose every byte is kSentinel.
inline Tensor sentinel(DType dt, const Shape& shape) {
  Tensor t = Tensor::empty(dt, shape);
  std::memset(t.data(), kSentinel, t.view().nbytes());
  return t;
}

// Whether every byte of t is still kSentinel.
inline bool untouched(const Tensor& t) {
  const auto* b = static_cast<const unsigned char*>(t.data());
  for (size_t i = 0; i < t.view().nbytes(); ++i)
    if (b[i] != kSentinel) return false;
  return true;
}

// The message of the tessera::Error that `call` throws, or "(no error)" when it returns.
inline std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace tessera::api_test
