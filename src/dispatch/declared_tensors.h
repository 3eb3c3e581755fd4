// Tessera internal: a kernel's tensors declared once (issue #23): each input with the Inputs field
// it fills, its tensor rule (dims in the kernel's dim names, dtype rule, host memory or not:
// dispatch/tensor_rules.h) and what the CLI and Python say about it; then the rules of its outputs
// and upstream gradients. The API binds and checks a call from it; the registration derives the
// CLI's flags, the Python keywords and their help (kernels::DeclaredInputs) from the same list.
//
//   static const dispatch::DeclaredTensors<Inputs> t{"slstm",
//       {{&Inputs::wx, {"wx", "B,S,4,NH,DH", "float"}, "gate pre-activations", true, true},
//        {&Inputs::resets, {"resets", "B,S", "int", true}, "reset mask: nonzero resets", false}},
//       {{"h", "B,S,NH,DH", "=wx|f32"}, {"dwx", "B,S,4,NH,DH", "=wx"}}};
//   dispatch::Dims d = t.bind(in, BindMode::kFull);   // every given input, in declaration order;
//                                                      // a required one not given is an error
//   if (opt.check_finite) t.check_finite(in);
//   check_rule(d, t.rules(), "h", out.h);
//
// Help: `help` names what the input is; the rule's words are inserted (help_text in
// tensor_rules.h), so the help cannot disagree with the check.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dispatch/tensor_rules.h"

namespace tessera::dispatch {

template <class In>
struct TensorInput {
  // A constructor, not an aggregate with default member initializers: GCC 12 stops with an internal
  // compiler error on a one-element list of such a class template (the scaffold's one input).
  TensorInput(TensorView In::*m, TensorRule r, std::string h, bool req = true, bool diff = false,
              std::vector<std::string> al = {})
      : member(m), rule(std::move(r)), help(std::move(h)), required(req), differentiable(diff), aliases(std::move(al)) {}
  TensorView In::*member;
  TensorRule rule;
  std::string help;  // what it is; the rule's words are inserted (help_text)
  bool required;
  bool differentiable;               // has a gradient output "d" + name
  std::vector<std::string> aliases;  // older CLI spellings
};

template <class In>
class DeclaredTensors {
 public:
  DeclaredTensors(std::string kernel, std::vector<TensorInput<In>> inputs, std::vector<TensorRule> more)
      : inputs_(std::move(inputs)), rules_(std::move(kernel), all_rules(inputs_, std::move(more))) {}

  const std::vector<TensorInput<In>>& inputs() const { return inputs_; }
  // The inputs' rules in order, then the outputs' and upstream gradients'.
  const TensorRules& rules() const { return rules_; }
  const ArgCheck& args() const { return rules_.args(); }

  // Binds `in`'s given inputs (an absent optional one is skipped).
  // A required input left out (an empty view) is "<name> is required": the backends got its null
  // pointer (a segfault) or a later rule a dim nobody bound.
  Dims bind(const In& in, BindMode mode) const {
    std::vector<std::pair<std::string, TensorView>> views;
    for (const TensorInput<In>& t : inputs_) {
      if (t.required && !given(in.*t.member)) args().fail(t.rule.name + " is required");
      views.emplace_back(t.rule.name, in.*t.member);
    }
    return rules_.bind(views, mode);
  }
  // No view of `outputs` shares memory with an input of `in`, with a view of `reads` (upstream
  // gradients) or with another output (ArgCheck::apart).
  void apart(const In& in, const ArgCheck::Named& outputs, ArgCheck::Named reads = {}) const {
    for (const TensorInput<In>& t : inputs_) reads.emplace_back(t.rule.name, in.*t.member);
    args().apart(outputs, reads);
  }
  // Options::check_finite: "<name> contains NaN or Inf" for the first input that holds one, inputs
  // with an integer rule ("int", "i32", "i64") skipped; host data only (all_finite).
  void check_finite(const In& in) const {
    for (const TensorInput<In>& t : inputs_)
      if (t.rule.dtype.rfind('i', 0) != 0) args().finite(in.*t.member, t.rule.name);
  }

 private:
  static std::vector<TensorRule> all_rules(const std::vector<TensorInput<In>>& inputs, std::vector<TensorRule> more) {
    std::vector<TensorRule> all;
    for (const TensorInput<In>& t : inputs) all.push_back(t.rule);
    all.insert(all.end(), more.begin(), more.end());
    return all;
  }

  std::vector<TensorInput<In>> inputs_;
  TensorRules rules_;
};

}  // namespace tessera::dispatch
