// sluice-bench-gaps: how often, and for how long, this machine takes the CPU away from a running
// thread. One thread reads the monotonic clock in a loop for --seconds; every gap between two
// readings longer than 20 µs is time the thread did not run (an interrupt, the scheduler, or on a
// virtual machine the host taking the vCPU). That is a floor under any tail latency measured on
// the machine (docs/benchmarks.md). The row's buckets count the gaps by length: [from_us, to_us),
// to_us -1 for the last, unbounded one.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>

#include "common/scenario.h"

int bench_gaps_main(int argc, char** argv) {
  double seconds = 5;
  sluice::bench::Cli cli("sluice-bench-gaps");
  cli.seconds(seconds, 1e-9, 3600, "how long to watch");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  constexpr std::array<int64_t, 7> kFromUs = {20, 50, 100, 200, 500, 1'000, 5'000};
  std::array<uint64_t, kFromUs.size()> counts{};
  int64_t max_gap = 0, total_gap = 0;  // ns
  const auto now_ns = [] {
    return std::chrono::steady_clock::now().time_since_epoch() / std::chrono::nanoseconds(1);
  };
  const int64_t start = now_ns();
  const int64_t end = start + static_cast<int64_t>(seconds * 1e9);
  for (int64_t last = start, n = start; (n = now_ns()) < end; last = n) {
    const int64_t gap = n - last;
    if (gap <= 20'000) continue;
    max_gap = std::max(max_gap, gap);
    total_gap += gap;
    ++counts[static_cast<size_t>(std::upper_bound(kFromUs.begin(), kFromUs.end(), gap / 1000) -
                                 kFromUs.begin() - 1)];
  }
  uint64_t gaps = 0;
  sluice::bench::Row buckets = sluice::bench::Row::array();
  for (size_t b = 0; b < counts.size(); ++b) {
    const int64_t to = b + 1 < kFromUs.size() ? kFromUs[b + 1] : -1;
    buckets.push_back({{"from_us", kFromUs[b]}, {"to_us", to}, {"gaps", counts[b]}});
    gaps += counts[b];
  }
  cli.one_row({{"seconds", seconds},
               {"gaps", gaps},
               {"gaps_per_sec", static_cast<double>(gaps) / seconds},
               {"lost_pct", 100.0 * static_cast<double>(total_gap) / (seconds * 1e9)},
               {"max_gap_us", static_cast<double>(max_gap) / 1000.0},
               {"buckets", buckets}});
  return 0;
}
