// Tessera: errors. Every failure a caller can cause is reported as tessera::Error with a code
// and a one-line message that names the argument and the broken constraint.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

enum class ErrorCode {
  kInvalidArgument,  // shape / dtype / value the caller passed is not acceptable
  kUnsupported,      // valid input, but this implementation (or build) cannot run it
  kNotFound,         // unknown kernel / implementation name
  kOutOfMemory,      // an allocation failed
  kIo,               // file could not be read or written
  kInternal,         // a bug in Tessera
};

const char* error_code_name(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Throws Error(code, message) when `cond` is false. Formatting is the caller's.
inline void check(bool cond, ErrorCode code, const std::string& message) {
  if (!cond) throw Error(code, message);
}

}  // namespace tessera
