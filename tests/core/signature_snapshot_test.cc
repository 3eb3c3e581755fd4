// Every registered kernel's call signature (inputs, upstream gradients, options: names, kinds,
// defaults, choices, aliases, flags) against tests/fixtures/signatures.txt: the surface users
// script (`tessera run` flags, Python keywords and their defaults) changes only on purpose. After
// an intended change: TESSERA_UPDATE_GOLDEN=1 tessera_tests --gtest_filter=Signatures.* rewrites
// the file; review its diff.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kernels/registry.h"

namespace tessera::kernels {
namespace {

const char* kind_name(harness::OptionSpec::Kind k) {
  switch (k) {
    case harness::OptionSpec::Kind::kFlag: return "flag";
    case harness::OptionSpec::Kind::kInt: return "int";
    case harness::OptionSpec::Kind::kFloat: return "float";
    case harness::OptionSpec::Kind::kString: return "string";
  }
  return "?";
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : "|") + x;
  return s;
}

void describe_inputs(std::ostream& o, const char* what, const std::vector<CallInput>& inputs) {
  for (const CallInput& i : inputs)
    o << "  " << what << " " << i.name << (i.required ? " required" : " optional")
      << (i.differentiable ? " differentiable" : "") << (i.host_only ? " host" : "")
      << (i.seed_of.empty() ? "" : " seed_of=" + i.seed_of)
      << (i.aliases.empty() ? "" : " aliases=" + joined(i.aliases)) << "\n";
}

std::string describe_all() {
  std::ostringstream o;
  for (const KernelSpec* k : all()) {
    o << k->name << "\n";
    describe_inputs(o, "input", k->call.inputs);
    describe_inputs(o, "grad_input", k->call.grad_inputs);
    for (const harness::OptionSpec& s : k->call.options)
      o << "  option " << s.name << " " << kind_name(s.kind) << " default=" << s.default_value
        << (s.choices.empty() ? "" : " choices=" + joined(s.choices))
        << (s.aliases.empty() ? "" : " aliases=" + joined(s.aliases)) << "\n";
    for (const CompoundFlag& c : k->call.compound_flags) o << "  compound " << c.flag << " = " << joined(c.options) << "\n";
    o << "  forward_outputs " << joined(k->call.forward_outputs) << "\n";
    o << "  saved_outputs " << joined(k->call.saved_outputs) << "\n";
  }
  return o.str();
}

TEST(Signatures, EveryKernelsCallSignatureIsTheGoldenOne) {
  const std::string path = TESSERA_TEST_SOURCE_DIR "/tests/fixtures/signatures.txt";
  const std::string now = describe_all();
  if (const char* u = std::getenv("TESSERA_UPDATE_GOLDEN"); u && std::string(u) == "1") {
    std::ofstream(path) << now;
    GTEST_SKIP() << "rewrote " << path;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << path << " is missing: TESSERA_UPDATE_GOLDEN=1 writes it";
  std::stringstream golden;
  golden << in.rdbuf();
  EXPECT_EQ(now, golden.str()) << "a kernel's call signature changed; if on purpose, rewrite " << path
                               << " with TESSERA_UPDATE_GOLDEN=1 and review its diff";
}

}  // namespace
}  // namespace tessera::kernels
