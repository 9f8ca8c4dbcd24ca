// The engine of a node without a cluster (EngineOptions::single_node): counter slots without
// others' counts decide exactly as a cluster member's, take 64 bytes where a cluster member's take
// 104 (a 1-minute limit on its default six-second buckets), refuse other nodes' counts, and read
// and write the same store records.
#include "engine/engine.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "one_rule_policy.h"
#include "record_collector.h"

namespace {

using namespace sluice;

constexpr int64_t kT0 = 28'333'333LL * 60'000;  // an epoch-aligned minute
constexpr uint64_t kSeed = 11;

std::shared_ptr<const rules::Policy> policy(uint64_t limit) {
  testing::OneRule o;
  o.domain = "api";
  o.key = "user";
  o.limit = limit;  // a 1-minute window on the default buckets (six seconds: a ring of 11)
  return testing::one_rule_policy(o, kSeed);
}

engine::EngineOptions options(bool single_node, uint16_t node_id = 0) {
  engine::EngineOptions o;
  o.single_node = single_node;
  o.node_id = node_id;
  return o;
}

struct Checker {
  engine::Engine& e;
  engine::BatchResult out;
  const engine::Decision& check(const std::string& user, int64_t now, uint64_t hits = 1) {
    const rules::Descriptor d[] = {{"user", user}};
    const rules::CheckRequest req{"api", d, hits};
    e.check({&req, 1}, now, out);
    return out.decisions.at(0);
  }
  const engine::LimitResult& limit() const { return out.limits_of(out.decisions.at(0))[0]; }
};

uint64_t counter_of(const engine::Engine& e, const std::string& user) {
  const auto p = e.policy();
  const rules::Rule& r = p->rules().domains[0].rules[0];
  const std::string_view values[] = {user};
  return rules::counter_id(rules::key_hash(kSeed, "api", r, values), r.limits[0].spec);
}

testing::RecordCollector export_all(engine::Engine& e) {
  testing::RecordCollector sink;
  sink.export_all(e);
  return sink;
}

}  // namespace

TEST_CASE("a node on its own decides as a cluster member's engine does, in 60-byte slots") {
  const auto p = policy(40);
  engine::Engine alone(p, options(true)), member(p, options(false));
  Checker a{alone, {}}, m{member, {}};
  for (const uint64_t seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    int64_t now = kT0 + static_cast<int64_t>(seed) * 3'600'000;
    for (int i = 0; i < 20'000; ++i) {
      now += static_cast<int64_t>(rng() % 40);  // ~20 minutes of a trace over 50 keys
      const std::string user = std::to_string(rng() % 50);
      const uint64_t hits = rng() % 4;
      const bool allowed = a.check(user, now, hits).allowed;
      REQUIRE(m.check(user, now, hits).allowed == allowed);
      CHECK(a.limit().remaining == m.limit().remaining);
      CHECK(a.limit().retry_after_ms == m.limit().retry_after_ms);
      CHECK(a.limit().reset_ms == m.limit().reset_ms);
    }
  }
  const engine::EngineStats sa = alone.stats(), sm = member.stats();
  REQUIRE(sa.live_counters == sm.live_counters);
  // The same capacities; 4 + 11 words a slot against 4 + 2 x 11.
  CHECK(sa.table_bytes * 104 == sm.table_bytes * 60);
}

TEST_CASE("a node on its own takes no other node's counts") {
  engine::Engine e(policy(100), options(true));
  Checker c{e, {}};
  REQUIRE(c.check("1", kT0, 10).allowed);
  const uint64_t counter = counter_of(e, "1");
  const window::WindowSpec spec = c.limit().limit->spec;
  const int64_t bucket = window::bucket_of(kT0, spec.bucket_ms);
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, spec, 2, bucket, 30}}, kT0) == 0);
  const std::vector<rules::Descriptor> d{{"user", "1"}};
  e.credit(rules::CheckRequest{"api", d, 20}, 2, kT0);
  const auto view = e.inspect(counter, spec);
  REQUIRE(view.has_value());
  CHECK(view->own.back() == 10);
  CHECK(view->others.back() == 0);
  CHECK(c.check("1", kT0, 90).allowed);
}

TEST_CASE("store records move between a node on its own and a cluster member") {
  const auto p = policy(100);
  // A cluster member with 10 hits of its own and 30 of node 2's, written out.
  engine::Engine member(p, options(false, 1));
  Checker cm{member, {}};
  REQUIRE(cm.check("1", kT0, 10).allowed);
  const window::WindowSpec spec = cm.limit().limit->spec;
  const int64_t bucket = window::bucket_of(kT0, spec.bucket_ms);
  REQUIRE(
      member.merge(std::vector<engine::RemoteTotal>{{counter_of(member, "1"), spec, 2, bucket, 30}},
                   kT0) == 1);
  const testing::RecordCollector from_member = export_all(member);
  REQUIRE(from_member.puts.size() == 1);

  // Read by a node on its own: all 40 are its own count, twice read still 40 (idempotent).
  engine::Engine alone(p, options(true));
  Checker ca{alone, {}};
  for (int round = 0; round < 2; ++round) {
    REQUIRE(alone.import_record(from_member.puts[0].first, from_member.puts[0].second, kT0) ==
            engine::ImportResult::kImported);
  }
  auto view = alone.inspect(counter_of(alone, "1"), spec);
  REQUIRE(view.has_value());
  CHECK(view->own.back() == 40);
  CHECK(view->others.back() == 0);
  CHECK_FALSE(ca.check("1", kT0 + 1, 61).allowed);
  CHECK(ca.check("1", kT0 + 1, 60).allowed);

  // Written by the node on its own (the same record format, others' counts zero) and read by a
  // cluster member: 100 of its own.
  const testing::RecordCollector from_alone = export_all(alone);
  REQUIRE(from_alone.puts.size() == 1);
  // version, head, ring size, 11 own and 11 others' counts, no nodes
  CHECK(from_alone.puts[0].second.size() == 1 + 8 + 2 + 8 * 11 + 2);
  engine::Engine other(p, options(false, 3));
  Checker co{other, {}};
  REQUIRE(other.import_record(from_alone.puts[0].first, from_alone.puts[0].second, kT0) ==
          engine::ImportResult::kImported);
  view = other.inspect(counter_of(other, "1"), spec);
  REQUIRE(view.has_value());
  CHECK(view->own.back() == 100);
  CHECK(view->others.back() == 0);
  CHECK_FALSE(co.check("1", kT0 + 2, 1).allowed);
}
