// Tessera primitives: where every CUDA implementation's available() starts — a usable CUDA
// device, or the reason there is none (no driver, no device). Compiled into the CUDA module only.
#pragma once

#include <string>

#include "core/cuda_util.h"
#include "dispatch/dispatch.h"

namespace tessera::primitives {

inline dispatch::Availability cuda_available() {
  std::string why;
  if (cuda::device_count(&why) == 0) return dispatch::Availability::no(why);
  return dispatch::Availability::yes();
}

}  // namespace tessera::primitives
