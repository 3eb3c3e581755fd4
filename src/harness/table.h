// Tessera harness: result tables as JSON and CSV (generic).
//
// A table is a list of rows; a row is a flat JSON object (string / number / bool / null
// values). CSV columns are the union of the rows' keys (in row order; keys within a row
// come sorted, as nlohmann::json stores them) unless given explicitly;
// numbers are written with round-trip precision, strings are quoted (RFC 4180) when they hold
// a comma, quote or newline, null is an empty field. read_csv parses fields back: empty -> null,
// true/false -> bool, a field that is entirely a number -> number, anything else -> string
// (so a string that looks like a number comes back as a number).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::harness {

using Row = nlohmann::json;  // a flat object

std::vector<std::string> table_columns(const std::vector<Row>& rows);
std::string to_csv(const std::vector<Row>& rows, std::vector<std::string> columns = {});
std::vector<Row> parse_csv(const std::string& text);

// File helpers; throw Error(kIo) naming the path. write_* create parent directories and write
// atomically (temp file + rename).
void write_text_file(const std::string& path, const std::string& text);
std::string read_text_file(const std::string& path);
void write_json_file(const std::string& path, const nlohmann::json& j);
nlohmann::json read_json_file(const std::string& path);
void write_csv_file(const std::string& path, const std::vector<Row>& rows,
                    std::vector<std::string> columns = {});
std::vector<Row> read_csv_file(const std::string& path);

}  // namespace tessera::harness
