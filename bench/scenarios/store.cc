// sluice-bench-store: what persistence costs (the persistence goals in docs/benchmarks.md).
//
// Rows:
//   snapshot   N keys, every one changed (checked once), one Store::snapshot pass into a fresh
//              RocksDB directory: time, records, bytes written (write-batch bytes) and the data
//              directory's size after the pass; then a pass with nothing changed (the steady cost
//              of the 1 s snapshot interval on an idle table).
//   latency    check latency on one thread (one Engine::check of one key per sample, timed with
//              steady_clock) while nothing else runs ("idle"), then while the main thread runs a
//              snapshot pass of N changed keys ("during snapshot"); p50/p99/p99.9 of each and the
//              ratio of the p99s (target: <= 2).
//   restore    M keys written by a full snapshot, then Store::restore into a new engine: time
//              (target: 10M keys <= 5 s) and restored count.
// Keys are "user-<n>" in one domain with a 1e9-per-minute limit (every check counted); simulated
// time stays inside one minute so nothing expires. The data directory is a fresh temporary one,
// removed at exit. The generator and the engine share this machine's cores.

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/percentile.h"
#include "common/scenario.h"
#include "engine/engine.h"
#include "one_rule_policy.h"
#include "store/store.h"
#include "temp_dir.h"
#include "traces.h"

namespace {

namespace fs = std::filesystem;
using namespace sluice;
using Clock = std::chrono::steady_clock;

constexpr int64_t kNowMs = testing::kTraceStartMs + 1'000;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

uint64_t dir_bytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  }
  return total;
}

// The value, or the run ends with the store's message: a bench has no caller to hand it to.
template <typename T>
T or_exit(StatusOr<T> r) {
  if (!r.ok()) {
    std::fprintf(stderr, "store: %s\n", r.message().c_str());
    std::exit(2);
  }
  return std::move(r).value();
}

