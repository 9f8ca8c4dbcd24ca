// OwnerRouting (lib/node/owner_routing.h): who decides an owner-mode check, from cluster views
// built here (a 3-member ring, members out of reach since given times, joining) and an injected
// clock: forwarding to the owner, failover to a replica, a replica taking over, the fallback when
// none is in reach, silent owners (timeouts in a row), and checks forwarded here.
#include "node/owner_routing.h"

#include <doctest/doctest.h>

#include <array>
#include <memory>
#include <set>
#include <vector>

namespace {

using sluice::node::CheckRouter;
using sluice::node::ClusterNode;
using sluice::node::OwnerRouting;
using Route = CheckRouter::Route;

constexpr int64_t kNow = 1'000'000;

// A view of members 1, 2, 3 (R = 2), with `out` out of reach since the times given.
ClusterNode::View view_of(std::vector<std::pair<uint16_t, int64_t>> out = {}) {
  auto ring = std::make_shared<sluice::cluster::HashRing>(2);
  for (const uint16_t id : std::array<uint16_t, 3>{1, 2, 3})
    ring->add(id, "node-" + std::to_string(id));
  ClusterNode::View v;
  v.ring = ring;
  v.members = std::make_shared<const std::vector<sluice::cluster::Member>>();
  v.expected_members = 3;
  v.out_of_reach =
      std::make_shared<const std::vector<std::pair<uint16_t, int64_t>>>(std::move(out));
  return v;
}

// A routing key whose owner is `owner` and whose replica is `replica`.
uint64_t key_owned_by(const ClusterNode::View& v, uint16_t owner, uint16_t replica) {
  for (uint64_t k = 1; k < 100'000; ++k) {
    std::array<uint16_t, 2> o{};
    if (v.ring->owners(k, o) == 2 && o[0] == owner && o[1] == replica) return k;
  }
  FAIL("no key with that owner and replica");
  return 0;
}

bool same(const Route& a, const Route& b) {
  return a.node == b.node && a.redirect == b.redirect && a.fallback == b.fallback &&
         a.takeover == b.takeover &&
         (!(a.fallback || a.takeover) || a.fallback_since_ms == b.fallback_since_ms);
}
Route to(uint16_t node) {
  return {node, false};
}
Route fallback(int64_t since) {
  Route r;
  r.fallback = true;
  r.fallback_since_ms = since;
  return r;
}
Route takeover(int64_t since) {
  Route r;
  r.takeover = true;
  r.fallback_since_ms = since;
  return r;
}

struct Fixture {
  std::set<uint16_t> addressed{1, 2, 3};
  OwnerRouting routing{1, [this](uint16_t id) { return addressed.count(id) != 0; }};
};

}  // namespace

TEST_CASE("every member in reach: the owner decides, here or forwarded, no failover") {
  Fixture f;
  const auto v = view_of();
  CHECK(same(f.routing.route(v, key_owned_by(v, 1, 2), false, kNow), Route{}));
  CHECK(same(f.routing.route(v, key_owned_by(v, 2, 3), false, kNow), to(2)));
  CHECK(same(f.routing.route(v, key_owned_by(v, 3, 1), false, kNow), to(3)));
  CHECK(f.routing.failovers() == 0);
  CHECK_FALSE(OwnerRouting::routes_forwarded(v, kNow));
}

TEST_CASE("an owner out of reach: its replica decides, another node's or this one (takeover)") {
  Fixture f;
  const auto v = view_of({{2, kNow - 400}});
  CHECK(same(f.routing.route(v, key_owned_by(v, 2, 3), false, kNow), to(3)));
  CHECK(f.routing.failovers() == 1);
  // This node is the replica: decided here, nothing for a window from when the owner was lost.
  CHECK(same(f.routing.route(v, key_owned_by(v, 2, 1), false, kNow), takeover(kNow - 400)));
  CHECK(f.routing.failovers() == 2);
  // Keys of the members in reach are not touched.
  CHECK(same(f.routing.route(v, key_owned_by(v, 3, 2), false, kNow), to(3)));
  CHECK(f.routing.failovers() == 2);
  CHECK(OwnerRouting::routes_forwarded(v, kNow));
}

TEST_CASE("owner and replicas all out of reach: the fallback, from when the last went") {
  Fixture f;
  const auto v = view_of({{2, kNow - 900}, {3, kNow - 300}});
  CHECK(same(f.routing.route(v, key_owned_by(v, 2, 3), false, kNow), fallback(kNow - 300)));
  CHECK(same(f.routing.route(v, key_owned_by(v, 3, 2), false, kNow), fallback(kNow - 300)));
}

TEST_CASE("a check forwarded here is decided here as asked, or taken over, never sent on") {
  Fixture f;
  const auto all = view_of();
  // Our ring says node 2 owns it, the sender's said us: decided here, not sent back.
  CHECK(same(f.routing.route(all, key_owned_by(all, 2, 3), true, kNow), Route{}));
  const auto cut = view_of({{2, kNow - 100}, {3, kNow - 50}});
  CHECK(same(f.routing.route(cut, key_owned_by(cut, 2, 3), true, kNow), Route{}));
  // Sent to us as the replica of an owner we cannot reach either: a takeover, not a failover
  // here (the sender counted it).
  CHECK(same(f.routing.route(cut, key_owned_by(cut, 2, 1), true, kNow), takeover(kNow - 100)));
  CHECK(f.routing.failovers() == 0);
}

