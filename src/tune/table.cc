#include "tune/table.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <tuple>

#include "core/time.h"

namespace tessera::tune {
namespace {

auto row_key(const TableEntry& e) {
  return std::tie(e.implementation, e.device_kind, e.dtype, e.bucket);
}

// A C++ string literal for `s` (escapes quotes, backslashes and control characters).
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\%03o", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// Comments must not be ended early by what they quote.
std::string comment_safe(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

const TableEntry* lookup(const std::vector<TableEntry>& table, const std::string& implementation,
                         const std::string& device_kind, const std::string& dtype,
                         const std::string& bucket) {
  for (const TableEntry& e : table)
    if (e.implementation == implementation && e.device_kind == device_kind && e.dtype == dtype &&
        e.bucket == bucket)
      return &e;
  return nullptr;
}

std::vector<TableEntry> merge_tables(const std::vector<TableEntry>& old_rows,
                                     const std::vector<TableEntry>& fresh) {
  std::vector<TableEntry> out;
  for (const TableEntry& o : old_rows) {
    const bool replaced = std::any_of(fresh.begin(), fresh.end(),
                                      [&](const TableEntry& f) { return row_key(f) == row_key(o); });
    if (!replaced) out.push_back(o);
  }
  out.insert(out.end(), fresh.begin(), fresh.end());
  std::stable_sort(out.begin(), out.end(),
                   [](const TableEntry& a, const TableEntry& b) { return row_key(a) < row_key(b); });
  return out;
}

std::string emit_table_cc(const TableSource& src, const std::vector<TableEntry>& rows,
                          const std::string& generated_on) {
  std::ostringstream os;
  os << "// GENERATED FILE: the tuned block sizes of " << src.kernel << ".\n"
     << "// Regenerate (do not hand-edit values; review the diff like code):\n"
     << "//   " << src.regenerate << "\n"
     << "// Last generated " << generated_on << ". Each row: implementation, device kind, dtype,\n"
     << "// shape bucket (see tuning.cc), winning parameters; the comment above it says where and\n"
     << "// when it was measured and the winner's median time on the bucket's representative\n"
     << "// shape. Lookup: src/tune/table.h; sanitizing for the actual shape: the kernel's fit (tuning.cc).\n";
  if (rows.empty()) os << "//\n// " << src.empty_note << "\n";
  os << "#include \"" << src.include << "\"\n\n"
     << "namespace " << src.cpp_namespace << " {\n\n"
     << "const std::vector<tune::TableEntry>& " << src.function << "() {\n"
     << "  static const std::vector<tune::TableEntry> rows = {\n";
  for (const TableEntry& e : rows) {
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.3f", e.median_ms);
    os << "      // " << comment_safe(e.device_kind) << " | " << comment_safe(e.op) << " "
       << comment_safe(e.shape) << ": " << ms << " ms median, measured " << comment_safe(e.date)
       << "\n";
    os << "      {" << quoted(e.implementation) << ", " << quoted(e.device_kind) << ", "
       << quoted(e.dtype) << ", " << quoted(e.bucket) << ",\n       {";
    for (size_t i = 0; i < e.params.size(); ++i)
      os << (i ? ", " : "") << "{" << quoted(e.params[i].first) << ", " << e.params[i].second << "}";
    os << "},\n       " << quoted(e.shape) << ", " << quoted(e.op) << ", " << ms << ", "
       << quoted(e.date) << "},\n";
  }
  os << "  };\n"
     << "  return rows;\n"
     << "}\n\n"
     << "}  // namespace " << src.cpp_namespace << "\n";
  return os.str();
}

std::string today() { return utc_now("%Y-%m-%d"); }

}  // namespace tessera::tune
