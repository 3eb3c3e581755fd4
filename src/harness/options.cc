#include "harness/options.h"

#include <cerrno>
#include <cstdlib>

#include "tessera/error.h"

namespace tessera::harness {
namespace {

[[noreturn]] void bad_value(const std::string& name, const std::string& v, const char* want) {
  // Both spellings: the declared name (C++ field, Python keyword) and the CLI flag.
  throw Error(ErrorCode::kInvalidArgument,
              "option " + name + " (--" + kebab_case(name) + ") wants " + want + ", got '" + v + "'");
}

}  // namespace

bool OptionValues::has(const std::string& name) const {
  auto it = values_.find(name);
  return it != values_.end() && !it->second.empty();
}

const std::string& OptionValues::str(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end())
    throw Error(ErrorCode::kInternal, "option '" + name + "' was not declared by the kernel");
  return it->second;
}

bool OptionValues::flag(const std::string& name) const {
  const std::string& v = str(name);
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0" || v.empty()) return false;
  bad_value(name, v, "true or false");
}

int64_t OptionValues::integer(const std::string& name) const {
  const std::string& v = str(name);
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE) bad_value(name, v, "an integer");
  return x;
}

double OptionValues::real(const std::string& name) const {
  const std::string& v = str(name);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') bad_value(name, v, "a number");
  return x;
}

OptionValues defaults_of(const std::vector<OptionSpec>& specs) {
  OptionValues v;
  for (const auto& s : specs)
    v.set(s.name, s.kind == OptionSpec::Kind::kFlag && s.default_value.empty() ? "false" : s.default_value);
  return v;
}

}  // namespace tessera::harness

namespace tessera::harness {

std::string kebab_case(std::string name) {
  for (char& c : name)
    if (c == '_') c = '-';
  return name;
}

}  // namespace tessera::harness
