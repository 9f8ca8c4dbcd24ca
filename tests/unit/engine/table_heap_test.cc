// The huge pages counter tables share (lib/engine/table_heap.h): storage is zeroed, aligned and
// never overlaps other storage, freed runs are reused best fit, a page none of whose units is in
// use goes back to the kernel, and an engine's tables live there and leave nothing behind.
//
// The heap is process-wide: every case here gives back all it took, so each starts from the
// same state (this binary holds no other users of it).
#include "engine/table_heap.h"

#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "rules/rules.h"

namespace {

using namespace sluice::engine;
namespace rules = sluice::rules;
using table_heap::kFrom;
using table_heap::kHugePage;
using table_heap::kUnit;

bool all_bytes(const char* p, size_t n, char v) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != v) return false;
  }
  return true;
}

TEST_CASE("shared table storage is zeroed, aligned, and never overlaps, on random traces") {
  const table_heap::Stats start = table_heap::stats();
  std::mt19937_64 rng(7);
  struct Block {
    char* p;
    size_t bytes;
    char fill;
  };
  std::map<const char*, Block> live;  // by address
  uint64_t bytes_live = 0;
  for (int op = 0; op < 600; ++op) {
    const bool take = live.empty() || rng() % 5 < 3;
    if (take) {
      const size_t bytes = kFrom + rng() % (kHugePage - kFrom);
      auto* p = static_cast<char*>(table_heap::allocate(bytes));
      REQUIRE(p != nullptr);
      CHECK(reinterpret_cast<uintptr_t>(p) % kUnit == 0);
      REQUIRE(all_bytes(p, bytes, 0));
      const size_t whole = (bytes + kUnit - 1) / kUnit * kUnit;
      // No overlap with the blocks on either side of it.
      auto next = live.lower_bound(p);
      if (next != live.end()) CHECK(p + whole <= next->first);
      if (next != live.begin()) {
        const Block& before = std::prev(next)->second;
        CHECK(before.p + (before.bytes + kUnit - 1) / kUnit * kUnit <= p);
      }
      const char fill = static_cast<char>(1 + op % 250);
      std::memset(p, fill, bytes);
      live[p] = {p, bytes, fill};
      bytes_live += whole;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      const Block b = it->second;
      REQUIRE(all_bytes(b.p, b.bytes, b.fill));  // nothing else wrote into it
      table_heap::release(b.p, b.bytes);
      bytes_live -= (b.bytes + kUnit - 1) / kUnit * kUnit;
      live.erase(it);
    }
    const table_heap::Stats now = table_heap::stats();
    REQUIRE(now.allocated - start.allocated == bytes_live);
    // Whole pages: at least what is handed out, never more than the regions hold.
    CHECK(now.resident - start.resident >= bytes_live);
    CHECK(now.resident <= now.regions * table_heap::kRegionBytes);
  }
  for (const auto& [p, b] : live) {
    REQUIRE(all_bytes(b.p, b.bytes, b.fill));
    table_heap::release(b.p, b.bytes);
  }
  const table_heap::Stats end = table_heap::stats();
  CHECK(end.allocated == start.allocated);
  CHECK(end.resident == start.resident);
  CHECK(end.regions == start.regions);  // a region with nothing in use is unmapped
}

TEST_CASE("a huge page goes back when none of its units is in use, and freed runs are reused") {
  const table_heap::Stats start = table_heap::stats();
  REQUIRE(start.regions == 0);  // each case gives everything back
  const size_t mib = size_t{1} << 20;
  auto* a = static_cast<char*>(table_heap::allocate(mib));            // units [0, 256): page 0
  auto* b = static_cast<char*>(table_heap::allocate(mib + mib / 2));  // [256, 640): pages 0-1
  REQUIRE(a != nullptr);
  REQUIRE(b == a + mib);
  CHECK(table_heap::stats().resident == 2 * kHugePage);
  CHECK(table_heap::stats().regions == 1);

  table_heap::release(a, mib);  // page 0 still holds b's first half
  CHECK(table_heap::stats().resident == 2 * kHugePage);
  CHECK(table_heap::stats().allocated == mib + mib / 2);

  // Best fit: a half-MiB table goes into a's run, the smallest that holds it, not past b.
  auto* c = static_cast<char*>(table_heap::allocate(mib / 2));
  CHECK(c == a);
  // Anything larger than what is left of a's run goes past b.
  auto* d = static_cast<char*>(table_heap::allocate(mib / 2 + kUnit));
  CHECK(d == b + mib + mib / 2);
  CHECK(table_heap::stats().resident == 2 * kHugePage);  // d's units are in page 1

  const uint64_t released = table_heap::stats().pages_released;
  table_heap::release(b, mib + mib / 2);
  table_heap::release(d, mib / 2 + kUnit);  // page 1 is free now, page 0 holds c
  CHECK(table_heap::stats().resident == kHugePage);
  CHECK(table_heap::stats().pages_released == released + 1);
  // What went back reads as zeros when it is handed out again.
  std::memset(c, 0x5a, mib / 2);
  table_heap::release(c, mib / 2);
  CHECK(table_heap::stats().regions == 0);
  auto* e = static_cast<char*>(table_heap::allocate(kFrom));
  REQUIRE(e != nullptr);
  CHECK(all_bytes(e, kFrom, 0));
  table_heap::release(e, kFrom);
  CHECK(table_heap::stats().allocated == 0);
  CHECK(table_heap::stats().resident == 0);
}

TEST_CASE("an engine's tables from 64 KiB up live in the shared pages and leave nothing behind") {
  REQUIRE(table_heap::stats().regions == 0);
  constexpr std::string_view kRules = R"(domains:
  - name: api
    rules:
      - name: per-client
        key: [client]
        limits: [100/1m]
)";
  rules::ParseResult parsed = rules::parse_rules(kRules, "rules.yaml");
  REQUIRE(parsed.errors.empty());
  const int64_t now = 1'700'000'000'000;
  {
    EngineOptions o;
    o.single_node = true;
    Engine engine(rules::Policy::compile(*parsed.rules, {}, 42), o);
    BatchResult out;
    std::vector<std::string> clients;
    for (int i = 0; i < 200'000; ++i)
      clients.push_back("c" + std::to_string(i));
    for (int round = 0; round < 2; ++round) {
      for (const std::string& c : clients) {
        const rules::Descriptor d[] = {{"client", c}};
        const rules::CheckRequest req{"api", d, 1};
        engine.check({&req, 1}, now + round, out);
        REQUIRE(out.decisions[0].allowed);
        REQUIRE(!out.decisions[0].no_room);
      }
    }
    // 200K ten-bucket counters over 64 shards: tables of ~190-280 KiB, all here.
    const SharedTablePages pages = shared_table_pages();
    CHECK(pages.in_use >= engine.stats().table_bytes);
    CHECK(pages.resident >= pages.in_use);
    CHECK(engine.stats().live_counters == clients.size());
    // Every counter holds its two hits.
    for (size_t i = 0; i < clients.size(); i += 997) {
      const rules::Descriptor d[] = {{"client", clients[i]}};
      const rules::CheckRequest req{"api", d, 0};
      engine.check({&req, 1}, now + 2, out);
      REQUIRE(out.decisions[0].num_limits == 1);
      CHECK(out.limits_of(out.decisions[0])[0].remaining == 98);
    }
  }
  CHECK(shared_table_pages().in_use == 0);
  CHECK(shared_table_pages().resident == 0);
  CHECK(table_heap::stats().regions == 0);
}

}  // namespace
