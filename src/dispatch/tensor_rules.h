// Tessera internal: a kernel's tensors declared once by their named dims, dtype and place; the
// checks and their one-line messages derive from the declaration (issue #23: validation from the
// signature). A kernel writes its rules next to its Problem and binds a call's views to them:
//
//   const dispatch::TensorRules kRules{"mlstm", {
//       {"q", "B,NH,S,DHQK", "float"}, {"k", "B,NH,S,DHQK", "=q"}, {"v", "B,NH,S,DHV", "=q"},
//       {"resets", "B,S", "int"},      {"m0", "B,NH", "f32"},       {"lens", "B", "i32", true}}};
//   const dispatch::Dims d = kRules.bind({{"q", in.q}, {"k", in.k}, {"v", in.v}, ...});  // kRules outlives d
//   d["S"]; d.shape("B,NH,S,DHV"); d.output(h, "h", "B,NH,S,DHV", "=q|f32");
//
// dims: comma-separated; a name binds the size the first tensor that names it has (tensors are
// bound in the rules' order) and every later one must match; a number is a fixed size; "" is 0-d.
// dtype: "float" (f32, bf16, f16), "int" (i32, i64), a dtype name ("f32", "i32", ...), "=x" (the
// dtype of input x), "=x|f32" (x's or f32: outputs and gradients), "any".
// place: every tensor on the device of the first bound one, contiguous, with data; host = true:
// in host memory whatever the device (sizes, page tables). Absent optional inputs (empty views
// with no shape) are skipped. Failures are ArgCheck's: Error(kInvalidArgument) "<kernel>: ...".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/arg_check.h"
#include "tessera/tensor.h"

namespace tessera::dispatch {

struct TensorRule {
  std::string name;   // the input's name in messages (and the CallInput's)
  std::string dims;   // "B,NH,S,DHQK"
  std::string dtype;  // "float", "=q", "i32", ...
  bool host = false;  // read on the host whatever the device
};

class Dims;

// What a call's binding checks: everything (the API), or rank, dims and dtypes only (a
// framework asking for output shapes under jit or with fake tensors: no data, any place).
enum class BindMode { kFull, kShapesOnly };

class TensorRules {
 public:
  TensorRules(std::string kernel, std::vector<TensorRule> rules);
  // Binds each given view to its rule, in the rules' order; a name without a rule is a bug
  // (std::logic_error). Throws Error(kInvalidArgument) at the first failure.
  Dims bind(std::initializer_list<std::pair<const char*, TensorView>> views,
            BindMode mode = BindMode::kFull) const;
  Dims bind(const std::vector<std::pair<std::string, TensorView>>& views, BindMode mode = BindMode::kFull) const;
  const ArgCheck& args() const { return args_; }
  const std::vector<TensorRule>& rules() const { return rules_; }

 private:
  std::vector<TensorRule> rules_;
  ArgCheck args_;
};

class Dims {
 public:
  Dims(const ArgCheck& args, BindMode mode) : args_(&args), mode_(mode) {}

  // The bound size of dim `name`; a name no rule bound is a bug (std::logic_error).
  int64_t operator[](const std::string& name) const;
  bool has(const std::string& name) const { return sizes_.count(name) != 0; }
  // "B,NH,S,DHV" with the bound sizes.
  Shape shape(const std::string& dims) const;
  // The dtype a rule names: "=q" and "=q|f32" give q's ("float" and "any": none, a bug).
  DType dtype(const std::string& rule) const;
  // The device of the first tensor bound (host for a call with only host tensors).
  const Device& device() const { return device_; }
  // Sets a dim the tensors do not carry (or a derived one) before later binds check it.
  void set(const std::string& name, int64_t size) { sizes_[name] = size; }

  // Checks `t` against a rule; new dim names bind. An output or upstream gradient is checked
  // the same way (its dims are all bound by then).
  void check(const TensorView& t, const TensorRule& rule);
  void check(const TensorView& t, const std::string& name, const std::string& dims, const std::string& dtype) {
    check(t, TensorRule{name, dims, dtype});
  }

 private:
  void check_dims(const TensorView& t, const TensorRule& rule);
  void check_dtype(const TensorView& t, const TensorRule& rule) const;
  void check_place(const TensorView& t, const TensorRule& rule);
  std::string spelled(const std::string& dims) const;  // "[B=2, NH=4, S, DHV]"

  const ArgCheck* args_;
  BindMode mode_;
  std::map<std::string, int64_t> sizes_;
  std::map<std::string, DType> dtypes_;  // of the tensors bound, by name
  Device device_;
  bool placed_ = false;
};

// A call's inputs, outputs and upstream gradients can share one TensorRules: the API checks an
// output against its own declaration once the inputs bound its dims (check_rule(d, kRules, "h", h)).
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

// A rule in words, for help texts: "[B, NH, S, DHQK] (f32, bf16 or f16)", "[B, S] (int32 or int64,
// host memory)", "[B, NH] (q's dtype or f32)".
std::string rule_text(const TensorRule& rule);
// `help` with rule_text inserted before its first ':' or ';', or appended: "reset mask: nonzero
// resets" -> "reset mask [B, S] (int32 or int64, host memory): nonzero resets".
std::string help_text(const std::string& help, const TensorRule& rule);

// The comma-separated fields of a dims rule ("B,NH,S" -> {"B", "NH", "S"}; "" -> {}).
std::vector<std::string> dim_names(const std::string& dims);

}  // namespace tessera::dispatch
