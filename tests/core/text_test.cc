// text::printable: untrusted bytes quoted in messages come out as valid UTF-8 without control
// characters; ordinary text is untouched.
#include "core/text.h"

#include <gtest/gtest.h>

#include <string>

namespace tessera::text {
namespace {

using namespace std::string_literals;

TEST(Printable, LeavesOrdinaryTextAlone) {
  EXPECT_EQ(printable(""), "");
  EXPECT_EQ(printable("plain ASCII: {'descr': '<f4'} \\ ~"), "plain ASCII: {'descr': '<f4'} \\ ~");
  EXPECT_EQ(printable("B×H·V → 128 kiB ✓ 😀"), "B×H·V → 128 kiB ✓ 😀");  // valid UTF-8 stays
}

TEST(Printable, EscapesControlBytes) {
  EXPECT_EQ(printable("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(printable("nul\0bel\a esc\x1b del\x7f"s), "nul\\x00bel\\x07 esc\\x1b del\\x7f");
  EXPECT_EQ(printable("c1 \xc2\x85 end"), "c1 \\xc2\\x85 end");  // U+0085 (NEL) is a control too
}

TEST(Printable, EscapesBytesThatAreNotUtf8) {
  EXPECT_EQ(printable("\x93NUMPY"), "\\x93NUMPY");                    // a .npy magic byte
  EXPECT_EQ(printable("\xff\xfe"), "\\xff\\xfe");                     // never valid
  EXPECT_EQ(printable("\xc3"), "\\xc3");                              // truncated sequence
  EXPECT_EQ(printable("\xc3("), "\\xc3(");                            // bad continuation
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");                     // overlong '/'
  EXPECT_EQ(printable("\xe0\x80\xaf"), "\\xe0\\x80\\xaf");            // overlong, 3 bytes
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");            // UTF-16 surrogate
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");   // above U+10FFFF
  EXPECT_EQ(printable("ok \xe2\x82 \xe2\x82\xac"), "ok \\xe2\\x82 €");  // cut, then whole
}

TEST(Printable, IsIdempotent) {
  const std::string once = printable("\x93NUMPY\x01\x00{'descr'\n\xff"s);
  EXPECT_EQ(printable(once), once);
}

}  // namespace
}  // namespace tessera::text
