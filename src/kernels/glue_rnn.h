// Tessera internal: a call's outputs as its kernel's tensor rules declare them (dispatch/glue_rnn.h
// looks a rule up by name): the shapes a CallSpec's `outputs` hands a framework to allocate.
#pragma once

#include <string>

#include "dispatch/glue_rnn.h"
#include "kernels/registry.h"

namespace tessera::kernels {

// The contiguous output `name` with the dims and dtype of its rule in `rules`, against a call's
// bound inputs: declared_output(d, rules(), "h").
inline OutputDesc declared_output(const dispatch::Dims& d, const dispatch::TensorRules& rules,
                                  const std::string& name) {
  const dispatch::TensorRule& r = dispatch::rule_of(rules, name);
  return output_of(d, name, r.dims, r.dtype);
}

}  // namespace tessera::kernels
