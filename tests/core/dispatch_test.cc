// Generic dispatch: the fallback rules of DESIGN.md, with fake implementations.
#include <gtest/gtest.h>

#include <map>

#include "core/log.h"
#include "dispatch/dispatch.h"
#include "tessera/error.h"

namespace tessera::dispatch {
namespace {

struct Fake {
  std::map<std::string, Availability> impls;  // name -> support
  std::map<std::string, bool> throws_unsupported;
  std::vector<std::string> ran;
  Callbacks cb() {
    Callbacks c;
    c.exists = [this](const std::string& n) { return impls.count(n) > 0; };
    c.supports = [this](const std::string& n) { return impls.at(n); };
    c.run = [this](const std::string& n) {
      if (throws_unsupported[n]) throw Error(ErrorCode::kUnsupported, n + " ran out of luck");
      ran.push_back(n);
    };
    return c;
  }
};

class DispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log::set_capture(&logs);
    log::set_level(log::Level::kInfo);
    unsetenv("TESSERA_TEST_IMPL");
  }
  void TearDown() override {
    log::set_capture(nullptr);
    log::set_level(log::Level::kWarn);
  }
  std::string logs;
};

TEST_F(DispatchTest, SplitNames) {
  EXPECT_EQ(split_names(" a, b ,,c "), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(split_names("").empty());
}

TEST_F(DispatchTest, DefaultOrderSkipsUnsupportedAndWarnsOnce) {
  Fake f;
  f.impls = {{"fast", Availability::no("needs a GPU (unit test)")}, {"slow", Availability::yes()}};
  const Plan p = make_plan("", {"fast", "slow"}, "TESSERA_TEST_IMPL");
  EXPECT_EQ(p.mode, Mode::kDefault);
  EXPECT_EQ(run("k", p, f.cb()), "slow");
  EXPECT_EQ(run("k", p, f.cb()), "slow");
  EXPECT_EQ(f.ran, (std::vector<std::string>{"slow", "slow"}));
  // One warning naming the reason, not two.
  const auto first = logs.find("needs a GPU (unit test)");
  ASSERT_NE(first, std::string::npos) << logs;
  EXPECT_EQ(logs.find("needs a GPU (unit test)", first + 1), std::string::npos) << logs;
}

TEST_F(DispatchTest, SingleNameFailsFastWithItsReason) {
  Fake f;
  f.impls = {{"fast", Availability::no("dtype f64 is not supported")}, {"slow", Availability::yes()}};
  try {
    run("k", make_plan("fast", {"fast", "slow"}), f.cb());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("dtype f64 is not supported"), std::string::npos);
  }
  EXPECT_TRUE(f.ran.empty());
}

TEST_F(DispatchTest, ListWarnsOnEachFallbackAndListsEveryReason) {
  Fake f;
  f.impls = {{"a", Availability::no("reason A")}, {"b", Availability::no("reason B")}, {"c", Availability::yes()}};
  EXPECT_EQ(run("k", make_plan("a,b,c", {}), f.cb()), "c");
  EXPECT_NE(logs.find("skipping implementation 'a' (reason A), falling back to 'b'"), std::string::npos) << logs;
  EXPECT_NE(logs.find("skipping implementation 'b' (reason B), falling back to 'c'"), std::string::npos) << logs;
  f.impls["c"] = Availability::no("reason C");
  try {
    run("k", make_plan("a,b,c", {}), f.cb());
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* r : {"reason A", "reason B", "reason C"}) EXPECT_NE(m.find(r), std::string::npos) << m;
  }
}

TEST_F(DispatchTest, RuntimeUnsupportedFallsThroughInListsButNotForSingleNames) {
  Fake f;
  f.impls = {{"a", Availability::yes()}, {"b", Availability::yes()}};
  f.throws_unsupported["a"] = true;
  EXPECT_EQ(run("k", make_plan("a,b", {}), f.cb()), "b");
  EXPECT_THROW(run("k", make_plan("a", {}), f.cb()), Error);
}

TEST_F(DispatchTest, UnknownNameIsAnErrorEvenInAList) {
  Fake f;
  f.impls = {{"a", Availability::yes()}};
  try {
    run("k", make_plan("a,typo", {}), f.cb());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
  EXPECT_TRUE(f.ran.empty()) << "nothing may run when a name is unknown";
}

TEST_F(DispatchTest, EnvironmentOverridesTheDefaultOrderOnly) {
  Fake f;
  f.impls = {{"fast", Availability::yes()}, {"reference", Availability::yes()}};
  setenv("TESSERA_TEST_IMPL", "reference", 1);
  EXPECT_EQ(run("k", make_plan("", {"fast", "reference"}, "TESSERA_TEST_IMPL"), f.cb()), "reference");
  // An explicit request in the options wins over the environment.
  EXPECT_EQ(run("k", make_plan("fast", {"fast", "reference"}, "TESSERA_TEST_IMPL"), f.cb()), "fast");
  unsetenv("TESSERA_TEST_IMPL");
}

}  // namespace
}  // namespace tessera::dispatch
