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
//   end-then-greedy  idle into the first bucket (until its elapsed ms plus its place in the bucket
//                reach the bucket's last millisecond), then the limit every millisecond
// Each strategy starts at 20 phases across a bucket; the row keeps the worst.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "common/scenario.h"
#include "rules/rules.h"
#include "window/sliding_window.h"

namespace {

using namespace sluice;
using window::Estimator;
using window::WindowSpec;

// The bucket a granularity names for a window: "default", or "1/N" (N buckets); 0 if invalid.
int64_t bucket_for(const std::string& g, int64_t window_ms) {
  if (g == "default") return window::default_bucket_ms(window_ms);
  const int64_t n = g.starts_with("1/") ? std::atoll(g.c_str() + 2) : 0;
  return n <= 0 || window_ms % n != 0 ? 0 : window_ms / n;
}

struct Strategy {
  const char* name;
  // Whether the client sends at a millisecond `at` ms into its bucket of `b`, `since` ms after
  // the run's start, `admitted`: once any hit was admitted.
  bool (*sends)(int64_t at, int64_t b, int64_t since, bool admitted);
};
constexpr Strategy kStrategies[] = {
    {"greedy", [](int64_t, int64_t, int64_t, bool) { return true; }},
    {"bucket-end", [](int64_t at, int64_t b, int64_t, bool) { return at == b - 1; }},
    {"edges", [](int64_t at, int64_t b, int64_t, bool) { return at == b - 1 || at == 0; }},
    {"end-then-greedy", [](int64_t at, int64_t b, int64_t since,
                           bool admitted) { return admitted || since + at >= b - 1; }},
};

// One run: the strategy from `start` for `windows` windows; the most any true window
// (t - W, t] holds.
uint64_t run(const WindowSpec& spec, Estimator est, const Strategy& s, uint64_t limit,
             int64_t start, int windows) {
  window::SlidingWindow sw(spec, est);
  std::vector<std::pair<int64_t, uint64_t>> admitted;  // (ms, hits) in time order
  const int64_t b = spec.bucket_ms;
  for (int64_t t = start; t < start + windows * spec.window_ms; ++t) {
    if (!s.sends(((t % b) + b) % b, b, t - start, !admitted.empty())) continue;
    uint64_t n = 0;
    while (n < limit && sw.try_acquire(t, 1, limit))
      ++n;
    if (n > 0) admitted.emplace_back(t, n);
  }
  uint64_t best = 0, sum = 0;
  for (size_t i = 0, first = 0; i < admitted.size(); ++i) {
    sum += admitted[i].second;
    while (admitted[first].first <= admitted[i].first - spec.window_ms)
      sum -= admitted[first++].second;
    best = std::max(best, sum);
  }
  return best;
}

}  // namespace

int bench_edges_main(int argc, char** argv) {
  std::vector<std::string> windows{"1s", "10s", "1m"}, granularities{"default", "1/1"};
  uint64_t limit = 100;
  int windows_run = 12;
  bench::Cli cli("sluice-bench-edges");
  cli.app()
      .add_option("--window", windows, "windows, W[,W..] (1s,10s,1m)")
      ->delimiter(',')
      ->check([](const std::string& w) {
        return w.empty() || rules::parse_duration_ms(w) ? std::string() : "bad --window " + w;
      });
  cli.app()
      .add_option("--granularity", granularities, "buckets, G[,G..]: default, 1/N (default,1/1)")
      ->delimiter(',');
  cli.number("--limit", limit, 1, 100'000, "the limit per window");
  cli.number("--windows", windows_run, 3, 1'000, "true windows run per row");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  const int64_t t0 = 28'333'333LL * 60'000;  // an epoch-aligned minute
  bench::Rows rows(cli.json);
  for (const std::string& window : windows) {
    for (const std::string& g : granularities) {
      if (window.empty() || g.empty()) continue;
      const int64_t w = *rules::parse_duration_ms(window);
      const int64_t b = bucket_for(g, w);
      const WindowSpec spec = window::make_spec(w, b);
      if (b == 0 || !window::validate(spec).ok()) {
        std::fprintf(stderr, "note: skipping %s at granularity %s: not a valid bucket\n",
                     window.c_str(), g.c_str());
        continue;
      }
      for (const Estimator est : {Estimator::kWeighted, Estimator::kStrict}) {
        for (const Strategy& s : kStrategies) {
          uint64_t worst = 0;
          for (int phase = 0; phase < 20; ++phase)
            worst = std::max(worst, run(spec, est, s, limit, t0 + b * phase / 20, windows_run));
          rows.add(
              {{"window_ms", w},
               {"granularity", g},
               {"bucket_ms", b},
               {"estimator", std::string(window::to_string(est))},
               {"strategy", s.name},
               {"limit", limit},
               {"max_window", worst},
               {"max_window_over_limit", static_cast<double>(worst) / static_cast<double>(limit)}});
        }
      }
    }
  }
  rows.finish();
  return 0;
}
