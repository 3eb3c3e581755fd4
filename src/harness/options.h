// Tessera harness: options a kernel declares for generic tools (generic).
//
// A kernel's spec lists the options of its `run` and `bench` commands as OptionSpecs; the CLI
// turns each into a flag (--NAME) and hands the kernel the values as text in an OptionValues
// map (every declared option present, defaults filled in; flags are "true" / "false"). The
// typed getters parse the text and throw Error(kInvalidArgument) naming the option.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera::harness {

struct OptionSpec {
  enum class Kind { kFlag, kInt, kFloat, kString };
  std::string name;           // flag name without dashes: "soft-cap" -> --soft-cap
  Kind kind = Kind::kString;
  std::string help;
  std::string default_value;  // as text ("" for none; flags default to "false")
  std::vector<std::string> choices;  // allowed values of a kString option (empty: any)
  std::vector<std::string> aliases = {};  // older CLI spellings (kebab case, no dashes)
};

// The CLI spelling of a declared name: snake_case -> kebab-case ("z_loss_weight" -> "z-loss-weight").
std::string kebab_case(std::string name);

class OptionValues {
 public:
  OptionValues() = default;
  explicit OptionValues(std::map<std::string, std::string> v) : values_(std::move(v)) {}
  void set(const std::string& name, std::string value) { values_[name] = std::move(value); }
  bool has(const std::string& name) const;  // present and not empty
  const std::string& str(const std::string& name) const;  // throws if not declared
  bool flag(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  double real(const std::string& name) const;
  const std::map<std::string, std::string>& all() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
};

// The defaults of `specs` as values (what a caller gets without giving any flag).
OptionValues defaults_of(const std::vector<OptionSpec>& specs);

}  // namespace tessera::harness
