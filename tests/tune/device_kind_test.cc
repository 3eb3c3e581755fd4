// The CPU device kind of the tuned tables: cpuinfo parsing, the microarchitecture names, the key,
// the legacy (pre-microarch) key rule, and the checked-in tables' keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "tune/choose.h"
#include "tune/device_kind.h"

namespace tessera::tune {
namespace {

CpuInfo x86(const char* vendor, int family, int model, const char* name = "Some CPU") {
  CpuInfo c;
  c.vendor = vendor, c.family = family, c.model = model, c.model_name = name, c.stepping = 1;
  return c;
}

TEST(DeviceKind, ParsesTheFirstProcessorOfCpuinfo) {
  const std::string text =
      "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
      "model name\t: AMD EPYC 9B14 96-Core Processor  \nstepping\t: 1\nflags\t\t: fpu avx512f\n\n"
      "processor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: other\n";
  const CpuInfo c = parse_cpuinfo(text);
  EXPECT_EQ(c.vendor, "AuthenticAMD");
  EXPECT_EQ(c.family, 25);
  EXPECT_EQ(c.model, 17);
  EXPECT_EQ(c.stepping, 1);
  EXPECT_EQ(c.model_name, "AMD EPYC 9B14 96-Core Processor");
  EXPECT_EQ(cpu_microarch(c), "zen4");
}

TEST(DeviceKind, ParsesArmCpuinfo) {
  const CpuInfo c = parse_cpuinfo(
      "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x41\n"
      "CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd40\nCPU revision\t: 1\n\n");
  EXPECT_EQ(c.vendor, "0x41");
  EXPECT_EQ(c.model, 0xd40);
  EXPECT_EQ(c.stepping, 1);
  EXPECT_EQ(c.family, -1);
  EXPECT_EQ(cpu_microarch(c), "arm0x41pd40");
  EXPECT_EQ(cpu_microarch(parse_cpuinfo("")), "unknown");
  EXPECT_EQ(make_cpu_device_kind(parse_cpuinfo(""), 0, "generic"), "cpu:unknown:unknown:1c:generic");
}

TEST(DeviceKind, NamesMicroarchitecturesFromFamilyAndModel) {
  EXPECT_EQ(cpu_microarch(x86("AuthenticAMD", 23, 0x01)), "zen");
  EXPECT_EQ(cpu_microarch(x86("AuthenticAMD", 23, 0x31)), "zen2");
  EXPECT_EQ(cpu_microarch(x86("AuthenticAMD", 25, 0x01)), "zen3");   // Milan
  EXPECT_EQ(cpu_microarch(x86("AuthenticAMD", 25, 0x11)), "zen4");   // Genoa (this VM class)
  EXPECT_EQ(cpu_microarch(x86("AuthenticAMD", 25, 0xa0)), "zen4");   // Bergamo
  EXPECT_EQ(cpu_microarch(x86("AuthenticAMD", 25, 0x61)), "zen4");   // Raphael
  EXPECT_EQ(cpu_microarch(x86("AuthenticAMD", 26, 0x02)), "zen5");   // Turin
  EXPECT_EQ(cpu_microarch(x86("AuthenticAMD", 26, 0x11)), "zen5");   // Turin dense
  EXPECT_EQ(cpu_microarch(x86("AuthenticAMD", 26, 0x50)), "f26m80");  // not known to be zen5
  EXPECT_EQ(cpu_microarch(x86("AuthenticAMD", 27, 5)), "f27m5");
  EXPECT_EQ(cpu_microarch(x86("GenuineIntel", 6, 0x8f)), "spr");
  EXPECT_EQ(cpu_microarch(x86("GenuineIntel", 6, 0x55)), "skx");
  EXPECT_EQ(cpu_microarch(x86("GenuineIntel", 6, 0x6a)), "icx");
  EXPECT_EQ(cpu_microarch(x86("GenuineIntel", 6, 0x01)), "f6m1");
  EXPECT_EQ(cpu_microarch(x86("GenuineIntel", 19, 1)), "f19m1");
  // Same family/model numbers, another vendor: not an AMD name.
  EXPECT_EQ(cpu_microarch(x86("GenuineIntel", 25, 0x11)), "f25m17");
}

TEST(DeviceKind, KeySeparatesZen4FromZen5) {
  const std::string zen4 = make_cpu_device_kind(x86("AuthenticAMD", 25, 0x11, "AMD EPYC"), 2, "avx512");
  const std::string zen5 = make_cpu_device_kind(x86("AuthenticAMD", 26, 0x02, "AMD EPYC"), 2, "avx512");
  EXPECT_EQ(zen4, "cpu:AMD EPYC:zen4:2c:avx512");
  EXPECT_EQ(zen5, "cpu:AMD EPYC:zen5:2c:avx512");
  EXPECT_NE(zen4, zen5);
}

TEST(DeviceKind, ThisMachinesKindCarriesItsMicroarch) {
  const std::string kind = cpu_device_kind();
  EXPECT_EQ(kind.rfind("cpu:", 0), 0u) << kind;
  EXPECT_NE(kind.find(":" + cpu_microarch(cpu_info()) + ":"), std::string::npos) << kind;
  EXPECT_EQ(kind.substr(kind.rfind(':') + 1), cpu_isa_level()) << kind;
}

TEST(DeviceKind, LegacyKeyOnlyBelowAvx512) {
  EXPECT_EQ(legacy_cpu_device_kind("cpu:AMD EPYC:zen3:2c:avx2").value_or("-"), "cpu:AMD EPYC:2c:avx2");
  EXPECT_EQ(legacy_cpu_device_kind("cpu:Foo: Bar:zen2:16c:sse4").value_or("-"), "cpu:Foo: Bar:16c:sse4");
  EXPECT_FALSE(legacy_cpu_device_kind("cpu:AMD EPYC:zen4:2c:avx512"));  // Zen 4 vs Zen 5
  EXPECT_FALSE(legacy_cpu_device_kind("cpu:AMD EPYC:2c:avx2"));         // already a legacy key
  EXPECT_FALSE(legacy_cpu_device_kind("cuda:NVIDIA H100:x:1c:avx2"));
  EXPECT_FALSE(legacy_cpu_device_kind("cpu:x"));
  EXPECT_FALSE(legacy_cpu_device_kind("cpu:a:b:c:d"));  // "c" is not "<N>c"
}

// The CPU keys of the checked-in tables (read from their sources, whatever their kernel) are
// either in the current form or legacy keys that can still match somewhere (below avx512): a
// legacy avx512 key would be dead weight, the rows the re-key missed.
TEST(DeviceKind, CheckedInTableKeysAreCurrentOrUsableLegacy) {
  int rows = 0, current = 0;
  for (const auto& dir : std::filesystem::directory_iterator(std::string(TESSERA_TEST_SOURCE_DIR) + "/src/kernels")) {
    std::ifstream f(dir.path() / "tuned_table.cc");
    if (!f) continue;
    std::ostringstream text;
    text << f.rdbuf();
    const std::string s = text.str();
    const std::regex key("\\{\"[a-z0-9_]+\", \"(cpu:[^\"]*)\"");
    for (auto it = std::sregex_iterator(s.begin(), s.end(), key); it != std::sregex_iterator(); ++it) {
      const std::string kind = (*it)[1].str();
      ++rows;
      const auto colons = std::count(kind.begin(), kind.end(), ':');
      const std::string isa = kind.substr(kind.rfind(':') + 1);
      if (colons >= 4) {
        ++current;
        // "...:<microarch>:<N>c:<isa>": the microarch field is a name, the next one a thread count.
        EXPECT_TRUE(std::regex_match(kind, std::regex("cpu:.+:[a-z][a-z0-9]*:[0-9]+c:[a-z0-9]+"))) << kind;
      } else {
        EXPECT_NE(isa, "avx512") << dir.path() << ": legacy avx512 key never matches: " << kind;
      }
    }
  }
  EXPECT_GT(rows, 0);
  EXPECT_GT(current, 0);
}

ChoiceRequest request(const std::vector<TableEntry>& table, const Bucket& bucket, const std::string& kind) {
  ChoiceRequest r;
  r.kernel = "fake";
  r.implementation = "cpu";
  r.what = "fake cpu";
  r.defaults = {{"b", 1}};
  r.tunable = true;
  r.validate = [](const Params&) {};
  r.table = &table;
  r.device_kind = kind;
  r.dtype = "f32";
  r.bucket = &bucket;
  return r;
}

TEST(DeviceKind, ChooseUsesALegacyRowOnlyWhereTheRuleAllows) {
  Bucket bucket;
  bucket.name = "all";
  const std::vector<TableEntry> table = {{"cpu", "cpu:AMD EPYC:2c:avx2", "f32", "all", {{"b", 7}}},
                                         {"cpu", "cpu:AMD EPYC:2c:avx512", "f32", "all", {{"b", 9}}},
                                         {"cpu", "cpu:AMD EPYC:zen5:2c:avx512", "f32", "all", {{"b", 11}}}};
  const Choice avx2 = choose(request(table, bucket, "cpu:AMD EPYC:zen3:2c:avx2"));
  EXPECT_EQ(avx2.source, "tuned table (legacy key)");
  EXPECT_EQ(param(avx2.params, "b"), 7);
  const Choice zen4 = choose(request(table, bucket, "cpu:AMD EPYC:zen4:2c:avx512"));
  EXPECT_EQ(zen4.source, "default");  // the old avx512 row may be a Zen 5's or a Zen 4's: not used
  EXPECT_EQ(param(zen4.params, "b"), 1);
  const Choice zen5 = choose(request(table, bucket, "cpu:AMD EPYC:zen5:2c:avx512"));
  EXPECT_EQ(zen5.source, "tuned table");
  EXPECT_EQ(param(zen5.params, "b"), 11);
}

TEST(ChoiceRecorder, RecordsDistinctChoicesOfItsThreadInnermostFirst) {
  Bucket bucket;
  bucket.name = "all";
  const std::vector<TableEntry> table = {{"cpu", "k", "f32", "all", {{"b", 5}}}};
  (void)choose(request(table, bucket, "k"));  // no recorder: nothing to record, nothing breaks
  ChoiceRecorder outer;
  (void)choose(request(table, bucket, "k"));
  {
    ChoiceRecorder inner;
    (void)choose(request(table, bucket, "other"));
    (void)choose(request(table, bucket, "other"));
    ASSERT_EQ(inner.records().size(), 1u);
    EXPECT_EQ(inner.records()[0].source, "default");
    EXPECT_EQ(inner.records()[0].device_kind, "other");
  }
  ChoiceRequest user = request(table, bucket, "k");
  user.explicit_sizes = Params{{"b", 3}};
  (void)choose(user);
  ASSERT_EQ(outer.records().size(), 2u);
  EXPECT_EQ(outer.records()[0].source, "tuned table");
  EXPECT_EQ(param(outer.records()[0].params, "b"), 5);
  EXPECT_EQ(outer.records()[0].bucket, "all");
  EXPECT_EQ(outer.records()[1].source, "options");
  EXPECT_EQ(param(outer.records()[1].params, "b"), 3);
}

}  // namespace
}  // namespace tessera::tune
