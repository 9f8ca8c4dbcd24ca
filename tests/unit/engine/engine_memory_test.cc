// The engine under its memory cap: what counts against it, and what eviction keeps.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine_cases.h"

using namespace engine_cases;  // NOLINT(google-build-using-namespace)

TEST_CASE("under the memory cap, expired counters are evicted before any live one") {
  engine::EngineOptions opt;
  opt.shards = 1;
  opt.memory_cap_bytes = 128 * 1024;  // tables up to 3,079 slots: about 2,600 counters
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("10/1m", 60'000)})})), opt);
  Checker c{e, {}, {}};
  for (int u = 0; u < 1500; ++u)
    c.check({{"user", "old-" + std::to_string(u)}}, kT0);
  const auto before = e.stats();
  CHECK(before.live_counters == 1500);
  CHECK(before.table_bytes <= opt.memory_cap_bytes);
  // Two minutes later the old keys are idle past their window; a flood of new keys reuses them.
  for (int u = 0; u < 1500; ++u)
    c.check({{"user", "new-" + std::to_string(u)}}, kT0 + 120'000);
  const auto after = e.stats();
  CHECK(after.evicted_live == 0);
  CHECK(after.evicted_expired >= 1);
  CHECK(after.table_bytes <= opt.memory_cap_bytes);
}

TEST_CASE(
    "what other nodes report counts against the memory cap and is given back with its counter") {
  engine::EngineOptions opt;
  opt.shards = 1;
  opt.memory_cap_bytes = 256 * 1024;
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("1000/1m", 60'000)})})), opt);
  const window::WindowSpec spec = window::make_spec(60'000, 60'000);
  const int64_t bucket = window::bucket_of(kT0, 60'000);
  // Four other nodes report on 4,000 counters: far more than the cap holds with their reports.
  std::vector<engine::RemoteTotal> totals;
  uint64_t peak = 0;
  for (uint64_t c = 1; c <= 4'000; ++c) {
    totals.clear();
    for (uint16_t node = 2; node <= 5; ++node)
      totals.push_back({c * 0x9E3779B97F4A7C15ull, spec, node, bucket, 3});
    e.merge(totals, kT0);
    const auto s = e.stats();
    peak = std::max(peak, s.table_bytes + s.remote_bytes);
  }
  const auto full = e.stats();
  MESSAGE("live " << full.live_counters << ", tables " << full.table_bytes << " B, remote "
                  << full.remote_bytes << " B, peak " << peak << " B, evicted live "
                  << full.evicted_live);
  CHECK(full.remote_bytes > full.table_bytes);  // reports outweigh the table in a cluster
  CHECK(full.evicted_live > 0);                 // the cap made room, visibly
  CHECK(full.live_counters < 4'000);
  // Within the cap but for one counter's reports (4 rings and their vector: under 1 KiB).
  CHECK(peak <= opt.memory_cap_bytes + 1024);
  // Every counter leaves the window: its reports go with it, to the byte (the map keeps its
  // slots).
  CHECK(e.sweep(kT0 + 120'000) == full.live_counters);
  const auto empty = e.stats();
  CHECK(empty.live_counters == 0);
  CHECK(empty.remote_bytes <= full.remote_bytes);
  totals.clear();
  totals.push_back({77, spec, 2, window::bucket_of(kT0 + 120'000, 60'000), 1});
  e.merge(totals, kT0 + 120'000);
  const auto one = e.stats();
  CHECK(one.live_counters == 1);
  // One ring of two buckets and the vector holding it (one RemoteRing: a node id, a vector and
  // the oldest bucket not pushed yet, 40 bytes on this ABI), on top of the map's slots.
  CHECK(one.remote_bytes - empty.remote_bytes ==
        sizeof(std::pair<int64_t, uint32_t>) * spec.ring_size() + 40);
}

TEST_CASE("the free space of the huge pages that tables share counts against the memory cap") {
  // Tables from 64 KiB to 2 MiB share huge pages (table_heap.h), and a process pays each page
  // whole, the free units beside live tables too. This engine is alone in its process (each test
  // case runs in one), so those pages and its tables are the same memory.
  engine::EngineOptions opt;
  opt.shards = 64;
  opt.memory_cap_bytes = 32 << 20;
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("1000/1m")})})), opt);
  Checker c{e, {}, {}};
  for (int u = 0; u < 800'000; ++u)
    c.check({{"user", std::to_string(u)}}, kT0 + u / 100);
  const auto s = e.stats();
  const engine::SharedTablePages pages = engine::shared_table_pages();
  const uint64_t free_units = pages.resident - pages.in_use;
  MESSAGE("tables " << s.table_bytes << " B, shared pages " << pages.resident << " B of which free "
                    << free_units << " B, live " << s.live_counters << ", evicted live "
                    << s.evicted_live);
  CHECK(s.evicted_live > 0);
  // Within the cap but for what the last table to grow took beyond its share: one huge page.
  // (Without the charge, the tables grew to their budgets and the free units came on top, past
  // this bound.)
  CHECK(s.table_bytes + free_units <= opt.memory_cap_bytes + (2u << 20));
}

TEST_CASE("a flood of distinct keys evicts the smallest counts and keeps a heavy key's count") {
  engine::EngineOptions opt;
  opt.shards = 1;
  opt.memory_cap_bytes = 16 * 1024;
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("50/1m")})})), opt);
  Checker c{e, {}, {}};
  CHECK(c.admitted(50, {{"user", "heavy"}}, kT0) == 50);
  for (int u = 0; u < 5000; ++u)
    c.check({{"user", "flood-" + std::to_string(u)}}, kT0 + 1);
  const auto s = e.stats();
  CHECK(s.evicted_live > 0);  // visible in metrics
  CHECK(s.table_bytes <= opt.memory_cap_bytes);
  // The heavy key was never the smallest: it is still at its limit.
  CHECK_FALSE(c.check({{"user", "heavy"}}, kT0 + 2).allowed);
}

