// The trace recorder (core/trace.h): nested scopes, threads, the event cap, off = no events, and
// a document that nlohmann-json parses as Chrome's Trace Event format.
#include "core/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <algorithm>
#include <filesystem>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

namespace tessera {
namespace {

using nlohmann::json;

// The "X" events of a document, checking the fields every event must have.
std::vector<json> complete_events(const json& doc) {
  std::vector<json> out;
  for (const json& e : doc.at("traceEvents")) {
    EXPECT_TRUE(e.contains("name") && e.contains("ph") && e.contains("pid") && e.contains("tid")) << e.dump();
    if (e.at("ph") != "X") continue;
    EXPECT_TRUE(e.at("ts").is_number() && e.at("dur").is_number() && e.at("args").is_object()) << e.dump();
    EXPECT_GE(e.at("dur").get<double>(), 0.0) << e.dump();
    EXPECT_EQ(e.at("pid").get<long>(), static_cast<long>(::getpid()));
    out.push_back(e);
  }
  return out;
}

void spin_us(int us) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

// Chrome's rule for "X" events: on one track (pid, tid) they nest, never partly overlap.
bool nests_per_track(const std::vector<json>& events) {
  std::map<int, std::vector<std::pair<double, double>>> tracks;
  for (const json& e : events) tracks[e.at("tid").get<int>()].push_back({e.at("ts"), e.at("ts").get<double>() + e.at("dur").get<double>()});
  for (auto& [tid, spans] : tracks) {
    std::sort(spans.begin(), spans.end(), [](auto& a, auto& b) { return a.first < b.first || (a.first == b.first && a.second > b.second); });
    std::vector<double> open;  // ends of the enclosing spans
    for (const auto& [begin, end] : spans) {
      while (!open.empty() && open.back() <= begin) open.pop_back();
      if (!open.empty() && end > open.back() + 2e-3) return false;  // ts, dur are rounded to ns
      open.push_back(end);
    }
  }
  return true;
}

class Trace : public ::testing::Test {
 protected:
  void TearDown() override { trace::stop(); }
};

TEST_F(Trace, OffRecordsNothing) {
  trace::start();
  trace::stop();  // cleared, and off
  EXPECT_FALSE(trace::enabled());
  for (int i = 0; i < 100; ++i) TESSERA_TRACE_SCOPE("test.off");
  EXPECT_EQ(trace::event_count(), 0u);
  EXPECT_TRUE(complete_events(json::parse(trace::document())).empty());
}

TEST_F(Trace, NestedScopesNestInTimeOnOneThread) {
  trace::start();
  {
    TESSERA_TRACE_SCOPE("test.outer");
    spin_us(200);
    {
      TESSERA_TRACE_SCOPE_I("test.inner", 7);
      spin_us(300);
    }
    spin_us(200);
  }
  trace::stop();
  const json doc = json::parse(trace::document("unit"));
  const auto ev = complete_events(doc);
  ASSERT_EQ(ev.size(), 2u) << doc.dump();
  const json& outer = ev[0].at("name") == "test.outer" ? ev[0] : ev[1];
  const json& inner = ev[0].at("name") == "test.inner" ? ev[0] : ev[1];
  EXPECT_EQ(outer.at("name"), "test.outer");
  EXPECT_EQ(inner.at("name"), "test.inner");
  EXPECT_EQ(inner.at("cat"), "test");
  EXPECT_EQ(inner.at("args").at("i"), 7);
  EXPECT_TRUE(outer.at("args").empty());
  EXPECT_EQ(inner.at("tid"), outer.at("tid"));
  const double ots = outer.at("ts"), odur = outer.at("dur"), its = inner.at("ts"), idur = inner.at("dur");
  EXPECT_GE(idur, 300.0);
  EXPECT_GE(odur, 700.0);
  EXPECT_GE(its, ots + 200.0);
  EXPECT_LE(its + idur, ots + odur - 200.0);
  // The process track is named, the thread track too.
  bool process_named = false, thread_named = false;
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("ph") != "M") continue;
    process_named |= e.at("name") == "process_name" && e.at("args").at("name") == "unit";
    thread_named |= e.at("name") == "thread_name" && e.at("tid") == inner.at("tid");
  }
  EXPECT_TRUE(process_named && thread_named) << doc.dump();
  EXPECT_EQ(doc.at("otherData").at("events"), 2);
  EXPECT_EQ(doc.at("otherData").at("dropped"), 0);
}

