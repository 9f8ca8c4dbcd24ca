// Unit tests of lib/cluster/override_table: the merge that makes cluster-wide overrides converge.
// Merging the same records in any order, any number of times, gives the same table; a newer
// version wins whatever its kind; a tie goes by node id, then tombstone over set; tombstones and
// expired overrides are forgotten at their horizon and ignored after it; records are checked as
// a local write would be. Randomness is a seeded std::mt19937_64; time is a parameter.
#include "cluster/override_table.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace sluice;
using cluster::OverrideRecord;
using cluster::OverrideTable;
using cluster::OverrideVersion;
using Offer = OverrideTable::Offer;

constexpr int64_t kNow = 1'700'000'000'000;
constexpr int64_t kTtl = 86'400'000;

OverrideRecord set_of(const std::string& user, uint64_t requests, OverrideVersion v,
                      int64_t expires_at_ms = 0) {
  OverrideRecord r;
  r.value.domain = "api";
  r.value.entries = {{"user", user}};
  rules::Limit l;
  REQUIRE(rules::parse_limit(std::to_string(requests) + "/1m", 0, l).ok());
  r.value.limits.push_back(l);
  r.value.expires_at_ms = expires_at_ms;
  r.version = v;
  return r;
}

OverrideRecord tombstone_of(const std::string& user, OverrideVersion v) {
  OverrideRecord r;
  r.value.domain = "api";
  r.value.entries = {{"user", user}};
  r.version = v;
  r.deleted = true;
  return r;
}

std::vector<OverrideRecord> table_of(const OverrideTable& t) {
  return t.records(kNow);
}

}  // namespace

TEST_CASE("override_table: any order and any number of duplicates give the same table") {
  // Writes from three nodes to five overrides: sets, deletes, ties in ms, expiring sets.
  std::vector<OverrideRecord> writes;
  std::mt19937_64 rng(20261124);
  for (int i = 0; i < 60; ++i) {
    const std::string user = "u" + std::to_string(rng() % 5);
    const OverrideVersion v{kNow - 10'000 + static_cast<int64_t>(rng() % 20),
                            static_cast<uint16_t>(1 + rng() % 3)};
    if (rng() % 3 == 0) {
      writes.push_back(tombstone_of(user, v));
    } else {
      const int64_t expires = rng() % 4 == 0 ? kNow + 60'000 : 0;
      writes.push_back(set_of(user, 1 + rng() % 1000, v, expires));
    }
  }
  OverrideTable reference(kTtl);
  for (const OverrideRecord& w : writes)
    reference.merge(w, kNow);
  const auto want = table_of(reference);
  REQUIRE(want.size() == 5);

  for (int trial = 0; trial < 50; ++trial) {
    CAPTURE(trial);
    std::vector<OverrideRecord> shuffled = writes;
    // Duplicates: every write up to three times.
    for (const OverrideRecord& w : writes) {
      for (uint64_t k = rng() % 3; k > 0; --k)
        shuffled.push_back(w);
    }
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    OverrideTable t(kTtl);
    for (const OverrideRecord& w : shuffled)
      t.merge(w, kNow);
    CHECK(table_of(t) == want);
    CHECK(t.digest(kNow) == reference.digest(kNow));
    // Merging a whole table into another (what a full exchange does) changes nothing more.
    for (const OverrideRecord& r : table_of(reference))
      CHECK(t.merge(r, kNow) == Offer::kKnown);
  }
}

