// Every kernel's check grid, for every registered implementation but the reference, in every
// pass the kernel has: the generic parity suite. A new kernel or a new backend (or a new
// version, cpu_v2) registers itself and gets these tests without a line here; an implementation
// that cannot run on this machine (cuda without a GPU) skips with its reason.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "kernels/registry.h"

namespace tessera {
namespace {

struct Param {
  std::string kernel, implementation;
  Pass pass;
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.kernel << "/" << p.implementation << "/" << pass_name(p.pass);
}

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (const kernels::KernelSpec* k : kernels::all())
    for (const auto& info : k->implementations().infos())
      if (info.name != "reference")
        for (Pass p : k->passes) out.push_back({k->name, info.name, p});
  return out;
}

class Parity : public ::testing::TestWithParam<Param> {};

TEST_P(Parity, CheckGrid) {
  const Param& prm = GetParam();
  const kernels::KernelSpec& k = kernels::get(prm.kernel);
  const dispatch::Availability a = k.implementations().find(prm.implementation)->available();
  if (!a.ok) GTEST_SKIP() << prm.implementation << " unavailable here: " << a.reason;
  const DeviceType type = k.implementations().find(prm.implementation)->device_type();
  const Device dev = type == DeviceType::kCPU ? Device::cpu() : Device{type, 0};
  int ran = 0;
  for (const kernels::CheckCase& c : k.check_grid(false)) {
    const harness::ParityReport r = c.run(prm.implementation, prm.pass, dev);
    if (r.skipped) continue;  // e.g. a dtype this implementation documents it does not take
    ASSERT_TRUE(r.ran) << c.name << ": " << r.error;
    ++ran;
    for (const auto& f : r.fields) EXPECT_TRUE(f.dev.ok()) << c.name << " " << f.field << ": " << f.dev.str();
  }
  EXPECT_GT(ran, 0) << "every case was skipped: nothing was checked";
}

INSTANTIATE_TEST_SUITE_P(AllKernels, Parity, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.kernel + "_" + info.param.implementation + "_" +
                                  pass_name(info.param.pass);
                         });

}  // namespace
}  // namespace tessera
