// attention cpu benchmark (never a unit test): times forward and forward+backward of an
// implementation against the machine's sgemm rate, in one run.
//
//   attention_cpu_bench [--impl cpu] [--B 1] [--H 8] [--Hkv H] [--S 2048] [--Sk S] [--D 128]
//                       [--dtype f32] [--causal 0|1|2 (2 = both)] [--threads 0] [--reps 5]
//                       [--bq 0 --bkv 0 (0 = defaults)] [--no-bwd] [--gemm-n 2048]
//
// Useful FLOPs: forward 4·B·Hq·D·(allowed pairs) (QKᵀ and PV), backward 2.5× that (the five
// products of FA2 count as 10·D per pair). The sgemm rate is measured here with OpenBLAS on the
// same thread count (square n×n×n, median of 5). Extra memory is the peak of the library's
// tracked scratch (core/memory.h) during the calls.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/random.h"
#include "tessera/attention.h"

using namespace tessera;
namespace att = tessera::attention;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Median wall seconds of `reps` calls after one warm-up; *cpu receives the median process CPU
// seconds (all threads) of the same calls. On a shared machine CPU time is the steadier of the
// two: wall time also counts the time slices other processes took.
double last_cpu_seconds = 0.0;
template <class F>
double median_seconds(int reps, F&& f) {
  f();  // warm-up
  std::vector<double> t, c;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now(), c0 = cpu_now();
    f();
    t.push_back(now() - t0);
    c.push_back(cpu_now() - c0);
  }
  std::sort(t.begin(), t.end());
  std::sort(c.begin(), c.end());
  last_cpu_seconds = c[c.size() / 2];
  return t[t.size() / 2];
}

// sgemm GFLOP/s by wall time; *per_cpu: GFLOP per CPU-second × threads (the rate it would have
// with the cores to itself).
double sgemm_rate(int n, int threads, int reps, double* per_cpu = nullptr) {
  openblas_set_num_threads(threads);
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a);
  const double s = median_seconds(reps, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  const double fl = 2.0 * n * double(n) * n;
  if (per_cpu) *per_cpu = fl / (last_cpu_seconds / threads) / 1e9;
  return fl / s / 1e9;
}


