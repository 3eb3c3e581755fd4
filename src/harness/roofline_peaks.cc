// The physical CPU ceilings behind `tessera roofline`: register-resident FMA / dot-product
// loops (no memory traffic, enough independent accumulators to hide the FMA latency on two
// pipes) and a streaming read of a buffer much larger than the last-level cache. Each loop is
// compiled for its ISA with a function-level target attribute and only called when the CPU
// reports that ISA at run time, so the binary still runs on a CPU without it.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/memory.h"
#include "harness/process.h"
#include "harness/roofline.h"
#include "harness/timer.h"

namespace tessera::harness {
namespace {

// ---- the loops: each runs `iters` iterations and returns a value the caller keeps ----------
#if defined(__x86_64__)
#define TESSERA_REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define TESSERA_REP16(X) TESSERA_REP12(X) X(12) X(13) X(14) X(15)

// Horizontal sum (not _mm512_reduce_add_ps: GCC 12 warns inside it, -Wuninitialized).
__attribute__((target("avx512f"))) inline float sum512(__m512 v) {
  alignas(64) float out[16];
  _mm512_store_ps(out, v);
  float t = 0;
  for (float x : out) t += x;
  return t;
}

// 16 zmm accumulators, 16 FMAs (256 flops) per iteration: acc = acc * a + b converges to
// b / (1 - a), so values stay normal and finite however long it runs.
__attribute__((target("avx512f"), noinline)) float loop_fma_avx512(int64_t iters) {
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
#define DECL(i) __m512 c##i = _mm512_set1_ps(static_cast<float>(i));
  TESSERA_REP16(DECL)
#undef DECL
  for (int64_t it = 0; it < iters; ++it) {
#define STEP(i) c##i = _mm512_fmadd_ps(c##i, a, b);
    TESSERA_REP16(STEP)
#undef STEP
  }
  __m512 s = _mm512_setzero_ps();
#define SUM(i) s = _mm512_add_ps(s, c##i);
  TESSERA_REP16(SUM)
#undef SUM
  return sum512(s);
}

// 12 ymm accumulators (16 registers: 12 + a + b), 12 FMAs (192 flops) per iteration.
__attribute__((target("avx2,fma"), noinline)) float loop_fma_avx2(int64_t iters) {
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
#define DECL(i) __m256 c##i = _mm256_set1_ps(static_cast<float>(i));
  TESSERA_REP12(DECL)
#undef DECL
  for (int64_t it = 0; it < iters; ++it) {
#define STEP(i) c##i = _mm256_fmadd_ps(c##i, a, b);
    TESSERA_REP12(STEP)
#undef STEP
  }
  __m256 s = _mm256_setzero_ps();
#define SUM(i) s = _mm256_add_ps(s, c##i);
  TESSERA_REP12(SUM)
#undef SUM
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  float t = 0;
  for (float v : out) t += v;
  return t;
}

// 16 zmm accumulators, 16 vdpbf16ps per iteration; each does 32 bf16 products summed in pairs
// into 16 f32 lanes: 64 flops (a multiply and an add per product), 1024 per iteration.
__attribute__((target("avx512f,avx512bf16"), noinline)) float loop_dot_bf16(int64_t iters) {
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3380);  // 2^-24
#define DECL(i) __m512 c##i = _mm512_set1_ps(static_cast<float>(i));
  TESSERA_REP16(DECL)
#undef DECL
  for (int64_t it = 0; it < iters; ++it) {
#define STEP(i) c##i = _mm512_dpbf16_ps(c##i, a, b);
    TESSERA_REP16(STEP)
#undef STEP
  }
  __m512 s = _mm512_setzero_ps();
#define SUM(i) s = _mm512_add_ps(s, c##i);
  TESSERA_REP16(SUM)
#undef SUM
  return sum512(s);
}

// Streaming read: eight 256-bit loads per iteration into four integer accumulators (integer
// adds have a one-cycle latency, so the loads, not the adds, set the pace).
__attribute__((target("avx2"), noinline)) uint64_t read_avx2(const char* p, int64_t bytes) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  const int64_t n = bytes / 256;
  for (int64_t i = 0; i < n; ++i) {
    const __m256i* q = reinterpret_cast<const __m256i*>(p + i * 256);
    s0 = _mm256_add_epi64(s0, _mm256_load_si256(q + 0));
    s1 = _mm256_add_epi64(s1, _mm256_load_si256(q + 1));
    s2 = _mm256_add_epi64(s2, _mm256_load_si256(q + 2));
    s3 = _mm256_add_epi64(s3, _mm256_load_si256(q + 3));
    s0 = _mm256_add_epi64(s0, _mm256_load_si256(q + 4));
    s1 = _mm256_add_epi64(s1, _mm256_load_si256(q + 5));
    s2 = _mm256_add_epi64(s2, _mm256_load_si256(q + 6));
    s3 = _mm256_add_epi64(s3, _mm256_load_si256(q + 7));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return out[0] + out[1] + out[2] + out[3];
}
#undef TESSERA_REP16
#undef TESSERA_REP12
#endif

uint64_t read_plain(const char* p, int64_t bytes) {
  const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int64_t i = 0; i + 4 <= bytes / 8; i += 4) s0 += q[i], s1 += q[i + 1], s2 += q[i + 2], s3 += q[i + 3];
  return s0 + s1 + s2 + s3;
}

