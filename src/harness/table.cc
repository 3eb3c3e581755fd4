#include "harness/table.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/files.h"
#include "core/text.h"
#include "tessera/error.h"

namespace tessera::harness {
namespace {

std::string number_str(const nlohmann::json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  const double d = v.get<double>();
  if (!std::isfinite(d)) return std::isnan(d) ? "nan" : (d > 0 ? "inf" : "-inf");
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  // Prefer the shortest form that round-trips.
  for (int prec = 6; prec < 17; ++prec) {
    char s[40];
    std::snprintf(s, sizeof s, "%.*g", prec, d);
    if (std::strtod(s, nullptr) == d) return s;
  }
  return buf;
}

std::string field_str(const nlohmann::json& v) {
  if (v.is_null()) return "";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number()) return number_str(v);
  std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

nlohmann::json parse_field(const std::string& s, bool quoted) {
  if (quoted) return s;
  if (s.empty()) return nullptr;
  if (s == "true") return true;
  if (s == "false") return false;
  if (s == "nan" || s == "inf" || s == "-inf") return std::strtod(s.c_str(), nullptr);
  char* end = nullptr;
  if (s.find_first_of(".eE") == std::string::npos) {
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (end && *end == '\0' && end != s.c_str()) return i;
  }
  const double d = std::strtod(s.c_str(), &end);
  if (end && *end == '\0' && end != s.c_str()) return d;
  return s;
}

}  // namespace

std::vector<std::string> table_columns(const std::vector<Row>& rows) {
  std::vector<std::string> cols;
  for (const auto& r : rows)
    for (auto it = r.begin(); it != r.end(); ++it)
      if (std::find(cols.begin(), cols.end(), it.key()) == cols.end()) cols.push_back(it.key());
  return cols;
}

std::string to_csv(const std::vector<Row>& rows, std::vector<std::string> columns) {
  if (columns.empty()) columns = table_columns(rows);
  std::string out;
  for (size_t i = 0; i < columns.size(); ++i) out += (i ? "," : "") + field_str(columns[i]);
  out += "\n";
  for (const auto& r : rows) {
    for (size_t i = 0; i < columns.size(); ++i) {
      if (i) out += ",";
      auto it = r.find(columns[i]);
      if (it != r.end()) out += field_str(*it);
    }
    out += "\n";
  }
  return out;
}

std::vector<Row> parse_csv(const std::string& text) {
  // Records of (field, quoted) pairs.
  std::vector<std::vector<std::pair<std::string, bool>>> records;
  std::vector<std::pair<std::string, bool>> rec;
  std::string field;
  bool quoted = false, in_quotes = false, any = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_quotes) {
      if (c == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          in_quotes = false;
        }
      } else {
        field += c;
      }
      continue;
    }
    if (c == '"') {
      in_quotes = quoted = any = true;
    } else if (c == ',') {
      rec.emplace_back(field, quoted);
      field.clear();
      quoted = false;
      any = true;
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (any || !field.empty()) {
        rec.emplace_back(field, quoted);
        records.push_back(std::move(rec));
      }
      rec.clear();
      field.clear();
      quoted = any = false;
    } else {
      field += c;
      any = true;
    }
  }
  check(!in_quotes, ErrorCode::kIo, "CSV ends inside a quoted field");
  if (any || !field.empty()) {
    rec.emplace_back(field, quoted);
    records.push_back(std::move(rec));
  }
  std::vector<Row> rows;
  if (records.empty()) return rows;
  const auto& header = records[0];
  for (size_t r = 1; r < records.size(); ++r) {
    check(records[r].size() == header.size(), ErrorCode::kIo,
          "CSV record " + std::to_string(r + 1) + " has " + std::to_string(records[r].size()) +
              " fields, the header has " + std::to_string(header.size()));
    Row row = nlohmann::json::object();
    for (size_t i = 0; i < header.size(); ++i)
      row[header[i].first] = parse_field(records[r][i].first, records[r][i].second);
    rows.push_back(std::move(row));
  }
  return rows;
}

void write_text_file(const std::string& path, const std::string& text) {
  files::write_atomically(path, text);
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  check(static_cast<bool>(f), ErrorCode::kIo, "cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  write_text_file(path, j.dump(2) + "\n");
}

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kIo, text::printable(path + " is not valid JSON: " + e.what()));
  }
}

void write_csv_file(const std::string& path, const std::vector<Row>& rows,
                    std::vector<std::string> columns) {
  write_text_file(path, to_csv(rows, std::move(columns)));
}

std::vector<Row> read_csv_file(const std::string& path) {
  try {
    return parse_csv(read_text_file(path));
  } catch (const Error& e) {
    throw Error(ErrorCode::kIo, text::printable(path + ": " + e.what()));
  }
}

}  // namespace tessera::harness
