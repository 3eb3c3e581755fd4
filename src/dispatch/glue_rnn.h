// Tessera internal: a kernel's declared tensor rules (dispatch/tensor_rules.h) looked up by name,
// so that one TensorRules lists a call's inputs, outputs and upstream gradients together and the
// API checks each output against its own declaration once its dims are bound:
//
//   dispatch::Dims d = kRules.bind({{"q", in.q}, ...});  // the inputs
//   dispatch::check_rule(d, kRules, "h", h);              // an output, by its declared rule
//   kernels::output_of(d, "h", rule_of(kRules, "h").dims, rule_of(kRules, "h").dtype);  // its shape
#pragma once

#include <stdexcept>
#include <string>

#include "dispatch/tensor_rules.h"

namespace tessera::dispatch {

// The rule `name` of `rules`; a name without a rule is a bug (std::logic_error).
inline const TensorRule& rule_of(const TensorRules& rules, const std::string& name) {
  for (const TensorRule& r : rules.rules())
    if (r.name == name) return r;
  throw std::logic_error(rules.args().kernel() + ": no tensor rule for '" + name + "'");
}

// Checks `t` (given or not: an absent required tensor fails on its rank) against the rule `name`.
inline void check_rule(Dims& d, const TensorRules& rules, const std::string& name, const TensorView& t) {
  d.check(t, rule_of(rules, name));
}

}  // namespace tessera::dispatch
