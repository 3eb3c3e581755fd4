// GENERATED FILE: the tuned block sizes of linear_cross_entropy.
// Regenerate (do not hand-edit values; review the diff like code):
//   tessera tune linear_cross_entropy --emit-table   (from the repository root, on the machine to tune; rebuild first: rows of other machines are kept)
// Last generated 2026-11-22. Each row: implementation, device kind, dtype,
// shape bucket (see tuning.cc), winning parameters; the comment above it says where and
// when it was measured and the winner's median time on the bucket's representative
// shape. Lookup: src/tune/table.h; sanitizing for the actual shape: block_sizes.cc.
//
// No rows: no tunable implementation was measured yet. Every lookup misses and falls to autotune-on-miss or the backend defaults.
#include "kernels/linear_cross_entropy/tuning.h"

namespace tessera::linear_cross_entropy {

const std::vector<tune::TableEntry>& tuned_table() {
  static const std::vector<tune::TableEntry> rows = {
  };
  return rows;
}

}  // namespace tessera::linear_cross_entropy
