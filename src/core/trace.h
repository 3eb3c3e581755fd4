// Tessera internal: named scopes recorded as a Chrome / Perfetto trace (Trace Event JSON).
//
//   TESSERA_TRACE_SCOPE("lce.softmax");         // one complete event ("ph": "X") on this thread
//   TESSERA_TRACE_SCOPE_I("gmm.item", g);       // the same with args {"i": g}
//
// Off (the default) a scope costs one relaxed atomic load and a branch: nothing is allocated,
// no clock is read. On (trace::start), each thread records into a buffer of its own (a lock
// no other thread takes while recording), found through a thread_local; a thread's buffer
// outlives the thread and is handed to the next new thread, so threads that come and go reuse a
// few stable track ids instead of one each (the CPU backends' helpers are parked between calls
// and keep theirs; a thread owns its track from its first scope on, so two threads' open scopes
// never share one). The total number of
// events is capped (start's `max_events`); events past the cap are counted as dropped.
// trace::write / trace::document produce {"traceEvents": [...], ...}; open it in
// https://ui.perfetto.dev or chrome://tracing.
//
// Scopes are meant to be coarse: one per phase per thread-task (a token block's GEMM, a work
// item), never one per inner-loop iteration. Names are string literals (the pointer is kept);
// a name built at run time goes through trace::intern first. The CUDA module marks its phases
// with NVTX ranges instead (core/trace_nvtx.h), which Nsight Systems records.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::trace {

namespace detail {
extern std::atomic<bool> g_enabled;
}

constexpr size_t kDefaultMaxEvents = 200000;

// Starts recording: clears the events of any earlier recording and sets the time origin.
void start(size_t max_events = kDefaultMaxEvents);
// Stops recording (scopes open now still record when they close); events are kept.
void stop();
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

size_t event_count();  // recorded so far (at most max_events)
size_t dropped();      // past the cap

// A stable copy of `name` for a scope (kept until the process exits; one copy per distinct name).
const char* intern(const std::string& name);

// The recorded events as a Trace Event JSON document; `process` names the process track.
std::string document(const std::string& process = "tessera");
// Writes document(process) to `path` atomically. Throws Error(kIo).
void write(const std::string& path, const std::string& process = "tessera");

// The recorded events named `name` (every thread): the wall-clock span from the first one's
// begin to the last one's end, and how many there were (0: none, span 0). A pipeline stage
// marked by one scope per thread-task gets its wall time this way (harness/bench.h: stages).
struct Span {
  size_t events = 0;
  int64_t ns = 0;
};
Span span(const std::string& name);

// One complete event from construction to destruction, on the calling thread.
class Scope {
 public:
  explicit Scope(const char* name, int64_t arg = kNoArg) noexcept {
    if (detail::g_enabled.load(std::memory_order_relaxed)) [[unlikely]]
      begin(name, arg);
  }
  ~Scope() {
    if (name_) [[unlikely]]
      end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  static constexpr int64_t kNoArg = INT64_MIN;

 private:
  void begin(const char* name, int64_t arg) noexcept;
  void end() noexcept;
  const char* name_ = nullptr;
  int64_t arg_ = kNoArg;
  int64_t t0_ns_ = 0;
};

}  // namespace tessera::trace

#define TESSERA_TRACE_CONCAT2(a, b) a##b
#define TESSERA_TRACE_CONCAT(a, b) TESSERA_TRACE_CONCAT2(a, b)
#define TESSERA_TRACE_SCOPE(name) \
  ::tessera::trace::Scope TESSERA_TRACE_CONCAT(tessera_trace_scope_, __COUNTER__)(name)
#define TESSERA_TRACE_SCOPE_I(name, i) \
  ::tessera::trace::Scope TESSERA_TRACE_CONCAT(tessera_trace_scope_, __COUNTER__)(name, static_cast<int64_t>(i))
