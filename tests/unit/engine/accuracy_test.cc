// Accuracy of the sliding-window estimators against the exact sliding log (docs/architecture.md,
// "Counting"),
// through window::SlidingWindow directly and through engine::Engine, on the deterministic traces
// of tests/support/traces.h with injected time. The figures the project reports come from
// bench/accuracy_bench.cc; these tests protect the properties those figures rest on:
//   - strict never admits more than the limit in any true window,
//   - the weighted estimate is the published formula (two public write-ups' worked examples),
//   - weighted over-admission on steady traces stays within a measured bound,
//   - the engine decides exactly as a SlidingWindow would on the same trace.
#include "engine/engine.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exact_log.h"
#include "one_rule_policy.h"
#include "rules/rules.h"
#include "traces.h"
#include "window/sliding_window.h"

namespace {

using sluice::testing::Event;
using sluice::testing::ExactSlidingLog;
using sluice::testing::TraceParams;
using sluice::window::Estimator;
using sluice::window::WindowSpec;
namespace engine = sluice::engine;
namespace rules = sluice::rules;
namespace testing = sluice::testing;
namespace window = sluice::window;

constexpr int64_t kSecond = 1'000;
constexpr int64_t kMinute = 60 * kSecond;
constexpr int64_t kHour = 60 * kMinute;
constexpr int64_t kDay = 24 * kHour;

std::shared_ptr<const rules::Policy> make_policy(const WindowSpec& spec, uint64_t limit,
                                                 Estimator est) {
  return testing::one_rule_policy({"acc", "r", "k", limit, spec, est, false}, /*hash_seed=*/7);
}

// Decisions of one SlidingWindow per key.
std::vector<bool> run_sliding_window(const std::vector<Event>& trace, const WindowSpec& spec,
                                     Estimator est, uint64_t limit, uint32_t keys) {
  std::vector<window::SlidingWindow> counters(keys, window::SlidingWindow(spec, est));
  std::vector<bool> allowed;
  allowed.reserve(trace.size());
  for (const Event& e : trace) {
    allowed.push_back(counters[e.key].try_acquire(e.t_ms, e.hits, limit));
  }
  return allowed;
}

// Decisions of an Engine holding one rule with that single limit. Requests of one millisecond go
// in one batch (the engine decides a batch in order), so the batch path is covered too.
std::vector<bool> run_engine(const std::vector<Event>& trace, const WindowSpec& spec, Estimator est,
                             uint64_t limit, uint32_t keys) {
  engine::Engine eng(make_policy(spec, limit, est));
  std::vector<std::string> values(keys);
  for (uint32_t k = 0; k < keys; ++k)
    values[k] = "key-" + std::to_string(k);
  constexpr size_t kMaxBatch = 16;
  std::vector<rules::Descriptor> descs(kMaxBatch);
  std::vector<rules::CheckRequest> batch(kMaxBatch);
  engine::BatchResult out;
  std::vector<bool> allowed;
  allowed.reserve(trace.size());
  for (size_t i = 0; i < trace.size();) {
    const int64_t now = trace[i].t_ms;
    size_t n = 0;
    for (; i + n < trace.size() && n < kMaxBatch && trace[i + n].t_ms == now; ++n) {
      descs[n] = {"k", values[trace[i + n].key]};
      batch[n] = {"acc", {&descs[n], 1}, trace[i + n].hits};
    }
    eng.check({batch.data(), n}, now, out);
    REQUIRE(out.decisions.size() == n);
    for (size_t j = 0; j < n; ++j) {
      REQUIRE(out.decisions[j].error == rules::CheckError::kNone);
      allowed.push_back(out.decisions[j].allowed);
    }
    i += n;
  }
  const auto stats = eng.stats();
  CHECK(stats.evicted_live == 0);
  return allowed;
}

// Judges decisions with shared history: the reference holds what the limiter admitted, and
// before each request says what an exact limiter would decide on that same past.
struct Judgement {
  uint64_t requests = 0;
  uint64_t wrongly_allowed = 0;
  uint64_t wrongly_denied = 0;
  uint64_t admitted_hits = 0;
  uint64_t max_window = 0;  // most hits admitted into any true window of any key
};

Judgement judge(const std::vector<Event>& trace, const std::vector<bool>& allowed,
                int64_t window_ms, uint64_t limit, uint32_t keys) {
  REQUIRE(allowed.size() == trace.size());
  std::vector<ExactSlidingLog> ref(keys, ExactSlidingLog(window_ms));
  Judgement j;
  for (size_t i = 0; i < trace.size(); ++i) {
    const Event& e = trace[i];
    const bool exact = ref[e.key].count(e.t_ms) + e.hits <= limit;
    ++j.requests;
    if (allowed[i] && !exact) ++j.wrongly_allowed;
    if (!allowed[i] && exact) ++j.wrongly_denied;
    if (allowed[i]) {
      ref[e.key].record(e.t_ms, e.hits);
      j.admitted_hits += e.hits;
    }
  }
  for (const auto& log : ref)
    j.max_window = std::max(j.max_window, log.max_window_count());
  return j;
}

std::vector<Event> trace_of(std::string_view name, int64_t window_ms, uint64_t limit,
                            int64_t windows, uint64_t seed, uint32_t max_hits,
                            size_t max_events = 200'000) {
  TraceParams p;
  p.window_ms = window_ms;
  p.limit = limit;
  p.windows = windows;
  p.seed = seed;
  p.max_hits = max_hits;
  p.max_events = max_events;
  auto t = testing::make_trace(name, p);
  REQUIRE(t.has_value());
  return std::move(*t);
}

}  // namespace