TEST_CASE("eviction keeps every key with two hits while a key with fewer remains in the table") {
  engine::EngineOptions opt;
  opt.shards = 1;
  opt.memory_cap_bytes = 16 * 1024;  // one table of at most 121 slots: 102 counters
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("50/1m")})})), opt);
  Checker c{e, {}, {}};
  // 90 keys with two hits each, then a flood of keys with one: each newcomer must take the place
  // of a one-hit key (another newcomer), never of a two-hit key, however few one-hit keys there
  // are for a sample to find.
  constexpr int kHeavy = 90;
  for (int u = 0; u < kHeavy; ++u)
    CHECK(c.admitted(2, {{"user", "heavy-" + std::to_string(u)}}, kT0) == 2);
  REQUIRE(e.stats().evicted_live == 0);
  for (int u = 0; u < 3000; ++u)
    c.check({{"user", "flood-" + std::to_string(u)}}, kT0 + 1'000 + u);
  CHECK(e.stats().evicted_live > 0);
  int kept = 0;
  for (int u = 0; u < kHeavy; ++u) {
    c.check({{"user", "heavy-" + std::to_string(u)}}, kT0 + 5'000, 0);
    kept += c.limits()[0].remaining == 48 ? 1 : 0;
  }
  CHECK(kept == kHeavy);
  // With only two-hit keys left to evict, one goes (the cap holds), and the newcomer that took its
  // place is the next to go.
  for (int u = 0; u < 20; ++u)
    CHECK(c.admitted(2, {{"user", "second-" + std::to_string(u)}}, kT0 + 5'100) == 2);
  const uint64_t evicted = e.stats().evicted_live;
  c.check({{"user", "late"}}, kT0 + 5'200);
  c.check({{"user", "later"}}, kT0 + 5'300);
  CHECK(e.stats().evicted_live == evicted + 2);
  c.check({{"user", "late"}}, kT0 + 5'400, 0);
  CHECK(c.limits()[0].remaining == 50);  // "late" (one hit) went for "later", not a heavy key
}
