// sluice-bench-edges: how much a client that times its bursts against bucket edges gets into one
// true window (the goal: "bursts timed against bucket edges cannot get more than 1.10x the
// limit into any true window").
//
// The client is closed-loop: at each moment its strategy picks, it sends one hit after another
// while the limiter admits them (at most `limit` in one millisecond), against
// window::SlidingWindow, the arithmetic the engine decides with. Afterwards the admitted hits are
// checked against the exact sliding window: the most that any window (t - W, t] holds, over the
// limit. Strategies:
//   greedy       every millisecond, from a moment just before a bucket ends
//   bucket-end   only in the last millisecond of each bucket
//   edges        in the last millisecond of each bucket and the first of the next
//   end-then-greedy  the whole limit in the last millisecond of a bucket, then every millisecond
// Each strategy starts at 20 phases across a bucket; the row keeps the worst.
//
//   sluice-bench-edges [--window 1s,10s,1m] [--granularity default,1/1,1/10] [--limit 100]
//                      [--windows 12] [--json]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/json_rows.h"
#include "common/scenario.h"
#include "rules/rules.h"
#include "window/sliding_window.h"

namespace {

using namespace sluice;
using window::Estimator;
using window::WindowSpec;

struct Options {
  std::vector<int64_t> windows{1'000, 10'000, 60'000};
  std::vector<std::string> granularities{"default", "1/1"};
  uint64_t limit = 100;
  int windows_run = 12;
  bool json = false;
};

// nullopt: run with o. Otherwise the exit status (common/scenario.h).
std::optional<int> parse(int argc, char** argv, Options& o) {
  sluice::bench::Cli cli("sluice-bench-edges");
  std::vector<std::string> windows;
  cli.app()
      .add_option("--window", windows, "windows, W[,W..] (1s,10s,1m)")
      ->delimiter(',')
      ->check([](const std::string& w) {
        return w.empty() || rules::parse_duration_ms(w) ? std::string() : "bad --window " + w;
      });
  cli.app()
      .add_option("--granularity", o.granularities, "buckets, G[,G..]: default, 1/N (default,1/1)")
      ->delimiter(',');
  cli.number("--limit", o.limit, 1, 100'000, "the limit per window");
  cli.number("--windows", o.windows_run, 3, 1'000, "true windows run per row");
  const std::optional<int> exit = cli.parse(argc, argv);
  o.json = cli.json;
  if (!windows.empty()) o.windows.clear();
  for (const std::string& w : windows) {
    if (!w.empty()) o.windows.push_back(*rules::parse_duration_ms(w));
  }
  std::erase(o.granularities, std::string());
  return exit;
}

// The bucket a granularity names for a window: "default", or "1/N" (N buckets); 0 if invalid.
int64_t bucket_for(const std::string& g, int64_t window_ms) {
  if (g == "default") return window::default_bucket_ms(window_ms);
  if (g.rfind("1/", 0) == 0) {
    const int64_t n = std::atoll(g.c_str() + 2);
    if (n <= 0 || window_ms % n != 0) return 0;
    return window_ms / n;
  }
  return 0;
}

enum class Strategy { kGreedy, kBucketEnd, kEdges, kEndThenGreedy };
constexpr std::pair<Strategy, const char*> kStrategies[] = {
    {Strategy::kGreedy, "greedy"},
    {Strategy::kBucketEnd, "bucket-end"},
    {Strategy::kEdges, "edges"},
    {Strategy::kEndThenGreedy, "end-then-greedy"}};

// The most admitted hits any true window (t - W, t] holds, given (time, count) in time order.
uint64_t max_in_window(const std::vector<std::pair<int64_t, uint64_t>>& admitted, int64_t w) {
  uint64_t best = 0, sum = 0;
  size_t first = 0;
  for (size_t i = 0; i < admitted.size(); ++i) {
    sum += admitted[i].second;
    while (admitted[first].first <= admitted[i].first - w)
      sum -= admitted[first++].second;
    best = std::max(best, sum);
  }
  return best;
}

// One run: the strategy from `start_ms` for `windows` windows; returns the most in a window.
uint64_t run(const WindowSpec& spec, Estimator est, Strategy s, uint64_t limit, int64_t start_ms,
             int windows) {
  window::SlidingWindow sw(spec, est);
  std::vector<std::pair<int64_t, uint64_t>> admitted;
  const int64_t B = spec.bucket_ms;
  const int64_t end = start_ms + windows * spec.window_ms;
  auto send = [&](int64_t t) {
    uint64_t n = 0;
    while (n < limit && sw.try_acquire(t, 1, limit))
      ++n;
    if (n > 0) admitted.emplace_back(t, n);
  };
  for (int64_t t = start_ms; t < end; ++t) {
    const int64_t in_bucket = ((t % B) + B) % B;
    switch (s) {
      case Strategy::kGreedy:
        send(t);
        break;
      case Strategy::kBucketEnd:
        if (in_bucket == B - 1) send(t);
        break;
      case Strategy::kEdges:
        if (in_bucket == B - 1 || in_bucket == 0) send(t);
        break;
      case Strategy::kEndThenGreedy:
        // Idle until the first bucket's last millisecond, then at every one.
        if (t >= start_ms - in_bucket + B - 1 || admitted.size() > 0) send(t);
        break;
    }
  }
  return max_in_window(admitted, spec.window_ms);
}

}  // namespace

int bench_edges_main(int argc, char** argv) {
  Options o;
  if (const std::optional<int> exit = parse(argc, argv, o)) return *exit;
  const int64_t t0 = 28'333'333LL * 60'000;  // an epoch-aligned minute
  bench::Rows rows(o.json);
  for (const int64_t w : o.windows) {
    for (const std::string& g : o.granularities) {
      const int64_t b = bucket_for(g, w);
      const WindowSpec spec = window::make_spec(w, b);
      if (b == 0 || !window::validate(spec).ok()) {
        std::fprintf(stderr, "note: skipping %s at granularity %s: not a valid bucket\n",
                     rules::format_duration(w).c_str(), g.c_str());
        continue;
      }
      for (const Estimator est : {Estimator::kWeighted, Estimator::kStrict}) {
        for (const auto& [s, name] : kStrategies) {
          uint64_t worst = 0;
          for (int phase = 0; phase < 20; ++phase) {
            const int64_t start = t0 + b * phase / 20;
            worst = std::max(worst, run(spec, est, s, o.limit, start, o.windows_run));
          }
          rows.add({{"window_ms", w},
                    {"granularity", g},
                    {"bucket_ms", b},
                    {"estimator", std::string(window::to_string(est))},
                    {"strategy", name},
                    {"limit", o.limit},
                    {"max_window", worst},
                    {"max_window_over_limit",
                     static_cast<double>(worst) / static_cast<double>(o.limit)}});
        }
      }
    }
  }
  rows.finish();
  return 0;
}
