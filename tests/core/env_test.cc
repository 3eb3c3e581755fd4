// core/env.h: the TESSERA_* flags read in any case; a value that is no flag keeps the default
// and says so (TESSERA_AUTOTUNE=False was read as "on" without a word).
#include <gtest/gtest.h>

#include "core/env.h"
#include "tune/tune_test_util.h"

namespace tessera {
namespace {

using testing_tune::LogCapture;
using testing_tune::ScopedEnv;

TEST(EnvFlag, AnyCaseOfEachSpelling) {
  for (const char* off : {"0", "false", "False", "FALSE", "off", "Off", "no", "No", "NO"}) {
    const ScopedEnv e("TESSERA_TEST_FLAG", off);
    EXPECT_FALSE(env::flag("TESSERA_TEST_FLAG", true)) << off;
  }
  for (const char* on : {"1", "true", "True", "on", "On", "YES", "yes"}) {
    const ScopedEnv e("TESSERA_TEST_FLAG", on);
    EXPECT_TRUE(env::flag("TESSERA_TEST_FLAG", false)) << on;
  }
  const ScopedEnv unset("TESSERA_TEST_FLAG", nullptr);
  EXPECT_TRUE(env::flag("TESSERA_TEST_FLAG", true));
  EXPECT_FALSE(env::flag("TESSERA_TEST_FLAG", false));
}

TEST(EnvFlag, AValueThatIsNoFlagKeepsTheDefaultAndWarns) {
  const ScopedEnv e("TESSERA_TEST_FLAG_ODD", "disable");
  LogCapture log;
  EXPECT_TRUE(env::flag("TESSERA_TEST_FLAG_ODD", true));
  EXPECT_NE(log.text().find("TESSERA_TEST_FLAG_ODD=disable is not a flag value"), std::string::npos) << log.text();
}

}  // namespace
}  // namespace tessera
