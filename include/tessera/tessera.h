// Tessera: the whole public API in one include.
#pragma once

#include "tessera/attention.h"             // IWYU pragma: export
#include "tessera/dtype.h"                 // IWYU pragma: export
#include "tessera/error.h"                 // IWYU pragma: export
#include "tessera/exec.h"                  // IWYU pragma: export
#include "tessera/grouped_matmul.h"        // IWYU pragma: export
#include "tessera/linear_cross_entropy.h"  // IWYU pragma: export
#include "tessera/tensor.h"                // IWYU pragma: export
#include "tessera/version.h"               // IWYU pragma: export
