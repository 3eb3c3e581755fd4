// Tessera internal: wall-clock time as text.
#pragma once

#include <string>

namespace tessera {

// The current UTC time formatted with strftime's `format`, e.g. "%Y-%m-%dT%H:%M:%SZ".
std::string utc_now(const char* format = "%Y-%m-%dT%H:%M:%SZ");

}  // namespace tessera
