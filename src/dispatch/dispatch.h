// Tessera internal: generic implementation selection with the fallback rules of DESIGN.md.
//
//   requested == ""      : default order (or the comma list in the env override variable);
//                          implementations that report themselves unsupported are skipped with
//                          a warning (once per reason); the choice is logged once at info level.
//   requested == "name"  : that implementation or Error(kUnsupported/kNotFound) with its reason.
//   requested == "a,b,c" : tried in order; each fallback warns; if none runs, the error lists
//                          every implementation's reason.
// An implementation may also throw Error(kUnsupported or kOutOfMemory) from `run` before it
// has written any output; in default and list modes that counts as a fallback too.
//
// Knows nothing about any one kernel: a kernel passes its names and three callbacks.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace tessera::dispatch {

struct Availability {
  bool ok = true;
  std::string reason;  // why not, when !ok
  static Availability yes() { return {}; }
  static Availability no(std::string why) { return {false, std::move(why)}; }
};

enum class Mode { kDefault, kSingle, kList };

struct Plan {
  Mode mode = Mode::kDefault;
  std::vector<std::string> order;
  std::string source;  // "default order", "TESSERA_IMPLEMENTATION", "options"
};

// Splits "a, b,c" into names (trimmed, empty entries dropped).
std::vector<std::string> split_names(const std::string& list);

// Builds the plan. env_var names the override of the default order (used only when `requested`
// is empty).
Plan make_plan(const std::string& requested, const std::vector<std::string>& default_order,
               const char* env_var = "TESSERA_IMPLEMENTATION");

struct Callbacks {
  // Is `name` a registered implementation of this kernel?
  std::function<bool(const std::string& name)> exists;
  // Can it run these inputs? (Cheap: no work, no allocation of outputs.)
  std::function<Availability(const std::string& name)> supports;
  // Runs it. May throw Error(kUnsupported / kOutOfMemory) before writing outputs.
  std::function<void(const std::string& name)> run;
};

// Runs the first implementation of the plan that can run; returns its name.
// Errors: kNotFound (unknown name), kUnsupported (nothing could run; message lists reasons).
std::string run(const std::string& kernel, const Plan& plan, const Callbacks& cb);

}  // namespace tessera::dispatch