TEST_CASE("three timeouts in a row pass an owner over for a second, an answer ends it at once") {
  Fixture f;
  const auto v = view_of();
  const uint64_t k = key_owned_by(v, 2, 3);
  f.routing.note_timeout(2, kNow);
  f.routing.note_timeout(2, kNow);
  CHECK(same(f.routing.route(v, k, false, kNow), to(2)));  // a slow moment: still asked
  f.routing.note_timeout(2, kNow);
  CHECK(f.routing.silent(2, kNow));
  CHECK(same(f.routing.route(v, k, false, kNow + 10), fallback(kNow + 10)));  // denied now
  CHECK(same(f.routing.route(v, k, false, kNow + OwnerRouting::kSilentMs), to(2)));
  // Silent again, then it answers: asked again at once, and the count starts over.
  for (int i = 0; i < 3; ++i)
    f.routing.note_timeout(2, kNow + 2'000);
  CHECK(f.routing.silent(2, kNow + 2'001));
  f.routing.note_answer(2);
  CHECK(same(f.routing.route(v, k, false, kNow + 2'001), to(2)));
  f.routing.note_timeout(2, kNow + 2'002);
  CHECK_FALSE(f.routing.silent(2, kNow + 2'003));
}

TEST_CASE("an owner whose check address is unknown is not sent to: the fallback from now") {
  Fixture f;
  f.addressed.erase(2);
  const auto v = view_of();
  CHECK(same(f.routing.route(v, key_owned_by(v, 2, 3), false, kNow), fallback(kNow)));
}

// Node 1 just joined nodes 2 and 3: the ring without it is theirs, and it is joining for 300 ms.
ClusterNode::View joining_view() {
  auto v = view_of();
  auto without = std::make_shared<sluice::cluster::HashRing>(2);
  for (const uint16_t id : std::array<uint16_t, 2>{2, 3})
    without->add(id, "node-" + std::to_string(id));
  v.ring_without_self = without;
  v.fresh_until_ms = kNow + 300;
  return v;
}

TEST_CASE(
    "joining: a key this node owns stays with its previous owner, redirected, while it "
    "answers") {
  Fixture f;
  auto v = joining_view();
  const auto& without = v.ring_without_self;
  const uint64_t k = key_owned_by(v, 1, 2);
  const uint16_t before = *without->owner(k);
  CHECK(OwnerRouting::routes_forwarded(v, kNow));
  CHECK(same(f.routing.route(v, k, false, kNow), Route{before, true}));
  CHECK(same(f.routing.route(v, k, true, kNow), Route{before, true}));  // forwarded: sent on
  // The previous owner silent, or the joining period over: decided here.
  for (int i = 0; i < 3; ++i)
    f.routing.note_timeout(before, kNow);
  CHECK(same(f.routing.route(v, k, false, kNow + 1), Route{}));
  CHECK(same(f.routing.route(v, k, false, kNow + 300 + OwnerRouting::kSilentMs), Route{}));
}

TEST_CASE(
    "a new life of this node id decides its own keys as a takeover from its start while fenced, "
    "even while joining") {
  Fixture f;
  auto v = joining_view();
  v.self_fence_since_ms = kNow - 50;
  v.self_fence_until_ms = kNow - 50 + ClusterNode::View::kRestartFenceMs;
  const uint64_t mine = key_owned_by(v, 1, 2);
  CHECK(same(f.routing.route(v, mine, false, kNow), takeover(kNow - 50)));
  CHECK(same(f.routing.route(v, mine, true, kNow), takeover(kNow - 50)));
  // Other owners' keys go to them as ever.
  CHECK(same(f.routing.route(v, key_owned_by(v, 2, 3), false, kNow), to(2)));
  // The fence over (and the joining): decided here as the owner.
  const int64_t after = v.self_fence_until_ms;
  CHECK(same(f.routing.route(v, mine, false, after), Route{}));
}

TEST_CASE(
    "a check a restarted owner redirects here is taken over from when its new life was heard, "
    "until the fence ends, while a client check still goes to that owner") {
  Fixture f;
  auto v = view_of();
  const int64_t heard = kNow - 100;
  v.restarted = std::make_shared<const std::vector<std::pair<uint16_t, int64_t>>>(
      std::vector<std::pair<uint16_t, int64_t>>{{2, heard}});
  CHECK(OwnerRouting::routes_forwarded(v, kNow));
  const uint64_t k = key_owned_by(v, 2, 1);
  CHECK(same(f.routing.route(v, k, true, kNow), takeover(heard)));
  CHECK(same(f.routing.route(v, k, false, kNow), to(2)));
  CHECK(same(f.routing.route(v, key_owned_by(v, 3, 1), true, kNow), Route{}));  // not fenced
  const int64_t over = heard + ClusterNode::View::kRestartFenceMs;
  CHECK(same(f.routing.route(v, k, true, over), Route{}));
}