TEST_F(Trace, ThreadsRecordOnTheirOwnTracksAndReuseThem) {
  constexpr int kThreads = 4, kScopes = 10;
  trace::start();
  TESSERA_TRACE_SCOPE("test.main");  // the main thread's own track, open while workers record
  auto round = [&] {
    std::barrier all(kThreads);
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&all, t] {
        TESSERA_TRACE_SCOPE_I("test.worker", t);
        all.arrive_and_wait();  // every worker is inside its scope at once: one buffer each
        for (int i = 0; i < kScopes; ++i) TESSERA_TRACE_SCOPE_I("test.step", i);
      });
    for (auto& th : ts) th.join();
  };
  round();
  const auto first = complete_events(json::parse(trace::document()));
  round();  // new threads take the buffers the first ones handed back
  trace::stop();
  const auto ev = complete_events(json::parse(trace::document()));
  std::set<int> tids1, tids2;
  for (const json& e : first) tids1.insert(e.at("tid").get<int>());
  int steps = 0, workers = 0;
  for (const json& e : ev) {
    steps += e.at("name") == "test.step";
    workers += e.at("name") == "test.worker";
    if (e.at("name") != "test.main") tids2.insert(e.at("tid").get<int>());
  }
  EXPECT_EQ(steps, 2 * kThreads * kScopes);
  EXPECT_EQ(workers, 2 * kThreads);
  EXPECT_EQ(tids1.size(), static_cast<size_t>(kThreads));
  EXPECT_EQ(tids2, tids1) << "the second round's threads reuse the first round's tracks";
  EXPECT_TRUE(nests_per_track(ev)) << "two threads' open scopes shared a track";
  // "test.main" is still open, so not in the document yet.
  EXPECT_EQ(ev.size(), static_cast<size_t>(2 * kThreads * (kScopes + 1)));
}

TEST_F(Trace, TwoScopesOnOneLineAreTwoEvents) {
  trace::start();
  { TESSERA_TRACE_SCOPE("test.a"); TESSERA_TRACE_SCOPE_I("test.b", 1); }  // distinct names (__COUNTER__)
  trace::stop();
  EXPECT_EQ(complete_events(json::parse(trace::document())).size(), 2u);
}

TEST_F(Trace, CapsTheEventCountAndCountsTheRest) {
  trace::start(5);
  for (int i = 0; i < 12; ++i) TESSERA_TRACE_SCOPE_I("test.capped", i);
  trace::stop();
  EXPECT_EQ(trace::event_count(), 5u);
  EXPECT_EQ(trace::dropped(), 7u);
  const json doc = json::parse(trace::document());
  const auto ev = complete_events(doc);
  ASSERT_EQ(ev.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ev[static_cast<size_t>(i)].at("args").at("i"), i);  // the first ones kept
  EXPECT_EQ(doc.at("otherData").at("dropped"), 7);
  EXPECT_EQ(doc.at("otherData").at("max_events"), 5);
  trace::start();  // a new recording starts empty
  EXPECT_EQ(trace::event_count(), 0u);
  EXPECT_EQ(trace::dropped(), 0u);
}

TEST_F(Trace, InternedNamesAreEscapedAndWrittenToAFile) {
  const char* name = trace::intern(std::string("row \"cpu\" \\ fwd\t") + "B=8");
  EXPECT_EQ(name, trace::intern(std::string("row \"cpu\" \\ fwd\tB=8")));  // one copy per name
  trace::start();
  { trace::Scope s(name); }
  trace::stop();
  const auto path = std::filesystem::temp_directory_path() / ("tessera_trace_test_" + std::to_string(::getpid()) + ".json");
  trace::write(path.string(), "file");
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  std::filesystem::remove(path);
  const auto ev = complete_events(json::parse(text.str()));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].at("name"), "row \"cpu\" \\ fwd\tB=8");
  EXPECT_EQ(ev[0].at("cat"), "tessera");  // no "prefix." in the name
}

TEST_F(Trace, WriteToAnUnwritablePathThrows) {
  trace::start();
  trace::stop();
  EXPECT_ANY_THROW(trace::write("/proc/tessera_no_such_dir/t.json"));
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// trace::span: the wall-clock span of one name's events over every thread, and their count.
TEST(TraceSpan, CoversEveryThreadsEventsOfOneName) {
  trace::start();
  const auto t0 = std::chrono::steady_clock::now();
  std::thread other([] {
    TESSERA_TRACE_SCOPE("span.stage");
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  });
  {
    TESSERA_TRACE_SCOPE("span.stage");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  other.join();
  { TESSERA_TRACE_SCOPE("span.other"); }
  const double wall_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  trace::stop();
  const trace::Span s = trace::span("span.stage");
  EXPECT_EQ(s.events, 2u);
  EXPECT_GE(s.ns, 3'000'000);  // the longer of two overlapping scopes at least
  EXPECT_LE(s.ns, wall_ns);
  EXPECT_EQ(trace::span("span.other").events, 1u);
  const trace::Span none = trace::span("span.absent");
  EXPECT_EQ(none.events, 0u);
  EXPECT_EQ(none.ns, 0);
}

}  // namespace
}  // namespace tessera
