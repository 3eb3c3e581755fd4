// Tessera internal (tuning): a kernel-agnostic tunable configuration.
//
// The tuner never sees a kernel's BlockSizes struct: a kernel converts its block sizes to and
// from Params, an ordered list of named integers ({"b", 256}, {"h", 512}, {"v", 2048}). That is
// what the tuned tables, the sweep records and the on-disk cache store.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tessera::tune {

using Params = std::vector<std::pair<std::string, int64_t>>;

// "b=256,h=512,v=2048" (the order of `p`).
std::string params_str(const Params& p);
// Value of `name`, or nullopt.
std::optional<int64_t> param(const Params& p, const std::string& name);

// Parses "b=256,h=512,v=2048" (the text params_str writes; spaces around items allowed): every
// item NAME=INTEGER, names unique. Throws Error(kInvalidArgument) "<what>: ..." naming the bad item.
Params parse_params(const std::string& text, const std::string& what);

// {"b": 256, "h": 512, "v": 2048}. Kernels read Params by name, so the order of a JSON
// object (sorted by key) does not matter.
nlohmann::json params_to_json(const Params& p);
// Every field must be an integer; throws std::runtime_error naming the bad field otherwise.
Params params_from_json(const nlohmann::json& j);

}  // namespace tessera::tune
