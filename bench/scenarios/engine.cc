// sluice-bench-engine: checks per second of the in-process engine, on one thread and on several,
// with 1M and 10M live keys, and bytes of memory per live key, measured (the goals in
// docs/benchmarks.md).
//
// Per row (keys x distribution):
//   1. Generate every key string ("user-<n>", in one arena) and each thread's stream of requests
//      (keys drawn uniform, or Zipf(s = 0.99); its own seed), laid out in arrival order like a
//      receive buffer, so neither string building nor sampling is timed, and their memory is
//      allocated before the "before" reading.
//   2. Read the allocator (mallinfo2: uordblks + hblkhd, since glibc serves big blocks with mmap
//      and counts those only in hblkhd; plus engine::mapped_table_bytes, the tables the engine
//      maps itself) and RSS (VmRSS), after malloc_trim so memory an earlier row freed does not
//      hide this row's growth.
//   3. Build the engine (memory cap 8 GiB: nothing is evicted, the evicted counts show it) and
//      touch every key once, so all are live. Read both again: the deltas over the keys are
//      bytes_per_key and rss_bytes_per_key; table_bytes_per_key is the engine's own account.
//   4. Time Engine::check on batches of --batch requests with a reused BatchResult, up to --checks
//      checks or --seconds, once per --threads count, every thread on the same engine.
//      checks_per_sec is every thread's together over the wall time; checks_per_sec_per_thread
//      divides it by the threads (one thread per core: the per-core figure).
// Simulated time advances 1 ms per 1024 checks (about the pace of a busy node), starting 45 s into
// a minute so the timed phase crosses a bucket boundary and ring advances are part of the cost.
// The limit (default 1e9 per minute) is far above any key's traffic so every check is allowed and
// counted: the figure is the cost of the counting path, not of early denials.
//
// --scenario sync-cost: what one cluster sync pass (Engine::sync_step until done) costs with
// --keys idle counters and --active of them touched between passes. Every key is checked once,
// then one pass and one resend pass leave all of them synced; then --passes passes run as a node
// runs them (DeltaSync::pass): 100 simulated ms apart, every 50th one a resend pass (the 5 s
// anti-entropy interval), each after one check of every active key (a fixed random set). Steps of
// 256 (DeltaSync's), a sink that only counts, owns() true for one counter in three. One row per
// kind of pass: the thread's CPU time (CLOCK_THREAD_CPUTIME_ID) over its sync_step calls,
// p50/p99/max in ms, and the counters it reported per pass.
//
// --cluster: the engine of a cluster member, whose counter slots also hold others' counts
// (default: of a node on its own, as sluiced without a cluster section).
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/json_rows.h"
#include "common/key_arena.h"
#include "common/percentile.h"
#include "common/proc_stats.h"
#include "common/process.h"
#include "common/scenario.h"
#include "engine/engine.h"
#include "one_rule_policy.h"
#include "rules/rules.h"
#include "traces.h"
#include "window/sliding_window.h"

