// dispatch::Registry with module implementations (dispatch/registry.h): a placeholder is listed in
// its registration slot, loads its module only when asked (available / find / dispatch), reports
// the module's reason when it cannot, and is replaced in place by the real implementation the
// module registers. Fakes only: no device, no module file.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dispatch/registry.h"
#include "tessera/error.h"

namespace d = tessera::dispatch;
using tessera::DeviceType;
using tessera::ErrorCode;

namespace {

class FakeImpl : public d::ImplementationBase {
 public:
  FakeImpl(std::string name, DeviceType dev) : name_(std::move(name)), dev_(dev) {}
  std::string name() const override { return name_; }
  std::string description() const override { return "real " + name_; }
  DeviceType device_type() const override { return dev_; }
  int value() const { return 42; }

 private:
  std::string name_;
  DeviceType dev_;
};

std::vector<std::string> names(const d::RegistryView& r) {
  std::vector<std::string> v;
  for (const auto* i : r.implementations()) v.push_back(i->name());
  return v;
}

}  // namespace

TEST(ModuleImplementation, ListedInItsSlotAndLoadedOnlyWhenAsked) {
  d::Registry<FakeImpl> reg("fake");
  int loads = 0;
  reg.add_module_implementation("gpu", DeviceType::kCUDA, "from the fake module", [&] {
    ++loads;
    reg.add(std::make_unique<FakeImpl>("gpu", DeviceType::kCUDA));  // what the module's init does
    return d::Availability::yes();
  });
  reg.add(std::make_unique<FakeImpl>("cpu", DeviceType::kCPU));
  EXPECT_EQ(names(reg), (std::vector<std::string>{"gpu", "cpu"}));
  EXPECT_EQ(reg.default_order(DeviceType::kCUDA), (std::vector<std::string>{"gpu"}));
  EXPECT_EQ(reg.default_order(DeviceType::kCPU), (std::vector<std::string>{"cpu"}));

  // CPU work never loads the module.
  std::string ran;
  reg.dispatch("", DeviceType::kCPU, [](const FakeImpl&) { return d::Availability::yes(); },
               [&](const FakeImpl& i) { ran = i.name(); });
  EXPECT_EQ(ran, "cpu");
  EXPECT_EQ(loads, 0);
  EXPECT_EQ(reg.implementations()[0]->description(), "from the fake module");

  // Finding it loads it, once; the real implementation takes the placeholder's place.
  const FakeImpl* gpu = reg.find("gpu");
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->value(), 42);
  EXPECT_EQ(loads, 1);
  EXPECT_EQ(names(reg), (std::vector<std::string>{"gpu", "cpu"}));
  EXPECT_EQ(reg.implementations()[0], gpu);
  EXPECT_EQ(reg.find("gpu"), gpu);
  EXPECT_EQ(loads, 1);
  // Registering it a second time is still an internal error.
  try {
    reg.add(std::make_unique<FakeImpl>("gpu", DeviceType::kCUDA));
    ADD_FAILURE() << "no error";
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
  }
}

TEST(ModuleImplementation, AModuleThatCannotLoadGivesItsReasonEverywhere) {
  d::Registry<FakeImpl> reg("fake");
  int loads = 0;
  reg.add_module_implementation("gpu", DeviceType::kCUDA, "from the fake module", [&] {
    ++loads;
    return d::Availability::no("no CUDA device: no driver");
  });
  reg.add(std::make_unique<FakeImpl>("cpu", DeviceType::kCPU));

  const auto infos = reg.infos();  // listing asks available(): loads (once)
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[0].name, "gpu");
  EXPECT_FALSE(infos[0].available);
  EXPECT_EQ(infos[0].unavailable_reason, "no CUDA device: no driver");
  EXPECT_EQ(reg.find("gpu"), nullptr);

  // Asked for by name: known (not "unknown implementation"), fails with the module's reason.
  try {
    reg.dispatch("gpu", DeviceType::kCUDA, [](const FakeImpl&) { return d::Availability::yes(); },
                 [](const FakeImpl&) { ADD_FAILURE() << "ran"; });
    ADD_FAILURE() << "no error";
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("no CUDA device: no driver"), std::string::npos) << e.what();
  }
  // The loader is the module's: it decides whether to retry (device_module::load never does).
  EXPECT_GE(loads, 1);
}

TEST(ModuleImplementation, AModuleThatLoadsButRegistersNothingSaysSo) {
  d::Registry<FakeImpl> reg("fake");
  reg.add_module_implementation("gpu", DeviceType::kCUDA, "d", [] { return d::Availability::yes(); });
  const auto a = reg.implementations()[0]->available();
  EXPECT_FALSE(a.ok);
  EXPECT_NE(a.reason.find("registered no implementation 'gpu'"), std::string::npos) << a.reason;
  EXPECT_EQ(reg.find("gpu"), nullptr);
}
