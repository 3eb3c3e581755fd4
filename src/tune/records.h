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
// min_ms,first_call_ms,runs,max_abs_dev,tolerance,dev_output,failure. status "wrong": the
// candidate's outputs differ from the default's beyond the tolerance (tune/verify.h);
// max_abs_dev and tolerance (absolute, of the output dev_output) are empty when unchecked, "inf"
// for a non-finite mismatch. Throws Error(kIo).
void write_csv(const std::string& path, const std::vector<Record>& rows);
// {"meta": meta, "records": [...]}; max_abs_dev, tolerance, dev_output as in the CSV (absent
// when unchecked; max_abs_dev "inf" for a non-finite mismatch). Throws Error(kIo).
void write_json(const std::string& path, const std::vector<Record>& rows, const nlohmann::json& meta);
// Adds max_abs_dev, tolerance and dev_output of a checked measurement to its JSON object.
void add_deviation(nlohmann::json& o, const Measurement& m);

}  // namespace tessera::tune
