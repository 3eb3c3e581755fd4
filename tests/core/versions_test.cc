// Kernel versions (docs/VERSIONS.md): statuses keep experimental and retired versions out of the
// default order but runnable by name; families and base versions; the bench's vs_version ratio of
// a version to its base timed in the same run. Fakes only.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/registry.h"
#include "harness/bench.h"
#include "kernels/registry.h"

namespace d = tessera::dispatch;
using tessera::DeviceType;
using tessera::VersionStatus;

namespace {

class Fake : public d::ImplementationBase {
 public:
  Fake(std::string name, VersionStatus s, std::string changed = {})
      : name_(std::move(name)), status_(s), changed_(std::move(changed)) {}
  std::string name() const override { return name_; }
  std::string description() const override { return "fake " + name_; }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  VersionStatus status() const override { return status_; }
  std::string what_changed() const override { return changed_; }

 private:
  std::string name_;
  VersionStatus status_;
  std::string changed_;
};

d::Registry<Fake>& fake_registry() {
  static d::Registry<Fake>* r = [] {
    auto* reg = new d::Registry<Fake>("fake");
    reg->add(std::make_unique<Fake>("cpu", VersionStatus::kCurrent));
    reg->add(std::make_unique<Fake>("cpu_v2", VersionStatus::kExperimental, "wider tiles"));
    reg->add(std::make_unique<Fake>("cpu_v3", VersionStatus::kRetired, "an idea that lost"));
    reg->add(std::make_unique<Fake>("reference", VersionStatus::kCurrent));
    return reg;
  }();
  return *r;
}

}  // namespace

TEST(Versions, OnlyCurrentVersionsAreInTheDefaultOrder) {
  EXPECT_EQ(fake_registry().default_order(DeviceType::kCPU), (std::vector<std::string>{"cpu", "reference"}));
}

TEST(Versions, AnyVersionRunsWhenNamed) {
  for (const std::string name : {"cpu_v2", "cpu_v3"}) {
    std::string ran;
    const std::string chosen = fake_registry().dispatch(
        name, DeviceType::kCPU, [](const Fake&) { return d::Availability::yes(); },
        [&](const Fake& f) { ran = f.name(); });
    EXPECT_EQ(chosen, name);
    EXPECT_EQ(ran, name);
  }
}

TEST(Versions, InfosCarryStatusAndWhatChanged) {
  const auto infos = fake_registry().infos();
  ASSERT_EQ(infos.size(), 4u);
  EXPECT_EQ(infos[1].name, "cpu_v2");
  EXPECT_EQ(infos[1].status, VersionStatus::kExperimental);
  EXPECT_EQ(infos[1].what_changed, "wider tiles");
  EXPECT_EQ(infos[2].status, VersionStatus::kRetired);
  EXPECT_STREQ(tessera::version_status_name(infos[2].status), "retired");
}

TEST(Versions, FamiliesAndBaseVersions) {
  namespace k = tessera::kernels;
  EXPECT_EQ(k::version_family("cpu_v2"), "cpu");
  EXPECT_EQ(k::version_family("cpu_v12"), "cpu");
  EXPECT_EQ(k::version_family("cpu"), "cpu");
  EXPECT_EQ(k::version_family("cpu_vx"), "cpu_vx");
  EXPECT_EQ(k::version_family("cpu_v"), "cpu_v");
  EXPECT_EQ(k::version_family("_v2"), "_v2");
  // The base is the family's current version; the current one itself has none.
  EXPECT_EQ(k::version_base(fake_registry(), "cpu_v2"), "cpu");
  EXPECT_EQ(k::version_base(fake_registry(), "cpu_v3"), "cpu");
  EXPECT_EQ(k::version_base(fake_registry(), "cpu"), "");
  EXPECT_EQ(k::version_base(fake_registry(), "reference"), "");
}

namespace {

// A problem whose implementations take known times: "slow" 10 ms, "slow_v2" 1 ms.
class SleepProblem : public tessera::harness::BenchProblem {
 public:
  tessera::harness::Row describe() const override { return {{"N", 1}}; }
  double work() const override { return 1; }
  tessera::harness::Cost cost(tessera::Pass, const std::string&) const override { return {}; }
  tessera::harness::BenchCall bind(const std::string& impl, tessera::Device, tessera::Pass,
                                   const tessera::ExecOptions&) override {
    const auto d = std::chrono::microseconds(impl == "slow" ? 10000 : 1000);
    tessera::harness::BenchCall c;
    c.run = [d] { std::this_thread::sleep_for(d); };
    return c;
  }
};

}  // namespace

TEST(Versions, BenchRowsOfAVersionCarryTheRatioToTheirBase) {
  tessera::harness::BenchConfig cfg;
  cfg.kernel = "fake";
  // The version before its base: the ratio is filled once both are timed.
  cfg.implementations = {"slow_v2", "slow"};
  cfg.devices = {DeviceType::kCPU, DeviceType::kCPU};
  cfg.version_bases = {"slow", ""};
  cfg.cases.push_back({"one", "one f32", [] { return std::make_unique<SleepProblem>(); }});
  cfg.passes = {tessera::Pass::kForward, tessera::Pass::kBackward};
  cfg.timing.repeats = 3;
  cfg.gemm_baseline = false;
  cfg.progress = false;
  const auto res = tessera::harness::run_bench(cfg);
  int versions = 0;
  for (const auto& r : res.rows) {
    if (r.value("implementation", "") == "slow") {
      EXPECT_FALSE(r.contains("vs_version"));
      continue;
    }
    ++versions;
    ASSERT_TRUE(r.contains("vs_version")) << r.dump();
    EXPECT_EQ(r.value("version_base", ""), "slow");
    EXPECT_GT(r["vs_version"].get<double>(), 0.05);
    EXPECT_LT(r["vs_version"].get<double>(), 0.6);  // 1 ms / 10 ms, with room for a busy machine
  }
  EXPECT_EQ(versions, 2);  // one per pass
}

TEST(Versions, AnExperimentalModuleVersionStaysOutOfTheDefaultOrderBeforeItsModuleLoads) {
  d::Registry<Fake> reg("fake_module");
  reg.add_module_implementation("gpu", DeviceType::kCUDA, "declared", [] { return d::Availability::no("no module"); });
  reg.add_module_implementation("gpu_v2", DeviceType::kCUDA, "declared", [] { return d::Availability::no("no module"); },
                                VersionStatus::kExperimental);
  EXPECT_EQ(reg.default_order(DeviceType::kCUDA), (std::vector<std::string>{"gpu"}));
  const auto infos = reg.infos();
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[1].status, VersionStatus::kExperimental);
  EXPECT_EQ(tessera::kernels::version_base(reg, "gpu_v2"), "gpu");
}
