// GENERATED FILE: the tuned block sizes of mla_decode.
// Regenerate (do not hand-edit values; review the diff like code):
//   tessera tune mla_decode --emit-table   (from the repository root, on the machine to tune; rebuild first: rows of other machines are kept)
// No rows: no tunable implementation was measured yet. Every lookup misses and falls to autotune-on-miss or the defaults.
#include "tune/table.h"

namespace tessera::mla_decode {

const std::vector<tune::TableEntry>& tuned_table() {
  static const std::vector<tune::TableEntry> rows = {};
  return rows;
}

}  // namespace tessera::mla_decode