// Allowed (query, key) pairs of one head for causal / full attention.
double allowed_pairs(int64_t Sq, int64_t Sk, bool causal) {
  if (!causal) return double(Sq) * double(Sk);
  double n = 0;
  for (int64_t i = 0; i < Sq; ++i) n += double(std::clamp<int64_t>(i + Sk - Sq + 1, 0, Sk));
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string impl = "cpu", dtype = "f32";
  int64_t B = 1, H = 8, Hkv = 0, S = 2048, Sk = 0, D = 128, bq = 0, bkv = 0;
  int causal_mode = 2, threads = 0, reps = 5, gemm_n = 2048;
  bool bwd = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--impl") impl = next();
    else if (a == "--B") B = std::atoll(next());
    else if (a == "--H") H = std::atoll(next());
    else if (a == "--Hkv") Hkv = std::atoll(next());
    else if (a == "--S") S = std::atoll(next());
    else if (a == "--Sk") Sk = std::atoll(next());
    else if (a == "--D") D = std::atoll(next());
    else if (a == "--dtype") dtype = next();
    else if (a == "--causal") causal_mode = std::atoi(next());
    else if (a == "--threads") threads = std::atoi(next());
    else if (a == "--reps") reps = std::atoi(next());
    else if (a == "--bq") bq = std::atoll(next());
    else if (a == "--bkv") bkv = std::atoll(next());
    else if (a == "--no-bwd") bwd = false;
    else if (a == "--gemm-n") gemm_n = std::atoi(next());
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (Hkv == 0) Hkv = H;
  if (Sk == 0) Sk = S;
  const int T = resolve_num_threads(threads);
  const DType dt = parse_dtype(dtype);
  double gemm_cpu = 0.0;
  double gemm = gemm_n > 0 ? sgemm_rate(gemm_n, T, 5, &gemm_cpu) : 0.0;
  std::printf("sgemm %dx%dx%d on %d threads: %.1f GFLOP/s\n", gemm_n, gemm_n, gemm_n, T, gemm);

  const float a = std::sqrt(6.0f);  // q, k ~ U(−a, a): scale·q·k has std a²/3 = 2
  Tensor q = random_uniform(dt, {B, S, H, D}, a, 1), k = random_uniform(dt, {B, Sk, Hkv, D}, a, 2),
         v = random_uniform(dt, {B, Sk, Hkv, D}, 1.0f, 3), go = random_uniform(dt, {B, S, H, D}, 1.0f, 4);
  Tensor o = Tensor::empty(dt, {B, S, H, D}), lse = Tensor::empty(DType::kF32, {B, H, S});
  Tensor dq = Tensor::empty(dt, q.shape()), dk = Tensor::empty(dt, k.shape()), dv = Tensor::empty(dt, v.shape());
  std::printf("%-6s %-5s %-6s %-28s %10s %10s %8s %10s\n", "impl", "dtype", "mask", "shape", "pass", "ms", "GFLOP/s",
              "of sgemm");
  for (int c = 0; c < 2; ++c) {
    if (causal_mode != 2 && c != causal_mode) continue;
    att::Options opt;
    opt.implementation = impl;
    opt.num_threads = T;
    opt.causal = c == 1;
    if (bq > 0 || bkv > 0) opt.block_sizes = att::BlockSizes{bq > 0 ? bq : 128, bkv > 0 ? bkv : 256};
    const double flops_f = 4.0 * double(B) * double(H) * double(D) * allowed_pairs(S, Sk, opt.causal);
    char shape[64];
    std::snprintf(shape, sizeof shape, "B=%lld H=%lld/%lld S=%lld/%lld D=%lld", (long long)B, (long long)H,
                  (long long)Hkv, (long long)S, (long long)Sk, (long long)D);
    auto report = [&](const char* pass, double sec, double flops, size_t mem) {
      const double gf = flops / sec / 1e9;
      const double gf_cpu = flops / (last_cpu_seconds / T) / 1e9;
      // The sgemm rate again right after the pass: on a shared machine the load drifts, so the
      // fraction is taken against the mean of the rates measured before and after.
      double after_cpu = 0.0;
      const double after = gemm_n > 0 ? sgemm_rate(gemm_n, T, 3, &after_cpu) : 0.0;
      const double ceiling = gemm > 0 ? 0.5 * (gemm + after) : 0.0;
      const double ceiling_cpu = 0.5 * (gemm_cpu + after_cpu);
      gemm = after;
      gemm_cpu = after_cpu;
      std::printf("%-6s %-5s %-6s %-28s %10s %10.1f %8.1f %9.0f%%   extra %.1f MiB\n", impl.c_str(), dtype.c_str(),
                  opt.causal ? "causal" : "full", shape, pass, sec * 1e3, gf, ceiling > 0 ? 100.0 * gf / ceiling : 0.0,
                  double(mem) / (1 << 20));
      std::printf("       (sgemm %.1f GFLOP/s around this pass; by CPU time: kernel %.1f, sgemm %.1f GFLOP/s, %.0f%%)\n",
                  ceiling, gf_cpu, ceiling_cpu, ceiling_cpu > 0 ? 100.0 * gf_cpu / ceiling_cpu : 0.0);
    };
    memory::reset_peak(memory::Space::kHost);
    size_t base = memory::current_bytes(memory::Space::kHost);
    const double tf = median_seconds(reps, [&] { att::forward({q, k, v}, {o, lse}, opt); });
    report("forward", tf, flops_f, memory::peak_bytes(memory::Space::kHost) - base);
    if (!bwd) continue;
    memory::reset_peak(memory::Space::kHost);
    base = memory::current_bytes(memory::Space::kHost);
    const double tb = median_seconds(reps, [&] { att::backward({q, k, v}, {o, lse, go}, {dq, dk, dv}, opt); });
    report("backward", tb, 2.5 * flops_f, memory::peak_bytes(memory::Space::kHost) - base);
    memory::reset_peak(memory::Space::kHost);
    base = memory::current_bytes(memory::Space::kHost);
    const double tfb = median_seconds(reps, [&] { att::forward_backward({q, k, v}, go, {o, lse}, {dq, dk, dv}, opt); });
    report("fwd+bwd", tfb, 3.5 * flops_f, memory::peak_bytes(memory::Space::kHost) - base);
  }
  return 0;
}
