// The CPU backends' worker threads (primitives/cpu_threads.h): every tid runs once and all of a
// call's bodies run at the same time (they meet at a barrier), helpers are parked and reused
// between calls (no more than max_parked()), callers on several threads get their own helpers, a
// body's exception comes back to the caller, every body runs with the caller's rounding mode and
// CPU affinity, and a fork()ed child starts its own helpers.
#include "primitives/cpu_threads.h"

#include <fenv.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <stdexcept>
#include <thread>
#include <vector>

namespace tessera::cpu_threads {
namespace {

// Runs T bodies that wait for each other at a barrier (a call whose bodies did not all run at
// once would never return); returns how often each tid ran.
std::vector<int> meet(int T) {
  std::barrier<> all(T);
  std::vector<std::atomic<int>> ran(static_cast<size_t>(T));
  run_threads(T, false, "test", [&](int tid) {
    ran[static_cast<size_t>(tid)].fetch_add(1);
    all.arrive_and_wait();
  });
  std::vector<int> out;
  for (auto& r : ran) out.push_back(r.load());
  return out;
}

TEST(CpuThreads, EveryTidRunsOnceAndAllAtOnce) {
  for (int T : {1, 2, 3, 5, 8}) EXPECT_EQ(meet(T), std::vector<int>(static_cast<size_t>(T), 1)) << "T = " << T;
}

TEST(CpuThreads, HelpersAreParkedAndReused) {
  meet(4);
  const int before = started();
  EXPECT_GE(parked(), 3);
  for (int i = 0; i < 100; ++i) meet(4);
  EXPECT_EQ(started(), before) << "a call started threads although three helpers were parked";
}

TEST(CpuThreads, CallersOnSeveralThreadsEachGetTheirOwnHelpers) {
  std::vector<std::thread> callers;
  std::atomic<int> good{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int i = 0; i < 50; ++i) good += meet(3) == std::vector<int>{1, 1, 1};
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(good.load(), 200);
  EXPECT_GE(started(), 8);  // four calls at once needed two helpers each at some point
}

TEST(CpuThreads, ABodysExceptionReachesTheCallerAfterEveryBodyEnded) {
  std::atomic<int> finished{0};
  EXPECT_THROW(run_threads(4, false, "test",
                           [&](int tid) {
                             if (tid == 2) throw std::runtime_error("tid 2");
                             std::this_thread::sleep_for(std::chrono::milliseconds(20));
                             finished.fetch_add(1);
                           }),
               std::runtime_error);
  EXPECT_EQ(finished.load(), 3);
  EXPECT_EQ(meet(4), std::vector<int>(4, 1));  // the helpers are back and work
}

// Helpers first started by another thread take the caller's floating-point environment (a
// helper that kept FTZ or a rounding mode of its first caller would make results depend on which
// thread took which work item) and its CPU affinity (a helper started by a pinned thread would
// pin every later call).
TEST(CpuThreads, BodiesRunWithTheCallersRoundingAndAffinity) {
  const auto modes = [](int T) {
    std::vector<int> out(static_cast<size_t>(T));
    run_threads(T, false, "test", [&](int tid) { out[static_cast<size_t>(tid)] = fegetround(); });
    return out;
  };
  std::thread([&] {  // starts (or wakes) helpers while rounding upward
    fesetround(FE_UPWARD);
    EXPECT_EQ(modes(4), std::vector<int>(4, FE_UPWARD));
  }).join();
  ASSERT_EQ(fegetround(), FE_TONEAREST);
  EXPECT_EQ(modes(4), std::vector<int>(4, FE_TONEAREST));

  cpu_set_t all;
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof all, &all), 0);
  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "one CPU: nothing to pin apart";
  const auto cpus = [](int T) {
    std::vector<int> out(static_cast<size_t>(T));
    run_threads(T, false, "test", [&](int tid) {
      cpu_set_t s;
      pthread_getaffinity_np(pthread_self(), sizeof s, &s);
      out[static_cast<size_t>(tid)] = CPU_COUNT(&s);
    });
    return out;
  };
  std::thread([&] {  // a pinned caller: its call stays on its one CPU
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &all)) {
        CPU_SET(c, &one);
        break;
      }
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
    EXPECT_EQ(cpus(3), std::vector<int>(3, 1));
  }).join();
  EXPECT_EQ(cpus(3), std::vector<int>(3, CPU_COUNT(&all)));  // the same helpers, unpinned again
}

TEST(CpuThreads, NoMoreThanMaxParkedStayParked) {
  const int wide = max_parked() + 5;
  EXPECT_EQ(meet(wide), std::vector<int>(static_cast<size_t>(wide), 1));
  EXPECT_EQ(parked(), max_parked());
  EXPECT_EQ(meet(4), std::vector<int>(4, 1));  // the helpers that stayed still work
}

TEST(CpuThreads, AForkedChildStartsItsOwnHelpers) {
  meet(3);  // the parent has parked helpers; the child has none of their threads
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);  // a child that waits on a helper that is not there dies of SIGALRM
    const bool ok = parked() == 0 && meet(3) == std::vector<int>{1, 1, 1} && started() == 2;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

}  // namespace
}  // namespace tessera::cpu_threads