TEST_CASE("override_table: a tombstone beats an older set and a newer set beats the tombstone") {
  OverrideTable t(kTtl);
  REQUIRE(t.merge(set_of("alice", 10, {kNow - 3'000, 1}), kNow) == Offer::kNewer);
  CHECK(t.merge(tombstone_of("alice", {kNow - 2'000, 2}), kNow) == Offer::kNewer);
  const std::string id = cluster::record_id(tombstone_of("alice", {}));
  REQUIRE(t.find(id) != nullptr);
  CHECK(t.find(id)->deleted);
  // The older set arriving late (a lost push, a node that was down) does not bring it back.
  CHECK(t.merge(set_of("alice", 10, {kNow - 3'000, 1}), kNow) == Offer::kKnown);
  CHECK(t.find(id)->deleted);
  // A newer set does.
  CHECK(t.merge(set_of("alice", 20, {kNow - 1'000, 3}), kNow) == Offer::kNewer);
  CHECK_FALSE(t.find(id)->deleted);
  CHECK(t.find(id)->value.limits.at(0).requests == 20);
}

TEST_CASE("override_table: concurrent writes in the same ms go to the larger node id") {
  const OverrideRecord from_2 = set_of("bob", 200, {kNow, 2});
  const OverrideRecord from_7 = set_of("bob", 700, {kNow, 7});
  const OverrideRecord del_5 = tombstone_of("bob", {kNow, 5});
  for (const auto& order : {std::vector{from_2, from_7, del_5}, std::vector{del_5, from_7, from_2},
                            std::vector{from_7, del_5, from_2}}) {
    OverrideTable t(kTtl);
    for (const OverrideRecord& r : order)
      t.merge(r, kNow);
    const OverrideRecord* got = t.find(cluster::record_id(from_2));
    REQUIRE(got != nullptr);
    CHECK(got->version.node == 7);
    CHECK(got->value.limits.at(0).requests == 700);
  }
  // At an equal version (a bug, or records from before versions: version 0) a tombstone wins,
  // then the larger canonical encoding: still one answer everywhere.
  OverrideTable a(kTtl), b(kTtl);
  a.merge(set_of("carol", 1, {kNow, 3}), kNow);
  a.merge(tombstone_of("carol", {kNow, 3}), kNow);
  b.merge(tombstone_of("carol", {kNow, 3}), kNow);
  b.merge(set_of("carol", 1, {kNow, 3}), kNow);
  CHECK(a.find(cluster::record_id(tombstone_of("carol", {})))->deleted);
  CHECK(table_of(a) == table_of(b));
  OverrideTable c(kTtl), d(kTtl);
  c.merge(set_of("dave", 5, {}), kNow);
  c.merge(set_of("dave", 9, {}), kNow);
  d.merge(set_of("dave", 9, {}), kNow);
  d.merge(set_of("dave", 5, {}), kNow);
  CHECK(table_of(c) == table_of(d));
}

TEST_CASE("override_table: a local write always gets a version above the one it replaces") {
  OverrideTable t(kTtl);
  const std::string id = cluster::record_id(set_of("erin", 1, {}));
  CHECK(t.next_version(id, 4, kNow) == OverrideVersion{kNow, 4});
  // Another node's clock runs 5 s ahead: a write here still replaces its entry.
  t.merge(set_of("erin", 1, {kNow + 5'000, 9}), kNow);
  const OverrideVersion v = t.next_version(id, 4, kNow);
  CHECK(v == OverrideVersion{kNow + 5'001, 4});
  CHECK(t.merge(tombstone_of("erin", v), kNow) == Offer::kNewer);
}

TEST_CASE("override_table: tombstones and expired overrides are forgotten at their horizon") {
  OverrideTable t(kTtl);
  t.merge(tombstone_of("gone", {kNow - 1'000, 1}), kNow);
  t.merge(set_of("expiring", 5, {kNow - 1'000, 1}, kNow + 60'000), kNow);
  t.merge(set_of("forever", 5, {kNow - 1'000, 1}), kNow);
  CHECK(t.horizon_ms(*t.find(cluster::record_id(tombstone_of("gone", {})))) == kNow - 1'000 + kTtl);
  CHECK(t.forget_expired(kNow + kTtl - 1'001).empty());
  CHECK(t.digest(kNow + kTtl - 1'001).count == 3);
  // Past the tombstone's horizon: it is forgotten, and a copy arriving late is ignored.
  const auto gone = t.forget_expired(kNow + kTtl);
  REQUIRE(gone.size() == 1);
  CHECK(gone[0] == cluster::record_id(tombstone_of("gone", {})));
  CHECK(t.merge(tombstone_of("gone", {kNow - 1'000, 1}), kNow + kTtl) == Offer::kExpired);
  CHECK(t.size() == 2);
  // The expiring set stays a TTL past its expiry (so a node that missed it cannot revive an older
  // version), then goes; the set without expiry stays.
  CHECK(t.forget_expired(kNow + 60'000 + kTtl - 1).empty());
  CHECK(t.forget_expired(kNow + 60'000 + kTtl).size() == 1);
  CHECK(t.size() == 1);
  CHECK(t.digest(kNow + 60'000 + kTtl).count == 1);
}

TEST_CASE("override_table: digests differ when tables differ and not when only order does") {
  OverrideTable a(kTtl), b(kTtl);
  a.merge(set_of("x", 1, {kNow, 1}), kNow);
  a.merge(set_of("y", 2, {kNow, 1}), kNow);
  b.merge(set_of("y", 2, {kNow, 1}), kNow);
  CHECK(a.digest(kNow) != b.digest(kNow));
  b.merge(set_of("x", 1, {kNow, 1}), kNow);
  CHECK(a.digest(kNow) == b.digest(kNow));
  // Same ids and versions, another limit: a different digest (content is hashed too).
  b.merge(set_of("x", 3, {kNow, 1}), kNow);
  CHECK(a.digest(kNow) != b.digest(kNow));
}

TEST_CASE("override_table: records are checked as a local write, with a reason per refusal") {
  CHECK(cluster::check_record(set_of("ok", 5, {kNow, 1}), kNow).empty());
  CHECK(cluster::check_record(tombstone_of("ok", {kNow, 1}), kNow).empty());

  OverrideRecord r = set_of("ok", 5, {kNow, 1});
  r.value.entries.emplace_back("ip", std::string(257, 'x'));
  CHECK(cluster::reason_label(cluster::check_record(r, kNow)) == "too_long");

  r = set_of("ok", 5, {kNow, 1});
  for (int i = 0; i < 33; ++i)
    r.value.entries.emplace_back("k" + std::to_string(i), "v");
  CHECK(cluster::reason_label(cluster::check_record(r, kNow)) == "too_many");

  r = set_of("ok", 5, {kNow + 30'001, 1});
  CHECK(cluster::reason_label(cluster::check_record(r, kNow)) == "from_future");
  r.version.ms = kNow + 30'000;
  CHECK(cluster::check_record(r, kNow).empty());

  r = set_of("ok", 5, {kNow, 1});
  r.value.limits[0].requests = 0;
  CHECK(cluster::reason_label(cluster::check_record(r, kNow)) == "invalid");
  r = set_of("ok", 5, {kNow, 1});
  r.value.limits[0].spec.bucket_ms = 7;  // does not divide the window
  CHECK(cluster::reason_label(cluster::check_record(r, kNow)) == "invalid");
  r = set_of("ok", 5, {kNow, 1});
  r.value.entries.push_back({"user", "again"});
  CHECK(cluster::reason_label(cluster::check_record(r, kNow)) == "invalid");
  r = tombstone_of("", {kNow, 1});
  r.value.entries.clear();
  CHECK(cluster::reason_label(cluster::check_record(r, kNow)) == "invalid");
  r = set_of("ok", 5, {-1, 1});
  CHECK(cluster::reason_label(cluster::check_record(r, kNow)) == "invalid");
}
