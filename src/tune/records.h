// Tessera internal (tuning): raw sweep results as CSV and JSON, one row per candidate.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tune/sweep.h"

namespace tessera::tune {

struct Record {
  std::string kernel, implementation, device_kind, dtype, bucket, op, shape;
  Measurement m;
};

// Columns: kernel,implementation,device_kind,dtype,bucket,op,shape,candidate,status,median_ms,
// min_ms,first_call_ms,runs,failure. Throws Error(kIo).
void write_csv(const std::string& path, const std::vector<Record>& rows);
// {"meta": meta, "records": [...]}. Throws Error(kIo).
void write_json(const std::string& path, const std::vector<Record>& rows, const nlohmann::json& meta);

}  // namespace tessera::tune
