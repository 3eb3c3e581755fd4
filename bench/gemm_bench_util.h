// What the standalone GEMM micro-benchmarks share (bench/cpu_f32_gemm_bench.cc,
// bench/onednn_tile_bench.cc): a clock, a median, and the M,N,K shapes of the command line.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace gemm_bench {

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "M,N,K" arguments (each >= 1); none given: `defaults`. A malformed one prints the usage and exits 2.
inline std::vector<std::vector<int64_t>> shapes(int argc, char** argv, std::vector<std::vector<int64_t>> defaults) {
  std::vector<std::vector<int64_t>> out;
  for (int i = 1; i < argc; ++i) {
    std::vector<int64_t> s;
    try {
      for (std::string a = argv[i]; !a.empty();) {
        const size_t c = a.find(',');
        s.push_back(std::stoll(a.substr(0, c)));
        a = c == std::string::npos ? "" : a.substr(c + 1);
      }
    } catch (const std::logic_error&) {
      s.clear();  // not a number, or out of range
    }
    if (s.size() != 3 || s[0] < 1 || s[1] < 1 || s[2] < 1) {
      std::fprintf(stderr, "usage: %s [M,N,K ...] (each >= 1), got '%s'\n", argv[0], argv[i]);
      std::exit(2);
    }
    out.push_back(s);
  }
  return out.empty() ? defaults : out;
}

}  // namespace gemm_bench
