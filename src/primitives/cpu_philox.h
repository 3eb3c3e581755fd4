// Tessera primitives: the dropout words of primitives/philox.h for a run of keys at once, on
// the host: 16 Philox calls in the lanes of AVX-512 vectors, four vectors at once, where the CPU
// has AVX-512F (a run-time check), else one call after another. Same bits as
// philox::dropout_words, word by word.
#pragma once

#include <cstdint>

namespace tessera::cpu_philox {

// words[e] = word (j mod 4) of philox::dropout_words(seed0, seed1, n, h, i, j / 4) for
// j = j0 + e, e in [0, count), j0 + count <= 2^32 (32-bit key positions, as the scalar rule):
// compare with philox::dropout_threshold to keep or drop key j.
void dropout_words_row(uint32_t seed0, uint32_t seed1, uint32_t n, uint32_t h, uint32_t i, int64_t j0, int64_t count,
                       uint32_t* words);

// Whether the AVX-512 lanes run (the CPU has AVX-512F and force_portable is off).
bool vectorized();
// Test seam: run the portable loop even where AVX-512F is present.
void force_portable(bool on);

}  // namespace tessera::cpu_philox
