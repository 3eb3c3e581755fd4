// Tessera internal: a call's signature declared by the C++ fields it fills (issue #23: one
// declaration per input and per option). Inputs: each input() names the Inputs field it fills
// (a TensorView, or an optional one), so `tessera run`'s flags, the Python keywords and the call's
// Inputs come from one list: kernels::DeclaredInputs<Inputs>{kKernelName, {input(&Inputs::q, {"q",
// "queries [..]"}), input(&Inputs::sinks, {"sinks", "...", false})}}; s.inputs = d.specs();
// Inputs in = d.parse(args); or, where the API declares its tensors as a
// dispatch::DeclaredTensors, inputs_of(tensors()): the help then carries each rule's words and
// shapes(args) binds a call's shapes. Outputs: declared_outputs(dims, rules, {{names, forward,
// when}}, args). Options: Each field() reads its kind and default from the field of a
// default-constructed Options, so the C++ default, the CLI flag's and the Python keyword's are
// one value and cannot drift; parse() fills an Options from a call's values:
//
//   static const kernels::DeclaredOptions<Options> d{kKernelName, {
//       kernels::field(&Options::causal, "causal", "causal mask"),
//       kernels::field(&Options::scale, "scale", "softmax scale; 0: 1/sqrt(D)", "0"),  // optional: "0" unsets
//       kernels::choice(&Options::reduction, "reduction", "none, sum or mean", {"none", "sum", "mean"},
//                       parse_reduction, reduction_name),
//       kernels::block_sizes_field(&Options::block_sizes, "q=128,kv=256", from_params, to_params),
//       kernels::flag<Options>("return_last_states", "...")}};  // not a field of Options
//   s.options = d.specs();   Options opt = d.parse(args);
#pragma once

#include <algorithm>
#include <charconv>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dispatch/declared_tensors.h"
#include "kernels/registry.h"

