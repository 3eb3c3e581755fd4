// Tessera harness: process-level facts for benchmarks (generic, Linux /proc based; every
// function degrades to "unknown" elsewhere).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace tessera::harness {

// Resident set size now, and its high-water mark (VmRSS / VmHWM), in bytes.
std::optional<size_t> rss_bytes();
std::optional<size_t> peak_rss_bytes();
// Resets the high-water mark to the current RSS (writes "5" to /proc/self/clear_refs, Linux
// >= 4.0). Returns false when it cannot; then peak_rss_bytes() is the process-lifetime peak.
bool reset_peak_rss();

// "AMD EPYC" (from /proc/cpuinfo model name), "" if unknown.
std::string cpu_model();
int hardware_threads();  // >= 1
// ISA extensions relevant to kernels that this CPU reports ("avx2 fma avx512f ...").
std::string cpu_features();

// Runs body(begin, end) over [0, n) split into `threads` contiguous chunks on std::threads
// (the calling thread takes the first chunk). threads <= 0 means hardware_threads().
void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& body);

// This process's command line, arguments joined by spaces (from /proc/self/cmdline; the
// program path reduced to its file name). "" if unknown.
std::string command_line();

// UTC timestamp "2025-01-31T12:34:56Z".
std::string utc_timestamp();

}  // namespace tessera::harness
