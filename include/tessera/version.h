// Tessera: the library's version. Kept equal to project(VERSION) in CMakeLists.txt (configure
// fails otherwise, and a test checks it against the version the library was built as).
#pragma once

#define TESSERA_VERSION_MAJOR 0
#define TESSERA_VERSION_MINOR 1
#define TESSERA_VERSION_PATCH 0
#define TESSERA_VERSION_STRING "0.1.0"

// Encoded for comparisons: TESSERA_VERSION_NUMBER >= TESSERA_MAKE_VERSION(0, 2, 0).
#define TESSERA_MAKE_VERSION(major, minor, patch) ((major) * 10000 + (minor) * 100 + (patch))
#define TESSERA_VERSION_NUMBER \
  TESSERA_MAKE_VERSION(TESSERA_VERSION_MAJOR, TESSERA_VERSION_MINOR, TESSERA_VERSION_PATCH)

namespace tessera {
// The version of the library actually loaded (may differ from the header's at run time).
const char* version() noexcept;
}  // namespace tessera
