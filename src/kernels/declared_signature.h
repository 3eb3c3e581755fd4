// Tessera internal: a call's signature declared by the C++ fields it fills (issue #23: one
// declaration per input and per option). Inputs: each input() names the Inputs field it fills
// (a TensorView, or an optional one), so `tessera run`'s flags, the Python keywords and the call's
// Inputs come from one list: kernels::DeclaredInputs<Inputs>{kKernelName, {input(&Inputs::q, {"q",
// "queries [..]"}), input(&Inputs::sinks, {"sinks", "...", false})}}; s.inputs = d.specs();
// Inputs in = d.parse(args). Options: Each field() reads its kind and default from the field of a
// default-constructed Options, so the C++ default, the CLI flag's and the Python keyword's are
// one value and cannot drift; parse() fills an Options from a call's values:
//
//   static const kernels::DeclaredOptions<Options> d{kKernelName, {
//       kernels::field(&Options::causal, "causal", "causal mask"),
//       kernels::field(&Options::scale, "scale", "softmax scale; 0: 1/sqrt(D)", "0"),  // optional: "0" unsets
//       kernels::choice(&Options::reduction, "reduction", "none, sum or mean", {"none", "sum", "mean"},
//                       parse_reduction, reduction_name),
//       kernels::block_sizes_field(&Options::block_sizes, "q=128,kv=256", from_params, to_params),
//       kernels::plain<Options>({"return_last_states", K::kFlag, "...", "false", {}})}};  // not a field
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

 private:
  std::string kernel_;
  std::vector<InputField<In>> fields_;
};

// ---- options ----
// The options the attention kernels share (attention, paged_attention, mla_decode): one name,
// help and unset text each; their checks are dispatch::ArgCheck's softmax_scale and soft_cap.
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
