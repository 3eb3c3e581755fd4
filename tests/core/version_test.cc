// include/tessera/version.h says the version the library is built as (project(VERSION)).
#include <gtest/gtest.h>

#include <string>

#include "tessera/tessera.h"

TEST(Version, HeaderMatchesTheBuildAndTheLibrary) {
  EXPECT_STREQ(TESSERA_VERSION_STRING, TESSERA_TEST_PROJECT_VERSION);
  EXPECT_EQ(std::to_string(TESSERA_VERSION_MAJOR) + "." + std::to_string(TESSERA_VERSION_MINOR) + "." +
                std::to_string(TESSERA_VERSION_PATCH),
            TESSERA_VERSION_STRING);
  EXPECT_STREQ(tessera::version(), TESSERA_VERSION_STRING);
  EXPECT_EQ(TESSERA_VERSION_NUMBER,
            TESSERA_MAKE_VERSION(TESSERA_VERSION_MAJOR, TESSERA_VERSION_MINOR, TESSERA_VERSION_PATCH));
}