namespace {

using sluice::bench::KeyArena;
using sluice::bench::thread_cpu_ms;
using sluice::engine::BatchResult;
using sluice::engine::Engine;
using sluice::engine::EngineOptions;
namespace rules = sluice::rules;
namespace window = sluice::window;
namespace testing = sluice::testing;

constexpr double kZipfS = 0.99;
constexpr int64_t kChecksPerMs = 1024;
constexpr int64_t kStartMs = testing::kTraceStartMs + 45'000;

struct Options {
  std::string scenario = "throughput";
  std::vector<uint64_t> keys = {1'000'000, 10'000'000};
  std::vector<uint64_t> active = {0, 1'000, 10'000, 100'000};  // sync-cost: touched per pass
  uint64_t passes = 500;                                       // sync-cost
  std::vector<std::string> dists = {"uniform", "zipf"};
  double seconds = 10.0;
  uint64_t checks = 20'000'000;
  uint64_t limit = 1'000'000'000;
  int64_t bucket_ms = 0;  // --granularity: the limit's bucket, 0 = the default for 1 minute
  bool cluster = false;   // --cluster: a cluster member's tables (slots with others' counts)
  uint32_t shards = 64;
  uint64_t seed = 1;
  std::vector<uint64_t> threads = {1, 2};
  size_t batch = 32;
};

// nullopt: run with o. Otherwise the exit status (common/scenario.h).
std::optional<int> parse_args(int argc, char** argv, Options& o, bool& json) {
  sluice::bench::Cli cli("sluice-bench-engine");
  std::string dist;
  cli.word("--scenario", o.scenario, {"throughput", "sync-cost"},
           "throughput: checks/s per key count, distribution and threads; sync-cost: what a "
           "sync pass costs");
  CLI::Option* keys = cli.numbers("--keys", o.keys, 1, UINT32_MAX, "key counts, N[,N..]");
  cli.numbers("--active", o.active, 0, 1e18, "sync-cost: active keys, N[,N..] (<= --keys)");
  cli.number("--passes", o.passes, 1, 1e18, "sync-cost: passes");
  cli.word("--dist", dist, {"uniform", "zipf"}, "key popularity (default: both)");
  cli.number("--seconds", o.seconds, 1e-9, 1e9, "measured seconds per row");
  cli.number("--checks", o.checks, 0, 1e18, "checks per row instead of --seconds");
  cli.number("--limit", o.limit, 0, 1e18, "every key's limit per minute");
  cli.flag("--cluster", o.cluster, "a cluster member's tables (slots with others' counts)");
  cli.number("--granularity", o.bucket_ms, 0, 1e18,
             "the limit's bucket in ms (0: the default for 1 minute)");
  cli.number("--shards", o.shards, 0, UINT32_MAX, "shards of the counter table");
  cli.numbers("--threads", o.threads, 1, 64, "threads, N[,N..]");
  cli.number("--batch", o.batch, 1, 4096, "checks per call");
  cli.app().add_option("--seed", o.seed, "seed of the keys");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return exit;
  json = cli.json;
  if (!dist.empty()) o.dists = {dist};
  if (const sluice::Status why = window::validate(window::make_spec(60'000, o.bucket_ms));
      o.bucket_ms != 0 && !why.ok()) {
    return cli.fail("--granularity: " + why.message());
  }
  if (o.scenario == "sync-cost" && keys->count() == 0) o.keys = {1'000'000};
  // --active is the sync-cost scenario's: the check rows take any number of keys.
  if (o.scenario == "sync-cost" && !o.active.empty() &&
      *std::max_element(o.active.begin(), o.active.end()) >
          *std::min_element(o.keys.begin(), o.keys.end())) {
    return cli.fail("--active must not exceed --keys");
  }
  return std::nullopt;
}

// The timed requests laid out in arrival order, one fixed 16-byte slot per request, the way a
// daemon finds them in its receive buffer: reading a request's key is a sequential read, not a
// jump into a table of every key's text (which would time a cache miss no server pays).
struct RequestStream {
  static constexpr size_t kSlot = 16;
  std::vector<char> bytes;
  std::vector<uint8_t> len;
  std::string_view operator[](uint64_t i) const { return {bytes.data() + i * kSlot, len[i]}; }
};

// `len` requests drawn uniform or Zipf(kZipfS) over the first `keys` keys of `arena`.
RequestStream make_stream(const KeyArena& arena, uint64_t keys, uint64_t len, std::string_view dist,
                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  const testing::ZipfSampler zipf(dist == "zipf" ? keys : 1, kZipfS);
  RequestStream st;
  st.bytes.resize(len * RequestStream::kSlot);
  st.len.resize(len);
  for (uint64_t i = 0; i < len; ++i) {
    const std::string_view k = arena[dist == "zipf" ? zipf(rng) : rng() % keys];
    std::copy(k.begin(), k.end(), st.bytes.begin() + static_cast<std::ptrdiff_t>(i * st.kSlot));
    st.len[i] = static_cast<uint8_t>(k.size());
  }
  return st;
}

// Bytes in use: the allocator's (heap chunks + mmapped chunks, mallinfo2) with the tables the
// engine maps itself, and resident memory.
struct MemReading {
  uint64_t allocator = 0;
  uint64_t rss = 0;
};

MemReading read_memory() {
  const struct mallinfo2 mi = mallinfo2();
  return {mi.uordblks + mi.hblkhd + sluice::engine::mapped_table_bytes(),
          sluice::bench::proc_status_kb(::getpid()) * 1024};
}

double per_key(uint64_t after, uint64_t before, uint64_t keys) {
  return (static_cast<double>(after) - static_cast<double>(before)) / static_cast<double>(keys);
}

struct Checked {
  uint64_t checks = 0;
  uint64_t allowed = 0;
};

// Checks key_of(i) for i in [0, len) in batches of opt.batch, time starting at `first_check` (in
// checks, for the simulated clock). Stops early at `deadline` when given.
template <typename KeyOf>
Checked run_checks(Engine& engine, const Options& opt, uint64_t len, uint64_t first_check,
                   KeyOf key_of, const std::chrono::steady_clock::time_point* deadline = nullptr) {
  std::vector<rules::Descriptor> descs(opt.batch);
  std::vector<rules::CheckRequest> batch(opt.batch);
  BatchResult out;
  Checked c;
  while (c.checks < len) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(opt.batch, len - c.checks));
    for (size_t j = 0; j < n; ++j) {
      descs[j] = {"user", key_of(c.checks + j)};
      batch[j] = {"bench", {&descs[j], 1}, 1};
    }
    const int64_t now = kStartMs + static_cast<int64_t>((first_check + c.checks) / kChecksPerMs);
    engine.check({batch.data(), n}, now, out);
    for (size_t j = 0; j < n; ++j)
      c.allowed += out.decisions[j].allowed ? 1u : 0u;
    c.checks += n;
    // The clock is read about every 1024 checks: cheap next to them, fine-grained enough.
    if (deadline != nullptr && c.checks % 1024 < n &&
        std::chrono::steady_clock::now() >= *deadline) {
      break;
    }
  }
  return c;
}

// The engine of the one rule (8 GiB cap: nothing is evicted) with every key checked once.
std::unique_ptr<Engine> warm_engine(const Options& opt, const KeyArena& arena, uint64_t keys,
                                    EngineOptions eo) {
  eo.memory_cap_bytes = 8ull << 30;
  eo.shards = opt.shards;
  auto engine =
      std::make_unique<Engine>(testing::one_rule_policy({"bench", "per-user", "user", opt.limit,
                                                         window::make_spec(60'000, opt.bucket_ms),
                                                         window::Estimator::kWeighted, false},
                                                        opt.seed),
                               eo);
  const Checked warm = run_checks(*engine, opt, keys, 0, [&](uint64_t i) { return arena[i]; });
  if (warm.allowed != keys) {
    std::fprintf(stderr, "warning: only %" PRIu64 " of %" PRIu64 " warm-up checks allowed\n",
                 warm.allowed, keys);
  }
  return engine;
}

// One row per --threads count for `keys` x `dist`: one engine, warmed once, then timed with each
// thread count in turn (the simulated clock runs on from one to the next).
void run_rows(const Options& opt, const KeyArena& arena, uint64_t keys, const std::string& dist,
              sluice::bench::Rows& rows) {
  const uint64_t max_threads = *std::max_element(opt.threads.begin(), opt.threads.end());
  std::vector<RequestStream> streams;
  for (uint64_t t = 0; t < max_threads; ++t)
    streams.push_back(make_stream(arena, keys, opt.checks, dist, opt.seed + t));

  // Give memory freed by the previous row back to the system, so the RSS delta is this engine's.
  malloc_trim(0);
  const MemReading before = read_memory();
  EngineOptions eo;
  eo.single_node = !opt.cluster;  // as sluiced runs without a cluster, unless --cluster
  const std::unique_ptr<Engine> engine = warm_engine(opt, arena, keys, eo);
  const MemReading after = read_memory();
  const auto warm_stats = engine->stats();
  if (warm_stats.live_counters != keys) {
    std::fprintf(stderr,
                 "warning: %" PRIu64 " keys touched but %" PRIu64 " live counters after warm-up\n",
                 keys, warm_stats.live_counters);
  }

  uint64_t clock_checks = keys;  // checks so far, for the simulated clock
  for (const uint64_t threads : opt.threads) {
    std::vector<Checked> done(threads);
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(opt.seconds));
    std::vector<std::thread> workers;
    for (uint64_t t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const RequestStream& stream = streams[t];
        done[t] = run_checks(
            *engine, opt, stream.len.size(), clock_checks, [&](uint64_t i) { return stream[i]; },
            &deadline);
      });
    }
    for (auto& w : workers)
      w.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Checked all;
    for (const Checked& c : done) {
      all.checks += c.checks;
      all.allowed += c.allowed;
    }
    clock_checks += all.checks / threads;
    const auto stats = engine->stats();
    const double per_sec = static_cast<double>(all.checks) / seconds;
    rows.add({{"keys", keys},
              {"distribution", dist},
              {"threads", threads},
              {"batch", opt.batch},
              {"bucket_ms", window::make_spec(60'000, opt.bucket_ms).bucket_ms},
              {"cluster", opt.cluster},
              {"shards", opt.shards},
              {"checks", all.checks},
              {"seconds", seconds},
              {"checks_per_sec", per_sec},
              {"checks_per_sec_per_thread", per_sec / static_cast<double>(threads)},
              {"bytes_per_key", per_key(after.allocator, before.allocator, keys)},
              {"rss_bytes_per_key", per_key(after.rss, before.rss, keys)},
              {"table_bytes_per_key",
               static_cast<double>(warm_stats.table_bytes) / static_cast<double>(keys)},
              {"allowed_pct", all.checks == 0 ? 0.0
                                              : 100.0 * static_cast<double>(all.allowed) /
                                                    static_cast<double>(all.checks)},
              {"live_counters", stats.live_counters},
              {"evicted_expired", stats.evicted_expired},
              {"evicted_live", stats.evicted_live}});
  }
}

// ---- sync-cost ----------------------------------------------------------------------------------

// Counts what a pass reports, and nothing else: the figure is the engine's side of a pass.
struct CountingSink : sluice::engine::SyncSink {
  uint64_t items = 0;
  void item(const sluice::engine::SyncItem&) override { ++items; }
};

// One pass as DeltaSync::pass runs it; returns the thread's CPU ms over its sync_step calls.
double timed_sync_pass(Engine& engine, bool resend, CountingSink& sink) {
  static const std::function<bool(uint64_t)> owns = [](uint64_t c) { return c % 3 == 0; };
  sluice::engine::SyncCursor cursor;
  cursor.restart(resend);
  const double t0 = thread_cpu_ms();
  while (!engine.sync_step(cursor, 256, owns, sink)) {
  }
  return thread_cpu_ms() - t0;
}

void run_sync_cost(const Options& opt, const KeyArena& arena, uint64_t keys, uint64_t active,
                   sluice::bench::Rows& rows) {
  constexpr int64_t kPassMs = 100;       // the default sync interval
  constexpr uint64_t kResendEvery = 50;  // 5 s anti-entropy interval / 100 ms
  EngineOptions eo;
  eo.node_id = 1;
  // Every key once (run_checks' clock: kStartMs + 1 ms per 1024 checks). Passes then run 100 ms
  // apart: 500 of them cross one minute boundary, and nothing expires (1-minute limit).
  const std::unique_ptr<Engine> engine = warm_engine(opt, arena, keys, eo);
  int64_t now = kStartMs + static_cast<int64_t>(keys / kChecksPerMs) + 1;
  CountingSink sink;
  timed_sync_pass(*engine, false, sink);  // all of them go out once: the table is clean
  timed_sync_pass(*engine, true, sink);
  std::vector<uint32_t> set(keys);  // `active` distinct keys
  std::iota(set.begin(), set.end(), 0);
  std::shuffle(set.begin(), set.end(), std::mt19937_64(opt.seed));
  set.resize(active);

  // The CPU ms of each pass and the counters reported, by kind of pass: changed, resend.
  std::vector<double> ms[2];
  uint64_t items[2] = {0, 0};
  for (uint64_t p = 1; p <= opt.passes; ++p) {
    now += kPassMs;
    run_checks(*engine, opt, active, static_cast<uint64_t>(now - kStartMs) * kChecksPerMs,
               [&](uint64_t i) { return arena[set[i]]; });
    const bool resend = p % kResendEvery == 0;
    sink.items = 0;
    ms[resend].push_back(timed_sync_pass(*engine, resend, sink));
    items[resend] += sink.items;
    if (!resend && sink.items != active) {
      std::fprintf(stderr,
                   "warning: pass %" PRIu64 " reported %" PRIu64 " counters, not %" PRIu64 "\n", p,
                   sink.items, active);
    }
  }
  for (const bool resend : {false, true}) {
    std::vector<double>& v = ms[resend];
    std::sort(v.begin(), v.end());
    const auto at = [&](double q) {
      return v.empty() ? 0 : sluice::bench::percentile_sorted(v, q);
    };
    rows.add(
        {{"scenario", "sync-cost"},
         {"keys", keys},
         {"active", active},
         {"pass", resend ? "resend" : "changed"},
         {"passes", v.size()},
         {"cpu_ms_p50", at(0.50)},
         {"cpu_ms_p99", at(0.99)},
         {"cpu_ms_max", at(1)},
         {"items_per_pass",
          v.empty() ? 0 : static_cast<double>(items[resend]) / static_cast<double>(v.size())}});
  }
}

}  // namespace

int bench_engine_main(int argc, char** argv) {
  Options opt;
  bool json = false;
  if (const std::optional<int> exit = parse_args(argc, argv, opt, json)) return *exit;
  sluice::bench::Rows rows(json);
  for (const uint64_t keys : opt.keys) {
    const KeyArena arena(keys, "user-");
    if (opt.scenario == "sync-cost") {
      for (const uint64_t active : opt.active)
        run_sync_cost(opt, arena, keys, active, rows);
    } else {
      for (const auto& dist : opt.dists)
        run_rows(opt, arena, keys, dist, rows);
    }
  }
  rows.finish();
  return 0;
}
