#include "core/trace.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "core/files.h"

namespace tessera::trace {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

struct Event {
  const char* name;
  int64_t arg;
  int64_t t0, t1;  // ns on the steady clock
};

// One thread's events. `mu` is taken by its owner when it records and by a reader (document,
// start); owners never contend with each other.
struct Buffer {
  int tid = 0;
  bool in_use = false;  // owned by a live thread (under State::mu)
  std::mutex mu;
  std::vector<Event> events;
};

struct State {
  std::mutex mu;  // buffers (the list and in_use), names
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::unordered_set<std::string> names;  // node-based: c_str() stays valid
  std::atomic<size_t> reserved{0}, dropped{0}, max_events{kDefaultMaxEvents};
  std::atomic<int64_t> origin{0};
};

// Never destroyed: worker threads may release their buffer during process exit.
State& state() {
  static State* s = new State;
  return *s;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The calling thread's buffer: taken from the free ones (lowest tid first) on first use and
// handed back when the thread exits.
struct Handle {
  Buffer* b = nullptr;
  ~Handle() {
    if (!b) return;
    std::lock_guard<std::mutex> lock(state().mu);
    b->in_use = false;
  }
};
thread_local Handle t_handle;

Buffer& my_buffer() {
  if (t_handle.b) return *t_handle.b;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (auto& b : s.buffers)
    if (!b->in_use) {
      t_handle.b = b.get();
      break;
    }
  if (!t_handle.b) {
    s.buffers.push_back(std::make_unique<Buffer>());
    s.buffers.back()->tid = static_cast<int>(s.buffers.size());
    t_handle.b = s.buffers.back().get();
  }
  t_handle.b->in_use = true;
  return *t_handle.b;
}

void append_escaped(std::string& out, const char* s) {
  for (; *s; ++s) {
    const unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
}

// "lce" of "lce.softmax": the event's category (Perfetto filters by it).
std::string category(const char* name) {
  const char* dot = name;
  while (*dot && *dot != '.') ++dot;
  return *dot ? std::string(name, dot) : std::string("tessera");
}

struct Tagged {
  int tid;
  Event e;
};

std::vector<Tagged> snapshot() {
  State& s = state();
  std::vector<Tagged> all;
  std::lock_guard<std::mutex> lock(s.mu);
  for (auto& b : s.buffers) {
    std::lock_guard<std::mutex> block(b->mu);
    for (const Event& e : b->events) all.push_back({b->tid, e});
  }
  std::stable_sort(all.begin(), all.end(), [](const Tagged& a, const Tagged& b) { return a.e.t0 < b.e.t0; });
  return all;
}

}  // namespace

void start(size_t max_events) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto& b : s.buffers) {
      std::lock_guard<std::mutex> block(b->mu);
      b->events.clear();
    }
    s.reserved = 0;
    s.dropped = 0;
    s.max_events = max_events;
    s.origin = now_ns();
  }
  detail::g_enabled.store(true, std::memory_order_release);
}

void stop() { detail::g_enabled.store(false, std::memory_order_release); }

size_t event_count() { return state().reserved.load() - state().dropped.load(); }
size_t dropped() { return state().dropped.load(); }

const char* intern(const std::string& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.names.insert(name).first->c_str();
}

void Scope::begin(const char* name, int64_t arg) noexcept {
  // The thread takes its buffer (its track) now, not at the first end(): a track is then never
  // handed to another thread while one of this thread's scopes is open on it.
  try {
    my_buffer();
  } catch (...) {  // out of memory: this scope is not recorded
    return;
  }
  name_ = name;
  arg_ = arg;
  t0_ns_ = now_ns();
}

void Scope::end() noexcept {
  const int64_t t1 = now_ns();
  State& s = state();
  if (s.reserved.fetch_add(1, std::memory_order_relaxed) >= s.max_events.load(std::memory_order_relaxed)) {
    s.dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  try {
    Buffer& b = my_buffer();
    std::lock_guard<std::mutex> lock(b.mu);
    b.events.push_back({name_, arg_, t0_ns_, t1});
  } catch (...) {  // out of memory: the event is lost, the kernel is not
    s.dropped.fetch_add(1, std::memory_order_relaxed);
  }
}

Span span(const std::string& name) {
  Span out;
  int64_t first = 0, last = 0;
  for (const Tagged& t : snapshot()) {
    if (name != t.e.name) continue;
    first = out.events == 0 ? t.e.t0 : std::min(first, t.e.t0);
    last = out.events == 0 ? t.e.t1 : std::max(last, t.e.t1);
    ++out.events;
  }
  out.ns = last - first;
  return out;
}

std::string document(const std::string& process) {
  const std::vector<Tagged> events = snapshot();
  const State& s = state();
  const int64_t origin = s.origin.load();
  const long pid = static_cast<long>(::getpid());
  std::string out;
  out.reserve(128 + events.size() * 120);
  char buf[256];
  out += "{\"traceEvents\":[\n";
  std::snprintf(buf, sizeof buf, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%ld,\"tid\":0,\"args\":{\"name\":\"", pid);
  out += buf;
  append_escaped(out, process.c_str());
  out += "\"}}";
  std::vector<int> tids;
  for (const Tagged& t : events)
    if (std::find(tids.begin(), tids.end(), t.tid) == tids.end()) tids.push_back(t.tid);
  std::sort(tids.begin(), tids.end());
  for (int tid : tids) {
    std::snprintf(buf, sizeof buf,
                  ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%ld,\"tid\":%d,\"args\":{\"name\":\"thread %d\"}}",
                  pid, tid, tid);
    out += buf;
  }
  for (const Tagged& t : events) {
    out += ",\n{\"name\":\"";
    append_escaped(out, t.e.name);
    out += "\",\"cat\":\"";
    append_escaped(out, category(t.e.name).c_str());
    std::snprintf(buf, sizeof buf, "\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%ld,\"tid\":%d,\"args\":{",
                  static_cast<double>(t.e.t0 - origin) / 1e3, static_cast<double>(t.e.t1 - t.e.t0) / 1e3, pid,
                  t.tid);
    out += buf;
    if (t.e.arg != Scope::kNoArg) {
      std::snprintf(buf, sizeof buf, "\"i\":%lld", static_cast<long long>(t.e.arg));
      out += buf;
    }
    out += "}}";
  }
  std::snprintf(buf, sizeof buf,
                "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"tessera_version\":\"%s\",\"events\":%zu,"
                "\"dropped\":%zu,\"max_events\":%zu}}\n",
                TESSERA_VERSION, events.size(), s.dropped.load(), s.max_events.load());
  out += buf;
  return out;
}

void write(const std::string& path, const std::string& process) { files::write_atomically(path, document(process)); }

}  // namespace tessera::trace
