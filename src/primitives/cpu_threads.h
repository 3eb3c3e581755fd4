// Tessera internal: the worker threads of the CPU backends (built with TESSERA_CPU_BACKEND).
//
// run_threads(T, blas, who, body) runs body(tid) for tid in [0, T) on T threads, the caller being
// thread 0, and returns when all are done. With `blas`, OpenBLAS is held at one thread meanwhile
// (cpu_blas::SingleThreaded: the backends call sgemm from each worker). An exception thrown by
// any body is rethrown in the caller after every thread has finished (the first one wins); a
// thread that cannot be started is Error(kUnsupported) naming `who`, and then no body has run.
//
// The T − 1 helpers are parked threads kept between calls (cpu_threads.cc): a call pays a
// wake-up, not a thread start (a 1×16×4×8 attention forward on a 2-core Zen 4, two threads: 97 µs
// when each call started its helper, 38 µs parked). They are the call's alone until it returns:
// the T bodies run at the same time, so bodies may wait for each other (a barrier), and calls on
// several threads of the caller's process each get their own helpers (more are started when
// every parked one is taken; at most max_parked() stay parked, the rest end). Each job runs with
// the caller's floating-point environment (flush-to-zero, rounding) and CPU affinity, as a thread
// the caller started would. A child process made by fork() starts with none parked.
#pragma once

#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "primitives/cpu_blas.h"

namespace tessera::cpu_threads {

// job(ctx, tid) for tid in [1, T) on parked helpers and job(ctx, 0) on the caller; returns when
// all are done. Throws Error(kUnsupported) naming `who` when T − 1 helpers cannot be had
// (nothing has run then).
void run_team(int T, const std::string& who, void (*job)(void*, int) noexcept, void* ctx);

// Helper threads started since the process (or the fork() that made it) began, parked now, and
// the most that stay parked: for tests and tools.
int started();
int parked();
int max_parked();

template <class F>
void run_threads(int T, bool blas, const std::string& who, F&& body) {
  std::optional<cpu_blas::SingleThreaded> blas_guard;
  if (blas) blas_guard.emplace();
  if (T <= 1) {
    body(0);
    return;
  }
  struct Shared {
    explicit Shared(F& b) : body(b) {}
    F& body;
    std::exception_ptr failure;
    std::mutex mu;
  } shared(body);
  run_team(T, who, [](void* ctx, int tid) noexcept {
    auto& s = *static_cast<Shared*>(ctx);
    try {
      s.body(tid);
    } catch (...) {
      std::lock_guard<std::mutex> lock(s.mu);
      if (!s.failure) s.failure = std::current_exception();
    }
  }, &shared);
  if (shared.failure) std::rethrow_exception(shared.failure);
}

}  // namespace tessera::cpu_threads
