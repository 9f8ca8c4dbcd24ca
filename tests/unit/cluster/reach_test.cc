// cluster::Reach (lib/cluster/reach.h), the part of ClusterNode that decides which members are in
// reach and what part of every limit this side allows, driven with an injected clock and the
// datagrams a transport would deliver: heartbeats and their echoes both ways, a cut, a one-way
// fault, a heal, dead and left members.
#include "cluster/reach.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <vector>

namespace {

using sluice::cluster::Member;
using sluice::cluster::MemberState;
using sluice::cluster::NodeId;
using sluice::cluster::Reach;

constexpr int64_t kT0 = 1'000'000;

// Five members, this node 1; sync every 100 ms: heartbeats every 50 ms, reach timeout 300 ms.
struct Fixture {
  Reach reach{{1, 100, 60'000}};
  std::map<NodeId, Member> members;
  int64_t now = kT0;
  int64_t their_clock = 5'000'000;  // the others' clocks differ from ours

  Fixture() {
    for (NodeId id = 1; id <= 5; ++id) {
      members[id] =
          Member{id, "node-" + std::to_string(id), "127.0.0.1", 0, 0, 0, 1, MemberState::kAlive};
      reach.state_changed(id, MemberState::kAlive, now);
      reach.met(id, now);
    }
  }
  // One heartbeat period: every member in `hear` reaches us (its batch echoes our last send) and
  // every member in `echo` got ours (it echoes it in its next batch, when that reaches us).
  void period(const std::vector<NodeId>& hear, const std::vector<NodeId>& echo) {
    now += 50;
    their_clock += 50;
    for (NodeId id : hear) {
      reach.heard(id, their_clock, now);
      if (std::find(echo.begin(), echo.end(), id) != echo.end()) reach.echoed(id, now - 50);
    }
  }
  Reach::Change update() { return reach.update(members, false, now); }
};

const std::vector<NodeId> kOthers{2, 3, 4, 5};

}  // namespace

TEST_CASE("heartbeat period, reach timeout and tick follow the sync interval and member count") {
  const Reach r({1, 100, 60'000});
  CHECK(r.heartbeat_ms(5) == 50);
  CHECK(r.timeout_ms(5) == 300);
  CHECK(r.tick_ms() == 25);
  CHECK(r.heartbeat_ms(200) == 200);  // at least 1 ms per member: at most ~1,000 sends a second
  CHECK(r.timeout_ms(200) == 1'200);
  const Reach fast({1, 10, 60'000});
  CHECK(fast.timeout_ms(5) == Reach::kMinTimeoutMs);
  CHECK(fast.tick_ms() == Reach::kMinTickMs);
}

TEST_CASE("members heard from and echoing ours are in reach, the limits are whole") {
  Fixture f;
  for (int i = 0; i < 10; ++i)
    f.period(kOthers, kOthers);
  const Reach::Change c = f.update();
  CHECK(c.went_out.empty());
  CHECK(f.reach.out_of_reach().empty());
  CHECK(f.reach.capacity() == std::pair<uint32_t, uint32_t>{5, 5});
  CHECK(f.reach.echo_for(2) == f.their_clock);  // what we echo back: its newest send time
  CHECK(f.reach.echo_for(9) == 0);
}

TEST_CASE(
    "a 2|3 cut: the far side goes out of reach within the timeout and the limits shrink "
    "at once, after the heal they grow back only three sync intervals later") {
  Fixture f;
  f.period(kOthers, kOthers);
  CHECK(f.update().went_out.empty());
  const int64_t cut = f.now;
  int64_t seen_at = 0;
  for (int i = 0; i < 10 && seen_at == 0; ++i) {
    f.period({2}, {2});  // 3, 4, 5 silent both ways
    const Reach::Change c = f.update();
    if (!c.went_out.empty()) {
      seen_at = f.now;
      CHECK(c.went_out.size() == 3);
      CHECK(c.capacity_changed);
    }
  }
  REQUIRE(seen_at != 0);
  CHECK(seen_at - cut <= 300 + 50);  // within the reach timeout (and one heartbeat)
  CHECK(f.reach.capacity() == std::pair<uint32_t, uint32_t>{2, 5});
  REQUIRE(f.reach.out_of_reach().size() == 3);
  CHECK(f.reach.out_of_reach()[0].first == 3);
  CHECK(f.reach.out_of_reach()[0].second == seen_at);
  // Still cut: reported once, since kept.
  f.period({2}, {2});
  CHECK(f.update().went_out.empty());
  CHECK(f.reach.out_of_reach()[0].second == seen_at);
  // Heal: back in reach at once (routing, sync), limits grow after 3 sync intervals.
  f.period(kOthers, kOthers);
  const Reach::Change back = f.update();
  CHECK(back.came_back.size() == 3);
  CHECK(back.out_changed);
  CHECK_FALSE(back.capacity_changed);
  CHECK(f.reach.capacity() == std::pair<uint32_t, uint32_t>{2, 5});
  const int64_t healed = f.now;
  while (f.now < healed + 300 - 50) {
    f.period(kOthers, kOthers);
    CHECK_FALSE(f.update().capacity_changed);
  }
  f.period(kOthers, kOthers);
  CHECK(f.update().capacity_changed);
  CHECK(f.reach.capacity() == std::pair<uint32_t, uint32_t>{5, 5});
}

TEST_CASE(
    "one-way: a member we hear but that never echoes ours is out of reach, and a node that "
    "hears from no one keeps to 1 / expected") {
  Fixture f;
  for (int i = 0; i < 8; ++i)
    f.period(kOthers, {3, 4, 5});  // 2 does not receive ours
  f.update();
  REQUIRE(f.reach.out_of_reach().size() == 1);
  CHECK(f.reach.out_of_reach()[0].first == 2);
  CHECK(f.reach.capacity() == std::pair<uint32_t, uint32_t>{4, 5});
  // This node deaf: it hears no one (the others may still get ours): cut off.
  for (int i = 0; i < 8; ++i)
    f.period({}, {});
  f.update();
  CHECK(f.reach.out_of_reach().size() == 4);
  CHECK(f.reach.capacity() == std::pair<uint32_t, uint32_t>{1, 5});
}

TEST_CASE(
    "a dead member is expected until forgotten, a left one never, meeting one keeps it in "
    "reach until the heartbeats say otherwise") {
  Fixture f;
  f.members[5].state = MemberState::kDead;
  f.reach.state_changed(5, MemberState::kDead, f.now);
  f.members[4].state = MemberState::kLeft;
  f.reach.state_changed(4, MemberState::kLeft, f.now);
  f.period({2, 3}, {2, 3});
  f.update();
  CHECK(f.reach.capacity() == std::pair<uint32_t, uint32_t>{3, 4});  // 5 dead: out, expected
  CHECK(f.reach.out_of_reach().empty());  // only live members are out of reach
  f.now += 60'000;                        // forgotten: expected no more
  f.period({2, 3}, {2, 3});
  f.update();
  f.now += 400;  // the growth waits 3 sync intervals
  f.period({2, 3}, {2, 3});
  f.update();
  CHECK(f.reach.capacity() == std::pair<uint32_t, uint32_t>{3, 3});
  // 5 comes back: met at once, so no shrink for a reach period.
  f.members[5].state = MemberState::kAlive;
  f.reach.state_changed(5, MemberState::kAlive, f.now);
  f.reach.met(5, f.now);
  f.update();
  f.now += 400;
  f.period({2, 3}, {2, 3});
  f.update();
  CHECK(f.reach.capacity().second == 4);
  CHECK(f.reach.counted(f.members[1], /*self_left=*/true, f.now) == false);
}
