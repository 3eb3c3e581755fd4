// Tessera internal: the tuning types a kernel's impl.h names (its `tuning()` declaration and
// checked-in `tuned_table()`), declared without tune/declared.h and tune/table.h, which are C++20
// and not for the C++17 cuda.cu files that include impl.h.
#pragma once

namespace tessera::tune {
struct Declared;
struct TableEntry;
}  // namespace tessera::tune
