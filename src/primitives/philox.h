// Tessera primitives: Philox4x32-10, the counter-based random generator of Salmon et al.
// ("Parallel Random Numbers: As Easy as 1, 2, 3", SC'11), and the dropout keep rule built on
// it. Header-only, host and device: the same counter gives the same bits in the reference, the
// CPU backends and the CUDA kernels, so a dropout mask is a pure function of (seed, position) —
// the forward and the backward draw the same mask without storing it.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TESSERA_PHILOX_HD __host__ __device__ __forceinline__
#else
#define TESSERA_PHILOX_HD inline
#endif

namespace tessera::primitives::philox {

struct Words {
  uint32_t w[4];
};

// Ten rounds of Philox4x32 on counter c with key (k0, k1), as Random123's philox4x32_10.
TESSERA_PHILOX_HD Words philox4x32_10(Words c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key schedule (Weyl) increments
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c.w[0], p1 = static_cast<uint64_t>(kM1) * c.w[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = Words{{hi1 ^ c.w[1] ^ k0, lo1, hi0 ^ c.w[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// Dropout with probability p drops a value whose 32-bit word is below this threshold:
// floor(p · 2^32), at most 2^32 − 1 (p in [0, 1)). The keep rate is 1 − threshold / 2^32, within
// 2^-32 of 1 − p.
inline uint32_t dropout_threshold(double p) {
  const double t = std::floor(p * 4294967296.0);
  return t >= 4294967295.0 ? 0xFFFFFFFFu : t <= 0.0 ? 0u : static_cast<uint32_t>(t);
}

// The attention dropout rule (docs/kernels/attention.md, "dropout"): the probability of query
// row i (within sequence n) for key j (within the sequence; both < 2^32, which the attention API
// checks) under query head h is kept when
// word j mod 4 of Philox4x32-10(counter (j / 4, i, h, n), key (seed0, seed1)) >= threshold.
// Four consecutive keys share one Philox call (keep4 gives them at once).
TESSERA_PHILOX_HD Words dropout_words(uint32_t seed0, uint32_t seed1, uint32_t n, uint32_t h, uint32_t i, uint32_t j4) {
  return philox4x32_10(Words{{j4, i, h, n}}, seed0, seed1);
}
TESSERA_PHILOX_HD bool dropout_keep(uint32_t seed0, uint32_t seed1, uint32_t threshold, uint32_t n, uint32_t h, uint32_t i,
                             uint32_t j) {
  return dropout_words(seed0, seed1, n, h, i, j >> 2).w[j & 3u] >= threshold;
}

}  // namespace tessera::primitives::philox

#undef TESSERA_PHILOX_HD
