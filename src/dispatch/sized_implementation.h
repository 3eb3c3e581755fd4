// Tessera internal: the implementation base of a kernel whose block sizes are a struct of its own
// (linear_cross_entropy's b/h/v and attention's q/kv: their tuning is declared, but their
// backends keep their own defaults and checks). What the generic
// choice asks of an implementation, written once; a kernel's Implementation derives from
// SizedImplementation<Problem, BlockSizes> and adds its entry points. C++17: device modules
// include it. (A new kernel declares its tuning instead: tune/declared.h.)
#pragma once

#include <string>
#include <vector>

#include "dispatch/registry.h"
#include "tune/device_kind.h"

namespace tessera::dispatch {

// Problem needs a `device`; Sizes is the kernel's BlockSizes (operator==).
template <class Problem, class Sizes>
class SizedImplementation : public ImplementationBase {
 public:
  // Input level: can it run this problem (device, dtypes, dims)? Must be cheap.
  virtual Availability supports(const Problem& p) const = 0;
  virtual Sizes default_block_sizes(const Problem& p) const = 0;
  // Throws Error(kInvalidArgument) naming the broken constraint.
  virtual void validate_block_sizes(const Sizes& bs) const = 0;
  // Whether block sizes matter (the tuner only sweeps tunable implementations).
  virtual bool tunable() const { return false; }
  // Bounded candidate set for the tuner.
  virtual std::vector<Sizes> candidate_block_sizes(const Problem&) const { return {}; }
  // Machine class that tuned block sizes are keyed by (tune/device_kind.h).
  virtual std::string device_kind(const Problem& p) const {
    return tune::default_device_kind(device_type(), p.device.index);
  }
  // Blocks until the work queued for `p` is done (autotune timing); no-op when synchronous.
  virtual void synchronize(const Problem&) const {}
};

}  // namespace tessera::dispatch
