#include "primitives/cpu_threads.h"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <thread>
#include <vector>

#include "tessera/error.h"

namespace tessera::cpu_threads {
namespace {

// One parked helper. The caller hands it a job under its mutex; the helper runs it, clears it
// and sets `busy` false (then notifies): the caller waits on `busy`, which lives here, never on
// its own stack, so a helper never touches a call's memory after the call may have returned.
class Helper {
 public:
  Helper() : thread_([this] { loop(); }) {}

  void start(void (*job)(void*, int), void* ctx, int tid) {
    busy_.store(true, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = job, ctx_ = ctx, tid_ = tid;
    }
    cv_.notify_one();
  }
  void wait() {
    for (int spin = 0; spin < 256 && busy_.load(std::memory_order_acquire); ++spin) std::this_thread::yield();
    while (busy_.load(std::memory_order_acquire)) busy_.wait(true, std::memory_order_acquire);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return job_ != nullptr; });
      lock.unlock();
      job_(ctx_, tid_);
      lock.lock();
      job_ = nullptr;
      busy_.store(false, std::memory_order_release);
      busy_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  void (*job_)(void*, int) = nullptr;
  void* ctx_ = nullptr;
  int tid_ = 0;
  std::atomic<bool> busy_{false};
  std::thread thread_;  // last: started once the members it reads exist
};

// The parked helpers. Never destroyed (a parked thread at exit is ended with the process; joining
// it from a static destructor could race a call still running on another thread). After fork()
// the child has none of the parent's threads: it forgets them (leaked) and starts its own.
class Pool {
 public:
  Pool() { pthread_atfork([] { get().mu_.lock(); }, [] { get().mu_.unlock(); }, [] { get().forget(); }); }
  static Pool& get() {
    static Pool* pool = new Pool;
    return *pool;
  }

  // n helpers for one call: parked ones first, new ones for the rest. Throws what
  // std::thread throws (std::system_error) with every helper taken so far given back.
  std::vector<Helper*> take(int n) {
    std::vector<Helper*> team;
    std::lock_guard<std::mutex> lock(mu_);
    try {
      while (static_cast<int>(team.size()) < n) {
        if (parked_.empty()) {
          parked_.push_back(new Helper);
          ++started_;
        }
        team.push_back(parked_.back());
        parked_.pop_back();
      }
    } catch (...) {
      parked_.insert(parked_.end(), team.begin(), team.end());
      throw;
    }
    return team;
  }
  void give_back(const std::vector<Helper*>& team) {
    std::lock_guard<std::mutex> lock(mu_);
    parked_.insert(parked_.end(), team.begin(), team.end());
  }
  int started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }
  int parked() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(parked_.size());
  }

 private:
  void forget() {  // fork()'s child, the mutex held by prepare: the helpers are not here
    parked_.clear();
    started_ = 0;
    mu_.unlock();
  }

  std::mutex mu_;
  std::vector<Helper*> parked_;
  int started_ = 0;
};

}  // namespace

void run_team(int T, const std::string& who, void (*job)(void*, int), void* ctx) {
  std::vector<Helper*> team;
  try {
    team = Pool::get().take(T - 1);
  } catch (...) {
    throw Error(ErrorCode::kUnsupported, who + ": could not start " + std::to_string(T) + " threads");
  }
  for (size_t k = 0; k < team.size(); ++k) team[k]->start(job, ctx, static_cast<int>(k) + 1);
  job(ctx, 0);
  for (Helper* h : team) h->wait();
  Pool::get().give_back(team);
}

int started() { return Pool::get().started(); }
int parked() { return Pool::get().parked(); }

}  // namespace tessera::cpu_threads
