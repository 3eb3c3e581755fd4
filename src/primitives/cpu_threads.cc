#include "primitives/cpu_threads.h"

#include <fenv.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "tessera/error.h"

namespace tessera::cpu_threads {
namespace {

// What a thread started by the caller would have inherited from it, handed to a parked helper
// with each job: the floating-point environment (MXCSR's flush-to-zero / denormals-are-zero and
// rounding: results must not depend on which thread took which work item) and the CPU affinity (a
// pinned serving thread's call stays on its CPUs; a helper first started by a pinned thread does
// not pin a later caller's call).
struct Inherited {
  fenv_t env{};
  cpu_set_t cpus{};
  bool has_cpus = false;  // false where the mask does not fit a cpu_set_t (> CPU_SETSIZE CPUs)

  static Inherited of_caller() {
    Inherited in;
    fegetenv(&in.env);
    in.has_cpus = pthread_getaffinity_np(pthread_self(), sizeof in.cpus, &in.cpus) == 0;
    return in;
  }
  // Makes this thread's state `want`'s; `*this` is what the thread has now.
  void adopt(const Inherited& want) {
    if (std::memcmp(&env, &want.env, sizeof env) != 0) fesetenv(&want.env), env = want.env;
    if (want.has_cpus && !(has_cpus && CPU_EQUAL(&cpus, &want.cpus)) &&
        pthread_setaffinity_np(pthread_self(), sizeof want.cpus, &want.cpus) == 0)
      cpus = want.cpus, has_cpus = true;
  }
};

// One parked helper. The caller hands it a job under its mutex; the helper runs it, clears it
// and sets `busy_` to 0 (then notifies): the caller waits on `busy_`, which lives here, never on
// its own stack, so a helper never touches a call's memory after the call may have returned.
class Helper {
 public:
  Helper() : thread_([this] { loop(); }) {}

  void start(void (*job)(void*, int) noexcept, void* ctx, int tid, const Inherited& from) {
    busy_.store(1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = job, ctx_ = ctx, tid_ = tid, from_ = from;
    }
    cv_.notify_one();
  }
  void wait() {
    for (int spin = 0; spin < 64 && busy_.load(std::memory_order_acquire); ++spin) std::this_thread::yield();
    while (busy_.load(std::memory_order_acquire)) busy_.wait(1, std::memory_order_acquire);
  }
  // Ends the thread once it is parked (the pool keeps no more helpers than its cap); the thread
  // deletes its Helper.
  void retire() {
    thread_.detach();
    std::lock_guard<std::mutex> lock(mu_);  // notified under the lock: the thread cannot delete
    retire_ = true;                          // its Helper before this returns
    cv_.notify_one();
  }

  Helper* next = nullptr;  // the pool's list of parked helpers (under the pool's mutex)

 private:
  void loop() {
    Inherited mine = Inherited::of_caller();
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return job_ != nullptr || retire_; });
      if (job_ == nullptr) break;
      lock.unlock();
      mine.adopt(from_);
      job_(ctx_, tid_);
      lock.lock();
      job_ = nullptr;
      busy_.store(0, std::memory_order_release);
      busy_.notify_one();
    }
    lock.unlock();
    delete this;  // retired: detached by retire(), nobody else holds it
  }

  std::mutex mu_;
  std::condition_variable cv_;
  void (*job_)(void*, int) noexcept = nullptr;
  void* ctx_ = nullptr;
  int tid_ = 0;
  Inherited from_;
  bool retire_ = false;
  std::atomic<uint32_t> busy_{0};  // 32 bits: waited on through the futex directly
  std::thread thread_;             // last: started once the members it reads exist
};

// Twice the hardware threads, at least 16: enough for a few callers at full width at once. Set
// when the library is loaded (no function-local static: its init guard could be copied half-taken
// by a fork()).
const int g_max_parked = std::max(16, 2 * static_cast<int>(std::thread::hardware_concurrency()));

// The parked helpers: a list under one mutex. Constant-initialized and trivially destructible: no
// init guard that a fork() could copy half-taken, nothing run at exit (a parked helper is ended
// with the process). At most g_max_parked stay parked; more are ended when given back.
class Pool {
 public:
  constexpr Pool() = default;

  // Appends n helpers to `team`: parked ones first, new ones (started outside the lock) for the
  // rest. Throws what starting a thread throws, with the helpers taken so far given back.
  void take(std::vector<Helper*>& team, int n) {
    team.reserve(static_cast<size_t>(n));
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (; static_cast<int>(team.size()) < n && head_; --parked_) team.push_back(head_), head_ = head_->next;
    }
    try {
      while (static_cast<int>(team.size()) < n) {
        team.push_back(nullptr);  // the slot first: push_back cannot throw once the helper exists
        team.back() = new Helper;
        std::lock_guard<std::mutex> lock(mu_);
        ++started_;
      }
    } catch (...) {
      if (!team.empty() && team.back() == nullptr) team.pop_back();
      give_back(team);
      throw;
    }
  }
  void give_back(const std::vector<Helper*>& team) {
    std::vector<Helper*> extra;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Helper* h : team) {
        if (parked_ >= g_max_parked) {
          extra.push_back(h);
          continue;
        }
        h->next = head_, head_ = h, ++parked_;
      }
    }
    for (Helper* h : extra) h->retire();
  }
  int started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }
  int parked() {
    std::lock_guard<std::mutex> lock(mu_);
    return parked_;
  }
  void prepare() { mu_.lock(); }
  void parent() { mu_.unlock(); }
  void child() {  // fork()'s child: the parent's helper threads are not here; forget them (leaked)
    head_ = nullptr, parked_ = 0, started_ = 0;
    mu_.unlock();
  }

 private:
  std::mutex mu_;
  Helper* head_ = nullptr;
  int parked_ = 0, started_ = 0;
};

constinit Pool g_pool;
// Registered when the library is loaded, before any call can run (and so before any fork can
// meet a half-made pool).
[[maybe_unused]] const int g_atfork =
    pthread_atfork([] { g_pool.prepare(); }, [] { g_pool.parent(); }, [] { g_pool.child(); });

}  // namespace

void run_team(int T, const std::string& who, void (*job)(void*, int) noexcept, void* ctx) {
  std::vector<Helper*> team;
  try {
    g_pool.take(team, T - 1);
  } catch (...) {
    throw Error(ErrorCode::kUnsupported, who + ": could not start " + std::to_string(T) + " threads");
  }
  const Inherited from = Inherited::of_caller();
  for (size_t k = 0; k < team.size(); ++k) team[k]->start(job, ctx, static_cast<int>(k) + 1, from);
  job(ctx, 0);
  for (Helper* h : team) h->wait();
  g_pool.give_back(team);
}

int started() { return g_pool.started(); }
int parked() { return g_pool.parked(); }
int max_parked() { return g_max_parked; }

}  // namespace tessera::cpu_threads
