// Tessera fuzz targets: shared helpers. Every target feeds the input to the real parser and
// treats tessera::Error as the expected outcome for bad input. Anything else (another exception
// escaping, a sanitizer report, a hang, an allocation past -rss_limit_mb) is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::fuzz {

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace tessera::fuzz