bool cpu_has(const char* feature) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const std::string f = feature;
  if (f == "avx512f") return __builtin_cpu_supports("avx512f");
  if (f == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (f == "avx512bf16") return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#endif
  (void)feature;
  return false;
}

struct PeakLoop {
  const char* name;      // the line's name in the roofline file
  const char* requires_;  // cpu_has() feature
  double flops_per_iter;
  float (*loop)(int64_t);
  const char* what;
};

std::vector<PeakLoop> peak_loops() {
  std::vector<PeakLoop> out;
#if defined(__x86_64__)
  out.push_back({"f32_fma_avx512", "avx512f", 16 * 16 * 2, loop_fma_avx512,
                 "vfmadd231ps zmm, 16 independent accumulators"});
  out.push_back({"f32_fma_avx2", "avx2", 12 * 8 * 2, loop_fma_avx2,
                 "vfmadd231ps ymm, 12 independent accumulators"});
  out.push_back({"bf16_dot_avx512", "avx512bf16", 16 * 64, loop_dot_bf16,
                 "vdpbf16ps zmm (64 flops each), 16 independent accumulators"});
#endif
  return out;
}

// Runs body on `threads` threads at once: the wall time from start to the last join, and each
// thread's CPU time (CLOCK_THREAD_CPUTIME_ID: the time it was on a core).
struct ThreadTimes {
  double wall = 0;
  std::vector<double> cpu;
};
ThreadTimes run_threads(int threads, const std::function<void()>& body) {
  ThreadTimes t;
  t.cpu.assign(static_cast<size_t>(threads), 0.0);
  auto timed = [&](int i) {
    timespec a{}, b{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    body();
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    t.cpu[static_cast<size_t>(i)] = static_cast<double>(b.tv_sec - a.tv_sec) + 1e-9 * static_cast<double>(b.tv_nsec - a.tv_nsec);
  };
  Stopwatch sw;
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(timed, i);
  timed(0);
  for (auto& th : pool) th.join();
  t.wall = sw.seconds();
  return t;
}

// SMT siblings share a core's FMA units only while both run: a thread's CPU-time rate is then
// not its share, so with SMT on the wall clock is used.
bool smt_active() {
  std::ifstream f("/sys/devices/system/cpu/smt/active");
  int v = 0;
  return (f >> v) && v == 1;
}

std::atomic<uint64_t> g_sink{0};  // keeps every loop's result observable

}  // namespace

std::vector<std::string> cpu_peak_line_names() {
  std::vector<std::string> out;
  for (const PeakLoop& l : peak_loops()) out.push_back(l.name);
  return out;
}

