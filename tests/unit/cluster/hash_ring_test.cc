// Unit tests of lib/cluster/hash_ring: placement that depends only on the member set, distinct
// owners, edge sizes, balance and the keys that move when one node joins or leaves, and lookups
// that allocate nothing. Keys are seeded pseudo-random 64-bit values, like the engine's counter
// ids; bounds are set several standard deviations away from the expected figures.
#include "cluster/hash_ring.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "alloc_counter.h"  // this binary counts its heap allocations

namespace {

using namespace sluice::cluster;

std::vector<RingMember> nodes(size_t n, NodeId first_id = 1) {
  std::vector<RingMember> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back({static_cast<NodeId>(first_id + i), "node-" + std::to_string(first_id + i)});
  return out;
}

std::vector<uint64_t> keys(size_t n, uint64_t seed = 42) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> out(n);
  for (auto& k : out)
    k = rng();
  return out;
}

std::vector<NodeId> primaries(const HashRing& ring, const std::vector<uint64_t>& ks) {
  std::vector<NodeId> out;
  out.reserve(ks.size());
  for (uint64_t k : ks)
    out.push_back(*ring.owner(k));
  return out;
}

TEST_CASE("hash_ring: placement depends only on the member set, not on insertion order") {
  const auto members = nodes(7);
  HashRing forward(members);
  std::vector<RingMember> reversed(members.rbegin(), members.rend());
  HashRing backward(reversed);
  HashRing built_up;
  std::vector<RingMember> shuffled = members;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(3));
  for (const auto& m : shuffled)
    REQUIRE(built_up.add(m.id, m.name));
  // Adding and removing an extra member leaves the same ring as never adding it.
  REQUIRE(built_up.add(99, "node-99"));
  REQUIRE(built_up.remove(99));

  CHECK(std::vector<NodeId>(forward.members().begin(), forward.members().end()) ==
        std::vector<NodeId>{1, 2, 3, 4, 5, 6, 7});
  for (uint64_t k : keys(20'000)) {
    std::array<NodeId, 2> a{}, b{}, c{};
    REQUIRE(forward.owners(k, a) == 2);
    REQUIRE(backward.owners(k, b) == 2);
    REQUIRE(built_up.owners(k, c) == 2);
    REQUIRE(a == b);
    REQUIRE(a == c);
    REQUIRE(forward.owner(k) == a[0]);
  }
}

TEST_CASE("hash_ring: placement is pinned: the same ring on every build and every node") {
  // Changing the hash would move every key of a running cluster during a rolling upgrade: these
  // values must only change on purpose.
  HashRing ring(nodes(5), 3);
  std::array<NodeId, 3> o{};
  REQUIRE(ring.owners(0, o) == 3);
  const std::array<NodeId, 3> at0 = o;
  REQUIRE(ring.owners(0xdeadbeefULL, o) == 3);
  const std::array<NodeId, 3> at1 = o;
  CHECK(at0 == std::array<NodeId, 3>{1, 2, 5});
  CHECK(at1 == std::array<NodeId, 3>{5, 1, 4});
}

