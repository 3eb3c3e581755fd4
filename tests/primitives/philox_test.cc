// primitives/philox.h: Random123's published known answers, and the dropout keep rule's rate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "primitives/cpu_philox.h"
#include "primitives/philox.h"

namespace tessera {
namespace {

namespace ph = primitives::philox;

void expect_words(ph::Words got, ph::Words want) {
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got.w[i], want.w[i]) << "word " << i;
}

// Random123's kat_vectors for philox4x32_10 (counter, key, result): a transposed word or a wrong
// round count changes all of them.
TEST(Philox, MatchesTheRandom123KnownAnswers) {
  expect_words(ph::philox4x32_10({{0, 0, 0, 0}}, 0, 0), {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  expect_words(ph::philox4x32_10({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu),
               {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  expect_words(ph::philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u),
               {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

TEST(Philox, DropoutThresholdIsFloorOfPTimes2To32) {
  EXPECT_EQ(ph::dropout_threshold(0.0), 0u);
  EXPECT_EQ(ph::dropout_threshold(0.5), 0x80000000u);
  EXPECT_EQ(ph::dropout_threshold(0.25), 0x40000000u);
  EXPECT_EQ(ph::dropout_threshold(std::nextafter(1.0, 0.0)), 0xFFFFFFFFu);  // never wraps to 0
}

// The keep rate over 2^16 positions is 1 − p within 5 standard deviations of a binomial, for
// each p; p = 0 keeps everything. Four keys share a call: each of the four words is used.
TEST(Philox, DropoutKeepsOneMinusPOfThePositions) {
  for (double p : {0.0, 0.1, 0.5, 0.9}) {
    const uint32_t thr = ph::dropout_threshold(p);
    int64_t kept = 0, lane_kept[4] = {0, 0, 0, 0};
    const int64_t count = 1 << 16;
    for (uint32_t i = 0; i < 256; ++i)
      for (uint32_t j = 0; j < 256; ++j) {
        const bool k = ph::dropout_keep(1234u, 5678u, thr, 3, 2, i, j);
        kept += k;
        lane_kept[j & 3] += k;
      }
    const double sd = std::sqrt(count * p * (1 - p));
    EXPECT_NEAR(static_cast<double>(kept), count * (1 - p), 5 * sd + 1e-9) << "p=" << p;
    for (int l = 0; l < 4; ++l) EXPECT_NEAR(static_cast<double>(lane_kept[l]), count / 4 * (1 - p), 5 * sd / 2 + 1e-9);
  }
}

// Every coordinate of the position and both seed words change the mask.
TEST(Philox, EveryCoordinateOfThePositionChangesTheMask) {
  const uint32_t thr = ph::dropout_threshold(0.5);
  auto mask = [&](uint32_t s0, uint32_t s1, uint32_t n, uint32_t h, uint32_t i) {
    uint64_t bits = 0;
    for (uint32_t j = 0; j < 64; ++j) bits |= uint64_t{ph::dropout_keep(s0, s1, thr, n, h, i, j)} << j;
    return bits;
  };
  const uint64_t base = mask(1, 2, 3, 4, 5);
  EXPECT_EQ(base, mask(1, 2, 3, 4, 5));
  EXPECT_NE(base, mask(9, 2, 3, 4, 5));
  EXPECT_NE(base, mask(1, 9, 3, 4, 5));
  EXPECT_NE(base, mask(1, 2, 9, 4, 5));
  EXPECT_NE(base, mask(1, 2, 3, 9, 5));
  EXPECT_NE(base, mask(1, 2, 3, 4, 9));
}

// The vectorized row (cpu_philox) gives the scalar rule's words, for runs that start and end
// off a call's four keys, span several 16-call batches, and are empty.
void expect_rows_are_the_scalar_rule() {
  for (int64_t j0 : {0, 1, 3, 4, 61, 1000003})
    for (int64_t count : {0, 1, 2, 5, 64, 67, 130, 200, 300, 777}) {
      std::vector<uint32_t> got(static_cast<size_t>(count) + 1, 0xdeadbeefu);
      cpu_philox::dropout_words_row(0x89abcdefu, 7u, 5u, 3u, 11u, j0, count, got.data());
      for (int64_t e = 0; e < count; ++e) {
        const uint32_t j = static_cast<uint32_t>(j0 + e);
        ASSERT_EQ(got[e], ph::dropout_words(0x89abcdefu, 7u, 5u, 3u, 11u, j >> 2).w[j & 3]) << j0 << "+" << e;
      }
      EXPECT_EQ(got[count], 0xdeadbeefu) << "wrote past the run";
    }
}

TEST(Philox, VectorizedRowIsTheScalarRule) {
  expect_rows_are_the_scalar_rule();  // AVX-512 lanes where the CPU has them
  cpu_philox::force_portable(true);
  EXPECT_FALSE(cpu_philox::vectorized());
  expect_rows_are_the_scalar_rule();
  cpu_philox::force_portable(false);
}

}  // namespace
}  // namespace tessera