namespace tessera::kernels {

template <class Options>
struct OptionField {
  harness::OptionSpec spec;
  // Sets the field from the call's values (kernel: the kernel's name, for messages); null for an
  // option that is no field of Options (an output choice the call itself reads).
  std::function<void(Options&, const harness::OptionValues&, const std::string& kernel)> set;
};

// The shortest text that parses back to v in its own type ("1e-06", "0.5").
template <class F>
std::string shortest_text(F v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

template <class T>
constexpr harness::OptionSpec::Kind kind_of() {
  if constexpr (std::is_same_v<T, bool>) return harness::OptionSpec::Kind::kFlag;
  else if constexpr (std::is_integral_v<T>) return harness::OptionSpec::Kind::kInt;
  else if constexpr (std::is_floating_point_v<T>) return harness::OptionSpec::Kind::kFloat;
  else static_assert(sizeof(T) == 0, "an option field is bool, an integer, a floating type or an optional of one");
}

template <class T>
T value_of(const harness::OptionValues& v, const std::string& name) {
  if constexpr (std::is_same_v<T, bool>) return v.flag(name);
  else if constexpr (std::is_integral_v<T>) return static_cast<T>(v.integer(name));
  else return static_cast<T>(v.real(name));
}

template <class T>
std::string text_of(T v) {
  if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
  else if constexpr (std::is_integral_v<T>) return std::to_string(v);
  else return shortest_text(v);
}

// A plain field (bool, integer, floating): kind and default from Options{}.
template <class Options, class T>
OptionField<Options> field(T Options::*member, std::string name, std::string help,
                           std::vector<std::string> aliases = {}) {
  static_assert(!is_optional<T>::value, "an optional field names its unset text: field(member, name, help, unset)");
  harness::OptionSpec s{name, kind_of<T>(), std::move(help), text_of(Options{}.*member), {}, std::move(aliases)};
  return {std::move(s), [member, name](Options& o, const harness::OptionValues& v, const std::string&) {
            o.*member = value_of<T>(v, name);
          }};
}

// An optional field (unset: the implementation's default): the text `unset` ("0" for a scale,
// "-1" for an offset) is its default and leaves it unset.
template <class Options, class T>
OptionField<Options> field(std::optional<T> Options::*member, std::string name, std::string help, std::string unset) {
  const T unset_value = value_of<T>(harness::OptionValues(std::map<std::string, std::string>{{name, unset}}), name);
  harness::OptionSpec s{name, kind_of<T>(), std::move(help), std::move(unset), {}, {}};
  return {std::move(s), [member, name, unset_value](Options& o, const harness::OptionValues& v, const std::string&) {
            const T given = value_of<T>(v, name);
            o.*member = given == unset_value ? std::nullopt : std::optional<T>(given);
          }};
}

// An enum field given by name: `choices` in order, parse(text) -> E, name(E) -> text.
template <class Options, class E>
OptionField<Options> choice(E Options::*member, std::string name, std::string help, std::vector<std::string> choices,
                            E (*parse)(const std::string&), const char* (*name_of)(E) noexcept) {
  const std::string def = name_of(Options{}.*member);
  if (std::find(choices.begin(), choices.end(), def) == choices.end() || name_of(parse(def)) != def)
    throw std::logic_error(name + ": the default '" + def + "' is not one of its choices");
  harness::OptionSpec s{name, harness::OptionSpec::Kind::kString, std::move(help), def, std::move(choices), {}};
  return {std::move(s), [member, name, parse](Options& o, const harness::OptionValues& v, const std::string&) {
            o.*member = parse(v.str(name));
          }};
}

// The "block_sizes" option (block_sizes_option_spec / block_sizes_option in registry.h).
template <class Options, class Sizes>
OptionField<Options> block_sizes_field(std::optional<Sizes> Options::*member, const std::string& example,
                                       Sizes (*from)(const tune::Params&), tune::Params (*to)(const Sizes&)) {
  return {block_sizes_option_spec(example),
          [member, from, to](Options& o, const harness::OptionValues& v, const std::string& kernel) {
            o.*member = block_sizes_option<Sizes>(v, kernel, from, to);
          }};
}

// ---- inputs ----
template <class In>
struct InputField {
  CallInput spec;
  std::function<void(In&, const CallArgs&, const std::string& kernel)> set;
};

// A TensorView field: a required input must be given ("<kernel>: <name> is required"); an absent
// optional one stays an empty view.
template <class In>
InputField<In> input(TensorView In::*member, CallInput spec) {
  const std::string name = spec.name;
  const bool required = spec.required;
  return {std::move(spec), [member, name, required](In& in, const CallArgs& a, const std::string& kernel) {
            in.*member = required ? kernels::required(a, kernel, name.c_str()) : a.tensor_or_empty(name);
          }};
}

// An optional TensorView field: set when the input is given. Always declared not required
// (whatever spec.required says: CallInput's default is true, and an optional field is optional).
template <class In>
InputField<In> input(std::optional<TensorView> In::*member, CallInput spec) {
  spec.required = false;
  const std::string name = spec.name;
  return {std::move(spec), [member, name](In& in, const CallArgs& a, const std::string&) {
            if (const TensorView* t = a.tensor(name)) in.*member = *t;
          }};
}

template <class In>
class DeclaredInputs {
 public:
  DeclaredInputs(std::string kernel, std::vector<InputField<In>> fields)
      : kernel_(std::move(kernel)), fields_(std::move(fields)) {}
  // From the API's declaration (which outlives this): each input's flag, keyword and help, its
  // help with the rule's words.
  // autocast: the first input of dtype "float" and the differentiable ones of its dtype ("=q").
  explicit DeclaredInputs(const dispatch::DeclaredTensors<In>& t) : kernel_(t.args().kernel()), tensors_(&t) {
    std::string anchor;
    for (const dispatch::TensorInput<In>& i : t.inputs())
      if (anchor.empty() && i.rule.dtype == "float") anchor = i.rule.name;
    for (const dispatch::TensorInput<In>& i : t.inputs()) {
      const bool cast = !anchor.empty() && i.differentiable && (i.rule.name == anchor || i.rule.dtype == "=" + anchor);
      fields_.push_back(input(i.member, {i.rule.name, dispatch::help_text(i.help, i.rule), i.required,
                                         i.differentiable, i.aliases, i.rule.host, cast}));
    }
  }
  std::vector<CallInput> specs() const {
    std::vector<CallInput> out;
    for (const auto& f : fields_) out.push_back(f.spec);
    return out;
  }
  // The call's Inputs: every declared input from the call's tensors.
  In parse(const CallArgs& a) const {
    In in{};
    for (const auto& f : fields_) f.set(in, a, kernel_);
    return in;
  }

  // The dims of a call's inputs, shapes only (data may be absent under jit and fake tensors);
  // for inputs declared as dispatch::DeclaredTensors.
  dispatch::Dims shapes(const CallArgs& a) const {
    if (!tensors_) throw std::logic_error(kernel_ + ": shapes() needs inputs declared as dispatch::DeclaredTensors");
    return tensors_->bind(parse(a), dispatch::BindMode::kShapesOnly);
  }
  bool declared_by(const dispatch::DeclaredTensors<In>& t) const { return tensors_ == &t; }

 private:
  std::string kernel_;
  std::vector<InputField<In>> fields_;
  const dispatch::DeclaredTensors<In>* tensors_ = nullptr;
};

// The DeclaredInputs of an API's declaration, made once: a kernel's spec.cc takes its inputs
// from the DeclaredTensors its api.cc validates with (one declaration per Inputs type).
template <class In>
const DeclaredInputs<In>& inputs_of(const dispatch::DeclaredTensors<In>& t) {
  static const DeclaredInputs<In> d{t};
  if (!d.declared_by(t)) throw std::logic_error(t.args().kernel() + ": two declarations of one Inputs type");
  return d;
}

// ---- outputs ----
// Outputs of the call by the names of their tensor rules: written by the forward (forward = true)
// or by the backward, in a pass that runs it, and only `when` the call asks for them (null: always).
struct DeclaredOutputs {
  std::vector<std::string> names;
  bool forward = true;
  std::function<bool(const CallArgs&)> when = nullptr;
};
// `when` conditions: a flag option set, an optional input given.
inline std::function<bool(const CallArgs&)> if_flag(std::string option) {
  return [option](const CallArgs& a) { return a.options.flag(option); };
}
inline std::function<bool(const CallArgs&)> if_given(std::string input) {
  return [input](const CallArgs& a) { return dispatch::given(a.tensor_or_empty(input)); };
}

// The outputs `a`'s pass writes, in declaration order, shaped by their rules in `r` against the
// bound inputs `d` (CallSpec::outputs).
inline std::vector<OutputDesc> declared_outputs(const dispatch::Dims& d, const dispatch::TensorRules& r,
                                                const std::vector<DeclaredOutputs>& outs, const CallArgs& a) {
  std::vector<OutputDesc> out;
  for (const DeclaredOutputs& o : outs)
    if ((o.forward ? a.pass != Pass::kBackward : a.pass != Pass::kForward) && (!o.when || o.when(a)))
      for (const std::string& name : o.names) out.push_back(declared_output(d, r, name));
  return out;
}

// ---- options ----
// The options the attention kernels share (attention, paged_attention, mla_decode): one name,
// help and unset text each; their checks are dispatch::ArgCheck's softmax_scale and softcap.
template <class Options>
OptionField<Options> softmax_scale_field(std::optional<double> Options::*member) {
  return field(member, "scale", "softmax scale; 0: 1/sqrt(D)", "0");
}
template <class Options>
OptionField<Options> softcap_field(double Options::*member) {
  return field(member, "softcap", "logit soft cap c > 0 (s = c·tanh(s/c)); 0 disables");
}

// An option that is no field of Options (an output the call writes or not): declared, not parsed.
template <class Options>
OptionField<Options> plain(harness::OptionSpec spec) {
  return {std::move(spec), nullptr};
}
// A flag that is no field of Options (off by default): return_last_states.
template <class Options>
OptionField<Options> flag(std::string name, std::string help) {
  return plain<Options>({std::move(name), harness::OptionSpec::Kind::kFlag, std::move(help), "false", {}});
}

template <class Options>
class DeclaredOptions {
 public:
  DeclaredOptions(std::string kernel, std::vector<OptionField<Options>> fields)
      : kernel_(std::move(kernel)), fields_(std::move(fields)) {}

  // The CLI's and the bindings' declaration (CallSpec::options).
  std::vector<harness::OptionSpec> specs() const {
    std::vector<harness::OptionSpec> out;
    for (const auto& f : fields_) out.push_back(f.spec);
    return out;
  }

  // The call's Options: its ExecOptions (implementation, threads, stream, ...) and every field.
  Options parse(const CallArgs& a) const {
    Options o = exec_options<Options>(a);
    for (const auto& f : fields_)
      if (f.set) f.set(o, a.options, kernel_);
    return o;
  }

 private:
  std::string kernel_;
  std::vector<OptionField<Options>> fields_;
};

}  // namespace tessera::kernels
