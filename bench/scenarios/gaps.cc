// sluice-bench-gaps: how often, and for how long, this machine takes the CPU away from a running
// thread. One thread reads the monotonic clock in a loop for --seconds; every gap between two
// readings longer than 20 µs is time the thread did not run (an interrupt, the scheduler, or on a
// virtual machine the host taking the vCPU). That is a floor under any tail latency measured on
// the machine (docs/benchmarks.md).
//
// Usage: sluice-bench-gaps [--seconds S] [--json]
#include <time.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/json_rows.h"
#include "common/scenario.h"

namespace {

int64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

}  // namespace

int bench_gaps_main(int argc, char** argv) {
  double seconds = 5;
  sluice::bench::Cli cli("sluice-bench-gaps");
  cli.seconds(seconds, 1e-9, 3600, "how long to watch");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  // Gaps by upper bound (µs); the last bucket holds the rest.
  constexpr std::array<int64_t, 6> kBoundsUs = {50, 100, 200, 500, 1'000, 5'000};
  std::array<uint64_t, kBoundsUs.size() + 1> counts{};
  int64_t max_gap = 0, total_gap = 0;
  const int64_t start = now_ns();
  const int64_t end = start + static_cast<int64_t>(seconds * 1e9);
  int64_t last = start;
  for (;;) {  // bounded by the clock: ends at `end`
    const int64_t n = now_ns();
    if (n >= end) break;
    const int64_t gap = n - last;
    last = n;
    if (gap <= 20'000) continue;
    max_gap = std::max(max_gap, gap);
    total_gap += gap;
    size_t b = 0;
    while (b < kBoundsUs.size() && gap >= kBoundsUs[b] * 1000)
      ++b;
    ++counts[b];
  }
  uint64_t gaps = 0;
  for (const uint64_t c : counts)
    gaps += c;
  sluice::bench::Row buckets = sluice::bench::Row::array();
  int64_t lo = 20;
  for (size_t b = 0; b < counts.size(); ++b) {
    const int64_t hi = b < kBoundsUs.size() ? kBoundsUs[b] : -1;  // -1: no upper bound
    buckets.push_back({{"from_us", lo}, {"to_us", hi}, {"gaps", counts[b]}});
    lo = hi;
  }
  sluice::bench::Rows rows(cli.json);
  rows.add({{"seconds", seconds},
            {"gaps", gaps},
            {"gaps_per_sec", static_cast<double>(gaps) / seconds},
            {"lost_pct", 100.0 * static_cast<double>(total_gap) / (seconds * 1e9)},
            {"max_gap_us", static_cast<double>(max_gap) / 1000.0},
            {"buckets", buckets}});
  rows.finish();
  return 0;
}