std::optional<double> measure_cpu_peak_gflops(const std::string& line, int threads, double seconds,
                                              std::string* method) {
  // More threads than hardware threads would take turns on a core, each counting the core's
  // whole rate over its CPU time.
  threads = threads <= 0 ? hardware_threads() : std::min(threads, hardware_threads());
  for (const PeakLoop& l : peak_loops()) {
    if (line != l.name) continue;
    if (!cpu_has(l.requires_)) {
      if (method) *method = std::string("not measured: this CPU does not report ") + l.requires_;
      return std::nullopt;
    }
    // Calibrate on one thread (also the warm-up: clocks and licence levels settle), then size
    // each thread's run to `seconds`; best of 3. The rate counts each thread's flops over its own
    // CPU time (summed over threads): a core's peak does not change when other processes take
    // turns on it, so this holds on a shared machine, where the wall-clock rate (also given)
    // is what is left over. With SMT on, the wall clock.
    int64_t iters = 1 << 16;
    double t = 0;
    while ((t = run_threads(1, [&] { g_sink += static_cast<uint64_t>(l.loop(iters)); }).cpu[0]) < 0.02 &&
           iters < (1ll << 40))
      iters *= 4;
    iters = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(iters) * seconds / std::max(t, 1e-9)));
    const bool smt = smt_active();
    const double per_thread = l.flops_per_iter * static_cast<double>(iters) / 1e9;
    double best = 0, best_wall = 0;
    for (int r = 0; r < 3; ++r) {
      const ThreadTimes tt = run_threads(threads, [&] { g_sink += static_cast<uint64_t>(l.loop(iters)); });
      double rate = 0;
      for (double c : tt.cpu) rate += c > 0 ? per_thread / c : 0;
      const double wall = tt.wall > 0 ? per_thread * threads / tt.wall : 0;
      best = std::max(best, smt ? wall : rate), best_wall = std::max(best_wall, wall);
    }
    if (method) {
      char buf[320];
      std::snprintf(buf, sizeof buf,
                    "%s; %d threads x %lld iterations (~%.2f s), best of 3, %s (wall-clock rate %.1f GFLOP/s)", l.what,
                    threads, static_cast<long long>(iters), seconds,
                    smt ? "wall clock (SMT on)" : "each thread's flops over its CPU time", best_wall);
      *method = buf;
    }
    return best;
  }
  if (method) *method = "not measured: no " + line + " loop for this architecture";
  return std::nullopt;
}

size_t last_level_cache_bytes() {
  size_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string s;
    if (!(f >> s) || s.empty()) continue;
    size_t v = std::strtoull(s.c_str(), nullptr, 10);
    if (s.back() == 'K') v <<= 10;
    else if (s.back() == 'M') v <<= 20;
    best = std::max(best, v);
  }
  return best;
}

double measure_cpu_read_gbs(size_t bytes, int threads, int repeats) {
  if (threads <= 0) threads = hardware_threads();
  bytes = std::max<size_t>(bytes / 4096 * 4096, 1 << 20);
  auto buf = memory::host_alloc(bytes);
  char* p = memory::as<char>(buf);
  const int64_t n = static_cast<int64_t>(bytes);
  parallel_for(n, threads, [&](int64_t b, int64_t e) {  // first touch by the reading threads
    std::memset(p + b, static_cast<int>(b & 0x7f) + 1, static_cast<size_t>(e - b));
  });
  const bool avx2 = cpu_has("avx2");
  auto pass = [&] {
    std::atomic<uint64_t> s{0};
    // Chunks of a multiple of 256 bytes, so every chunk start stays 32-byte aligned.
    const int64_t blocks = n / 256;
    parallel_for(blocks, threads, [&](int64_t b, int64_t e) {
      const char* q = p + b * 256;
      const int64_t len = (e - b) * 256;
#if defined(__x86_64__)
      s += avx2 ? read_avx2(q, len) : read_plain(q, len);
#else
      s += read_plain(q, len);
#endif
    });
    g_sink += s.load();
  };
  pass();
  double best = 0;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    Stopwatch sw;
    pass();
    const double t = sw.seconds();
    if (t > 0) best = std::max(best, static_cast<double>(n / 256 * 256) / t / 1e9);
  }
  return best;
}

}  // namespace tessera::harness