// ---- the reference and the traces themselves ----------------------------------------------------

// (No square brackets in test names: CTest discovery splits its list on them.)
TEST_CASE("exact log counts the hits of the last W ms, not those at now - W, and keeps the max") {
  ExactSlidingLog log(1'000);
  log.record(0, 3);
  log.record(500, 2);
  log.record(500, 1);
  CHECK(log.count(999) == 6);
  CHECK(log.count(1'000) == 3);  // t = 0 is at now - W: outside the half-open window
  CHECK(log.max_window_count() == 6);
  log.record(1'400, 4);  // window (400, 1400] holds 2 + 1 + 4
  CHECK(log.max_window_count() == 7);
  CHECK(log.count(1'500) == 4);
  CHECK(log.count(2'400) == 0);
  CHECK(log.max_window_count() == 7);
}

TEST_CASE("traces are deterministic per seed, sorted, and shaped as documented") {
  for (const std::string_view name : testing::kTraceNames) {
    CAPTURE(name);
    const auto a = trace_of(name, kMinute, 600, 20, 11, 3, 50'000);
    const auto b = trace_of(name, kMinute, 600, 20, 11, 3, 50'000);
    const auto c = trace_of(name, kMinute, 600, 20, 12, 3, 50'000);
    REQUIRE(!a.empty());
    CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const Event& x, const Event& y) {
      return x.t_ms == y.t_ms && x.key == y.key && x.hits == y.hits;
    }));
    CHECK(!std::equal(a.begin(), a.end(), c.begin(), c.end(), [](const Event& x, const Event& y) {
      return x.t_ms == y.t_ms && x.key == y.key && x.hits == y.hits;
    }));
    CHECK(std::is_sorted(a.begin(), a.end(),
                         [](const Event& x, const Event& y) { return x.t_ms < y.t_ms; }));
    CHECK(a.front().t_ms >= testing::kTraceStartMs);
    CHECK(a.back().t_ms < testing::kTraceStartMs + 20 * kMinute);
    for (const Event& e : a) {
      REQUIRE(e.hits >= 1);
      REQUIRE(e.hits <= 3);
      REQUIRE(e.key < testing::trace_keys(name));
    }
  }

  // edge-burst: `limit` hits in the 5% before each odd window boundary and `limit` after it.
  const auto edge = trace_of("edge-burst", kMinute, 600, 4, 3, 1);
  REQUIRE(edge.size() == 4 * 600);
  const int64_t b1 = testing::kTraceStartMs + kMinute;
  const int64_t b3 = testing::kTraceStartMs + 3 * kMinute;
  for (size_t i = 0; i < edge.size(); ++i) {
    const int64_t b = i < 1200 ? b1 : b3;
    const bool before = i % 1200 < 600;
    CHECK(edge[i].t_ms >= (before ? b - 3'000 : b));
    CHECK(edge[i].t_ms < (before ? b : b + 3'000));
  }

  // mixed: ~95% of keys far below their limit, the hottest at about 10x.
  const auto mixed = trace_of("mixed", kMinute, 600, 5, 5, 1, 2'000'000);
  std::vector<ExactSlidingLog> logs(testing::kMixedKeys, ExactSlidingLog(kMinute));
  for (const Event& e : mixed)
    logs[e.key].record(e.t_ms, e.hits);
  size_t below_half = 0;
  for (const auto& l : logs)
    below_half += l.max_window_count() < 300 ? 1u : 0u;
  CHECK(below_half >= testing::kMixedKeys * 95 / 100);
  CHECK(logs[0].max_window_count() >= 9 * 600);
  CHECK(logs[0].max_window_count() <= 12 * 600);
}

// ---- (a) strict never over-admits ---------------------------------------------------------------

TEST_CASE("strict admits at most the limit in every true window, any window size and cost") {
  // Windows from the design (1 s .. 1 d) at 1/10 of the window, at their default granularity,
  // and at the default before windows under ten minutes got ten buckets (one bucket for 1 s,
  // 10 s and 1 min); costs of 1..4 hits; the traces that push hardest at the limit.
  struct Case {
    int64_t window_ms;
    int64_t bucket_ms;
    uint64_t limit;
    std::vector<std::string_view> traces;
    std::vector<uint64_t> seeds;
  };
  const std::vector<std::string_view> all = {"steady-2x", "on-off", "edge-burst"};
  const std::vector<uint64_t> seeds = {1, 2, 3};
  std::vector<Case> cases;
  for (const int64_t w : {kSecond, 10 * kSecond, kMinute, 15 * kMinute, kHour, kDay}) {
    cases.push_back({w, w / 10, 60, all, seeds});
    if (w == kDay) continue;
    for (const int64_t b : {window::default_bucket_ms(w), window::legacy_default_bucket_ms(w)}) {
      if (b != w / 10 && b != cases.back().bucket_ms) cases.push_back({w, b, 60, all, seeds});
    }
  }
  // A day at its default one-minute granularity keeps 1441 buckets, and every denied check makes
  // the engine compute retry-after by walking up to n + 2 future buckets, each summing n buckets
  // (O(n^2), ~2M bucket reads: ~130 us in Release, ~15 ms in Debug). Few requests keep the test
  // fast. TODO(perf): cheaper retry-after in window::limit_state, then give this case full size.
  cases.push_back({kDay, kMinute, 8, {"edge-burst"}, {1}});

  for (const Case& c : cases) {
    const WindowSpec spec{c.window_ms, c.bucket_ms};
    REQUIRE(window::validate(spec).ok());
    for (const std::string_view name : c.traces) {
      for (const uint64_t seed : c.seeds) {
        CAPTURE(c.window_ms);
        CAPTURE(c.bucket_ms);
        CAPTURE(name);
        CAPTURE(seed);
        const auto trace = trace_of(name, c.window_ms, c.limit, 6, seed, 4);
        uint64_t offered = 0;
        for (const Event& e : trace)
          offered += e.hits;
        const auto by_window =
            judge(trace, run_sliding_window(trace, spec, Estimator::kStrict, c.limit, 1),
                  c.window_ms, c.limit, 1);
        const auto by_engine = judge(trace, run_engine(trace, spec, Estimator::kStrict, c.limit, 1),
                                     c.window_ms, c.limit, 1);
        CHECK(by_window.max_window <= c.limit);
        CHECK(by_engine.max_window <= c.limit);
        // Strict errs only on the side of denying.
        CHECK(by_window.wrongly_allowed == 0);
        CHECK(by_engine.wrongly_allowed == 0);
        // Not vacuous: these traces exceed the limit, so something was denied.
        CHECK(by_engine.admitted_hits < offered);
      }
    }
  }
}

// ---- (b) published worked examples ------------------------------------------------------------

TEST_CASE(
    "weighted estimate reproduces the two-counter example: 400 in bucket 22, 250 in 23, at 23:45 "
    "is 350") {
  // One-minute window, one bucket per window: bucket 22 is minute 22 of an hour.
  const WindowSpec spec{kMinute, kMinute};
  const int64_t hour = testing::kTraceStartMs;  // whole day, so whole hour
  const int64_t minute22 = hour + 22 * kMinute;
  const int64_t minute23 = hour + 23 * kMinute;
  const int64_t at_23_45 = minute23 + 45 * kSecond;

  // Through the free functions on a caller-owned ring, as the engine uses them.
  std::vector<uint32_t> own(spec.ring_size(), 0u);
  int64_t head = window::bucket_of(minute22, spec.bucket_ms) - 5;
  head = window::advance(own, {}, head, window::bucket_of(minute22, spec.bucket_ms));
  window::add(own, head, 400);
  head = window::advance(own, {}, head, window::bucket_of(minute23, spec.bucket_ms));
  window::add(own, head, 250);
  const window::RingView ring{own, {}, head};
  CHECK(window::estimate(ring, spec, Estimator::kWeighted, at_23_45) == 350.0);
  // "Adding this request would mean that the total would be 351 which is less than 500".
  CHECK(window::admits(ring, spec, Estimator::kWeighted, at_23_45, 1, 500));
  CHECK(window::admits(ring, spec, Estimator::kWeighted, at_23_45, 1, 351));
  CHECK_FALSE(window::admits(ring, spec, Estimator::kWeighted, at_23_45, 1, 350));
  // Strict counts bucket 22 whole.
  CHECK(window::estimate(ring, spec, Estimator::kStrict, at_23_45) == 650.0);

  // The same through SlidingWindow, ending with the example's increment to 251.
  window::SlidingWindow sw(spec, Estimator::kWeighted);
  sw.add(minute22 + 10 * kSecond, 400);
  sw.add(minute23 + 5 * kSecond, 250);
  CHECK(sw.estimate(at_23_45) == 350.0);
  CHECK(sw.try_acquire(at_23_45, 1, 500));
  CHECK(sw.estimate(at_23_45) == 351.0);
}

TEST_CASE("weighted estimate reproduces the two-frame example: 12 * 0.75 + 5 * 0.25 = 10.25") {
  // Allegro's two-frame limiter weights BOTH frames by their share of the window: 25% into the
  // current frame, the previous frame (12) counts 0.75 and the current frame's counter (5) counts
  // 0.25, i.e. the current frame is read at the uniform rate the formula assumes: of a frame that
  // will hold 5, a quarter has arrived. Our estimate (current buckets whole, the straddler
  // weighted) takes the hits that actually arrived. Both agree when the current bucket holds what a
  // uniform rate puts there; with whole hits that needs the counts scaled by 4: 48 in the previous
  // frame, a frame on course for 20 holding 5 after its first quarter: 48 * 0.75 + 5 = 41 = 4
  // * 10.25.
  const WindowSpec spec{kSecond, kSecond};
  const int64_t frame = testing::kTraceStartMs + 100 * kSecond;  // the current frame starts here
  const int64_t quarter_in = frame + kSecond / 4;

  window::SlidingWindow scaled(spec, Estimator::kWeighted);
  scaled.add(frame - kSecond, 48);
  scaled.add(frame, 5);
  CHECK(scaled.estimate(quarter_in) == 4 * 10.25);

  // window::estimate is linear in the counts, so the example's own numbers come out as the sum of
  // its two weighted frames: the previous frame straddling by 0.75 (12 -> 9) and a frame of 5
  // straddling by 0.25 (-> 1.25), each evaluated as the oldest bucket of a one-bucket window.
  std::vector<uint32_t> prev(spec.ring_size(), 0u);
  std::vector<uint32_t> cur(spec.ring_size(), 0u);
  const int64_t b = window::bucket_of(frame, spec.bucket_ms);
  window::add(prev, b - 1, 12);
  window::add(cur, b - 1, 5);
  const double two_frame =
      window::estimate({prev, {}, b - 1}, spec, Estimator::kWeighted, quarter_in) +
      window::estimate({cur, {}, b - 1}, spec, Estimator::kWeighted, frame + 3 * kSecond / 4);
  CHECK(two_frame == 10.25);

  // And what this design says for the example's counters read literally (5 hits so far, counted
  // whole): 12 * 0.75 + 5 = 14.
  window::SlidingWindow literal(spec, Estimator::kWeighted);
  literal.add(frame - kSecond, 12);
  literal.add(frame, 5);
  CHECK(literal.estimate(quarter_in) == 14.0);
}

// ---- (c) weighted over-admission on steady traces -----------------------------------------------

TEST_CASE("weighted over-admits steady Poisson traces by at most a few percent of the limit") {
  // With one bucket per window (1 s, 1 m) the weighted estimate assumes the previous bucket's
  // hits were spread evenly; Poisson arrivals are not, so the estimate wanders around the true
  // count by about sqrt(limit * w * (1 - w)) and a window can end up above the limit. Measured
  // here (worst of seeds 1-3, 1 hit per request, 100 windows of 1 s, 20 of 1 m, 4 of 1 h;
  // through SlidingWindow, which the engine is held equal to below):
  //
  //   trace        window  limit  bucket  max window/limit  admitted/limit rate  wrongly allowed
  //   steady-0.5x  1s      100    1s      0.72              0.510                0
  //   steady-1x    1s      100    1s      1.13              0.937                11.1%
  //   steady-2x    1s      100    1s      1.05              0.988                3.9%
  //   steady-0.5x  1m      600    1m      0.577             0.511                0
  //   steady-1x    1m      600    1m      1.05              0.979                12.5%
  //   steady-2x    1m      600    1m      1.0083            0.998                4.7%
  //   steady-0.5x  1h      3600   1m      0.529             0.511                0
  //   steady-1x    1h      3600   1m      1.0025            0.992                2.9%
  //   steady-2x    1h      3600   1m      1.0033            1.000                3.0%
  //
  // Bounds asserted, each a small margin over the worst measured figure: no true window above
  // limit * (1 + 1.6 / sqrt(limit)) (1.16x at 100, 1.065x at 600, 1.027x at 3600); no more
  // admitted on average than the limit rate + 1%; wrongly allowed below 14% of requests, and none
  // at 0.5x. The wrongly-allowed share is large at 1x because the true count then sits at the
  // limit and every request is a marginal decision; bench/accuracy_bench.cc reports it per trace.
  struct Case {
    int64_t window_ms;
    uint64_t limit;
    int64_t bucket_ms;
    int64_t windows;
  };
  for (const Case c : {Case{kSecond, 100, kSecond, 100}, Case{kMinute, 600, kMinute, 20},
                       Case{kHour, 3600, kMinute, 4}}) {
    const WindowSpec spec{c.window_ms, c.bucket_ms};
    const double limit = static_cast<double>(c.limit);
    for (const std::string_view name : {"steady-0.5x", "steady-1x", "steady-2x"}) {
      for (const uint64_t seed : {1u, 2u, 3u}) {
        CAPTURE(c.window_ms);
        CAPTURE(name);
        CAPTURE(seed);
        const auto trace = trace_of(name, c.window_ms, c.limit, c.windows, seed, 1);
        const auto j =
            judge(trace, run_sliding_window(trace, spec, Estimator::kWeighted, c.limit, 1),
                  c.window_ms, c.limit, 1);
        const double max_over = static_cast<double>(j.max_window) / limit;
        const double rate =
            static_cast<double>(j.admitted_hits) / (limit * static_cast<double>(c.windows));
        const double wrongly_allowed =
            static_cast<double>(j.wrongly_allowed) / static_cast<double>(j.requests);
        CHECK(max_over <= 1.0 + 1.6 / std::sqrt(limit));
        CHECK(rate <= 1.01);
        CHECK(wrongly_allowed < 0.14);
        if (name == "steady-0.5x") CHECK(j.wrongly_allowed == 0);
      }
    }
  }
}

// ---- (d) the engine decides as SlidingWindow does -----------------------------------------------

TEST_CASE("engine decides exactly as SlidingWindow on the same trace, spec and estimator") {
  struct Case {
    int64_t window_ms;
    int64_t bucket_ms;
    uint64_t limit;
    int64_t windows;
  };
  const Case cases[] = {
      {kSecond, kSecond, 50, 20}, {kSecond, 100, 50, 20},          {kMinute, kMinute, 120, 6},
      {kMinute, kSecond, 120, 6}, {15 * kMinute, kMinute, 300, 4}, {kDay, kHour, 500, 3},
  };
  for (const Case& c : cases) {
    const WindowSpec spec{c.window_ms, c.bucket_ms};
    REQUIRE(window::validate(spec).ok());
    for (const Estimator est : {Estimator::kWeighted, Estimator::kStrict}) {
      const std::string_view est_name = window::to_string(est);
      for (const std::string_view name : testing::kTraceNames) {
        CAPTURE(c.window_ms);
        CAPTURE(c.bucket_ms);
        CAPTURE(est_name);
        CAPTURE(name);
        // mixed at these limits is ~66 x limit requests per window: keep it to a few windows.
        const auto trace = trace_of(name, c.window_ms, c.limit, c.windows, 5, 3, 4'000);
        const uint32_t keys = testing::trace_keys(name);
        const auto expected = run_sliding_window(trace, spec, est, c.limit, keys);
        const auto actual = run_engine(trace, spec, est, c.limit, keys);
        REQUIRE(actual.size() == expected.size());
        const auto diff = std::mismatch(expected.begin(), expected.end(), actual.begin());
        if (diff.first != expected.end()) {
          const auto i = static_cast<size_t>(diff.first - expected.begin());
          INFO("first difference at request "
               << i << ": t=" << trace[i].t_ms << " key=" << trace[i].key
               << " hits=" << trace[i].hits << " window says " << expected[i]);
          CHECK(false);
        }
      }
    }
  }
}