TEST_CASE("hash_ring: owners are distinct nodes, owner first") {
  HashRing ring(nodes(10), 4);
  for (uint64_t k : keys(10'000)) {
    std::array<NodeId, 4> o{};
    REQUIRE(ring.owners(k, o) == 4);
    REQUIRE(std::set<NodeId>(o.begin(), o.end()).size() == 4);
    REQUIRE(o[0] == *ring.owner(k));
    // A smaller output gets the prefix: the same owner and replicas in the same order.
    std::array<NodeId, 2> two{};
    REQUIRE(ring.owners(k, two) == 2);
    REQUIRE(two[0] == o[0]);
    REQUIRE(two[1] == o[1]);
  }
}

TEST_CASE("hash_ring: with R larger than the member count returns every member once") {
  HashRing ring(nodes(3), 5);
  std::array<NodeId, 8> o{};
  for (uint64_t k : keys(1'000)) {
    REQUIRE(ring.owners(k, o) == 3);
    REQUIRE(std::set<NodeId>(o.begin(), o.begin() + 3) == std::set<NodeId>{1, 2, 3});
  }
  // An output larger than R is filled up to R only.
  HashRing r2(nodes(6));
  CHECK(r2.owners(7, o) == 2);
}

TEST_CASE("hash_ring: empty and single-node edge cases") {
  HashRing ring;
  std::array<NodeId, 2> o{};
  CHECK(ring.empty());
  CHECK(ring.owners(1, o) == 0);
  CHECK(!ring.owner(1).has_value());
  CHECK(ring.share(1) == 0.0);
  CHECK(ring.shares().empty());
  CHECK(ring.owners(1, std::span<NodeId>{}) == 0);

  REQUIRE(ring.add(4, "solo"));
  for (uint64_t k : keys(100)) {
    REQUIRE(ring.owners(k, o) == 1);
    REQUIRE(o[0] == 4);
  }
  CHECK(ring.share(4) == 1.0);
  CHECK(ring.share(5) == 0.0);
  CHECK(ring.name_of(4) == "solo");
  CHECK(ring.name_of(5).empty());
  REQUIRE(ring.remove(4));
  CHECK(ring.empty());
  CHECK(!ring.remove(4));
}

TEST_CASE("hash_ring: refuses repeated ids or names and invalid replica counts") {
  HashRing ring;
  CHECK(ring.add(1, "node-a"));
  CHECK(!ring.add(1, "node-b"));  // id taken
  CHECK(!ring.add(2, "node-a"));  // name taken
  CHECK(ring.size() == 1);
  CHECK(ring.name_of(1) == "node-a");
  CHECK_THROWS_AS(HashRing(0), std::invalid_argument);
  CHECK_THROWS_AS(HashRing(HashRing::kMaxReplicas + 1), std::invalid_argument);
  std::vector<RingMember> dup = {{1, "a"}, {2, "a"}};
  CHECK_THROWS_AS(HashRing{dup}, std::invalid_argument);
  ring.clear();
  CHECK(ring.empty());
}

TEST_CASE("hash_ring: balances primary ownership across 5 nodes within 5 percent") {
  // 100k keys over 5 nodes: 20'000 each, standard deviation ~126 (0.63%); 1.05 is 8 sigma.
  HashRing ring(nodes(5));
  std::vector<size_t> load(6, 0);
  for (NodeId id : primaries(ring, keys(100'000)))
    ++load[id];
  const double mean = 100'000 / 5.0;
  size_t max = 0, min = SIZE_MAX;
  for (NodeId id = 1; id <= 5; ++id) {
    max = std::max(max, load[id]);
    min = std::min(min, load[id]);
  }
  CHECK(static_cast<double>(max) / mean <= 1.05);
  CHECK(static_cast<double>(min) / mean >= 0.95);
}

TEST_CASE("hash_ring: share() agrees with the measured load and sums to one") {
  HashRing ring(nodes(5));
  const auto shares = ring.shares();
  REQUIRE(shares.size() == 5);
  double sum = 0;
  for (const auto& [id, s] : shares) {
    CHECK(s == ring.share(id));
    CHECK(s == doctest::Approx(0.2).epsilon(0.05));  // 65536 samples: sigma ~0.0016
    sum += s;
  }
  CHECK(sum == doctest::Approx(1.0));
  CHECK(ring.share(42) == 0.0);
}

TEST_CASE("hash_ring: moves about 1/N of the keys when a node joins, and only to it") {
  const auto ks = keys(100'000);
  for (size_t n : {3u, 5u, 10u}) {
    CAPTURE(n);
    HashRing before(nodes(n));
    HashRing after(nodes(n));
    REQUIRE(after.add(1'000, "newcomer"));
    size_t moved = 0, moved_elsewhere = 0, replica_changes_without_newcomer = 0;
    for (uint64_t k : ks) {
      std::array<NodeId, 2> b{}, a{};
      before.owners(k, b);
      after.owners(k, a);
      if (a[0] != b[0]) {
        ++moved;
        if (a[0] != 1'000) ++moved_elsewhere;
      }
      if (a != b && a[0] != 1'000 && a[1] != 1'000) ++replica_changes_without_newcomer;
    }
    const double frac = static_cast<double>(moved) / static_cast<double>(ks.size());
    const double ideal = 1.0 / static_cast<double>(n + 1);
    CHECK(moved_elsewhere == 0);
    CHECK(replica_changes_without_newcomer == 0);
    CHECK(frac == doctest::Approx(ideal).epsilon(0.05));  // sigma ~0.6% of ideal at n = 10
  }
}

TEST_CASE("hash_ring: moves only the departed node's keys when one leaves") {
  const auto ks = keys(100'000);
  for (size_t n : {3u, 5u, 10u}) {
    CAPTURE(n);
    HashRing before(nodes(n));
    HashRing after(nodes(n));
    const NodeId gone = static_cast<NodeId>(1 + n / 2);
    REQUIRE(after.remove(gone));
    size_t moved = 0, moved_not_from_gone = 0, replica_changes_without_gone = 0;
    for (uint64_t k : ks) {
      std::array<NodeId, 2> b{}, a{};
      before.owners(k, b);
      after.owners(k, a);
      if (a[0] != b[0]) {
        ++moved;
        if (b[0] != gone) ++moved_not_from_gone;
        // The replica takes over: the next owner already holds the key.
        if (n > 2) REQUIRE(a[0] == b[1]);
      }
      if (a != b && b[0] != gone && b[1] != gone) ++replica_changes_without_gone;
    }
    const double frac = static_cast<double>(moved) / static_cast<double>(ks.size());
    CHECK(moved_not_from_gone == 0);
    CHECK(replica_changes_without_gone == 0);
    CHECK(frac == doctest::Approx(1.0 / static_cast<double>(n)).epsilon(0.05));
  }
}

TEST_CASE("hash_ring: lookups allocate nothing") {
  HashRing ring(nodes(10), 3);
  const auto ks = keys(1'000);
  std::array<NodeId, 3> o{};
  uint64_t sum = 0;
  const uint64_t before = sluice::testing::allocations();
  for (uint64_t k : ks) {
    sum += ring.owners(k, o);
    sum += *ring.owner(k);
  }
  sum += static_cast<uint64_t>(ring.share(3, 1'000) * 1'000);
  CHECK(sluice::testing::allocations() - before == 0);
  CHECK(sum > 0);
}

}  // namespace