std::shared_ptr<const rules::Policy> policy() {
  return testing::one_rule_policy({.key = "user", .limit = 1'000'000'000}, 1);
}

// One check of user-<i>; the ns the check took.
uint32_t check_user(engine::Engine& e, uint64_t i, engine::BatchResult& out) {
  char buf[32] = "user-";
  const auto end = std::to_chars(buf + 5, buf + sizeof buf, i).ptr;
  const rules::Descriptor d[] = {{"user", std::string_view(buf, static_cast<size_t>(end - buf))}};
  const rules::CheckRequest req{"bench", d, 1};
  const auto t0 = Clock::now();
  e.check({&req, 1}, kNowMs, out);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  return static_cast<uint32_t>(std::min<int64_t>(ns, UINT32_MAX));
}

// Checks user-<i> once for every i in [0, n): every key live and changed.
void fill(engine::Engine& e, uint64_t n) {
  engine::BatchResult out;
  for (uint64_t i = 0; i < n; ++i)
    check_user(e, i, out);
}

// Times single checks of random keys in [0, n) until `stop` (or `max` samples); sorted.
void time_checks(engine::Engine& e, uint64_t n, const std::atomic<bool>& stop, size_t max,
                 std::vector<uint32_t>& out) {
  engine::BatchResult res;
  std::mt19937_64 rng(7);
  while (!stop.load(std::memory_order_relaxed) && out.size() < max)
    out.push_back(check_user(e, rng() % n, res));
  std::sort(out.begin(), out.end());
}

// The quantile q of sorted samples in ns, in µs (0 without samples).
double us(const std::vector<uint32_t>& ns, double q) {
  return ns.empty() ? 0 : sluice::bench::percentile_sorted(ns, q) / 1000.0;
}

}  // namespace

int bench_store_main(int argc, char** argv) {
  struct {
    uint64_t snapshot_keys = 1'000'000;
    uint64_t restore_keys = 10'000'000;
    uint64_t latency_checks = 3'000'000;  // idle samples; the snapshot phase takes what it lasts
  } o;
  sluice::bench::Cli cli("sluice-bench-store");
  cli.app().add_option("--snapshot-keys", o.snapshot_keys, "keys in the snapshot measured");
  cli.app().add_option("--restore-keys", o.restore_keys, "keys in the restore measured");
  cli.app().add_option("--latency-checks", o.latency_checks, "idle check latency samples");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  bench::Rows rows(cli.json);
  engine::EngineOptions eo;
  eo.memory_cap_bytes = 8ull << 30;

  // ---- snapshot of N changed keys, and the p99 of checks during it ----
  {
    testing::TempDir tmp("sluice-bench-store");
    engine::Engine e(policy(), eo);
    fill(e, o.snapshot_keys);
    auto store = or_exit(store::Store::open(tmp.path + "/data", true));

    std::vector<uint32_t> idle, during;
    idle.reserve(o.latency_checks);
    during.reserve(64u << 20);
    std::atomic<bool> stop{false};
    time_checks(e, o.snapshot_keys, stop, o.latency_checks, idle);
    // Every key changed again, so the pass below writes all N (the idle phase touched only some).
    e.mark_all_changed();

    std::atomic<bool> started{false};
    std::thread checker([&] {
      started = true;
      time_checks(e, o.snapshot_keys, stop, during.capacity(), during);
    });
    while (!started.load())
      std::this_thread::yield();
    const auto t0 = Clock::now();
    const store::SnapshotResult r = store->snapshot(e);
    const double secs = seconds_since(t0);
    stop = true;
    checker.join();
    store->flush();
    const uint64_t disk = dir_bytes(tmp.path + "/data");
    store->snapshot(e);  // what the checker changed behind the cursor during the timed pass
    const auto t1 = Clock::now();
    const store::SnapshotResult quiet = store->snapshot(e);
    const double quiet_secs = seconds_since(t1);

    rows.add({{"row", "snapshot"},
              {"keys", o.snapshot_keys},
              {"ok", r.ok},
              {"seconds", secs},
              {"records", r.written},
              {"bytes_written", r.bytes},
              {"disk_bytes_after_flush", disk},
              {"unchanged_pass_ms", quiet_secs * 1000.0}});
    rows.add({{"row", "latency"},
              {"keys", o.snapshot_keys},
              {"idle_p50_us", us(idle, 0.5)},
              {"idle_p99_us", us(idle, 0.99)},
              {"idle_p999_us", us(idle, 0.999)},
              {"snapshot_p50_us", us(during, 0.5)},
              {"snapshot_p99_us", us(during, 0.99)},
              {"snapshot_p999_us", us(during, 0.999)},
              {"snapshot_samples", during.size()},
              {"p99_ratio", us(during, 0.99) / us(idle, 0.99)}});
  }

  // ---- restore of M keys ----
  if (o.restore_keys > 0) {
    testing::TempDir tmp("sluice-bench-store");
    double write_secs = 0;
    store::SnapshotResult w;
    {
      engine::Engine e(policy(), eo);
      fill(e, o.restore_keys);
      auto store = or_exit(store::Store::open(tmp.path + "/data", true));
      const auto t0 = Clock::now();
      w = store->snapshot(e, true);
      store->flush();
      write_secs = seconds_since(t0);
    }
    const uint64_t disk = dir_bytes(tmp.path + "/data");
    // Twice: right after the write (RocksDB still compacting what it flushed), then settled.
    std::array<double, 2> secs{};
    store::RestoreResult r;
    for (size_t attempt = 0; attempt < secs.size(); ++attempt) {
      engine::Engine e(policy(), eo);
      const auto t0 = Clock::now();
      auto store = or_exit(store::Store::open(tmp.path + "/data", false));
      r = or_exit(store->restore(e, kNowMs + 1));
      secs[attempt] = seconds_since(t0);
    }
    rows.add({{"row", "restore"},
              {"keys", o.restore_keys},
              {"seconds", secs[1]},
              {"seconds_right_after_write", secs[0]},
              {"restored", r.restored},
              {"full_snapshot_seconds", write_secs},
              {"bytes_written", w.bytes},
              {"disk_bytes", disk}});
  }
  rows.finish();
  return 0;
}
