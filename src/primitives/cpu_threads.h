// Tessera internal: the worker threads of the CPU backends (built with TESSERA_CPU_BACKEND).
//
// run_threads(T, blas, body) runs body(tid) for tid in [0, T) on T threads, the caller being
// thread 0, and returns when all are done. With `blas`, OpenBLAS is held at one thread meanwhile
// (cpu_blas::SingleThreaded: the backends call sgemm from each worker). An exception thrown by
// any body is rethrown in the caller after every thread has finished (the first one wins); a
// thread that cannot be started is Error(kUnsupported) naming `who`.
#pragma once

#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "primitives/cpu_blas.h"
#include "tessera/error.h"

namespace tessera::cpu_threads {

template <class F>
void run_threads(int T, bool blas, const std::string& who, F&& body) {
  std::optional<cpu_blas::SingleThreaded> blas_guard;
  if (blas) blas_guard.emplace();
  if (T <= 1) {
    body(0);
    return;
  }
  std::atomic<int> go{0};  // 0 wait, 1 run, 2 abort
  std::exception_ptr failure;
  std::mutex failure_mu;
  auto guarded = [&](int tid) {
    try {
      body(tid);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mu);
      if (!failure) failure = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(T - 1));
  auto run = [&](int tid) {
    while (go.load(std::memory_order_acquire) == 0) std::this_thread::yield();
    if (go.load(std::memory_order_acquire) == 1) guarded(tid);
  };
  try {
    for (int k = 1; k < T; ++k) threads.emplace_back(run, k);
  } catch (...) {
    go.store(2, std::memory_order_release);
    for (auto& t : threads) t.join();
    throw Error(ErrorCode::kUnsupported, who + ": could not start " + std::to_string(T) + " threads");
  }
  go.store(1, std::memory_order_release);
  guarded(0);
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace tessera::cpu_threads
