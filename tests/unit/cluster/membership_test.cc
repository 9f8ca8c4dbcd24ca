// Unit tests of lib/cluster/membership: the pure functions (precedence, suspicion timeout,
// retransmit limit, option validation) and one node driven by hand through a recording transport
// (hostile and stale input, local health, suspect pings, the deadline contract). Join and
// anti-entropy are in membership_join_test.cc, whole clusters in a simulated network in
// membership_cluster_test.cc.
//
// Everything is deterministic: time is simulated, randomness comes from seeded generators, and
// randomized loops have fixed counts.
#include "cluster/membership.h"

#include <doctest/doctest.h>

#include "membership_fakes.h"
#include "membership_sim.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace sluice::cluster;
using namespace sluice::testing::membership;

namespace {

// ---- one node driven by hand ----

using sluice::testing::msg;
using sluice::testing::RecordingTransport;
using sluice::testing::Sent;

// Node 1 (node-a) that knows nodes 2..n as Alive at incarnation 0, through a kJoinReply.
struct HandDriven {
  RecordingTransport transport;
  Membership node;
  int64_t now = 1'000'000;

  explicit HandDriven(size_t n, MembershipOptions options = {}, uint64_t seed = 7)
      : node(member_of(0), options, transport, seed) {
    const Endpoint seed_endpoint = endpoint_of(1);
    node.join(std::span<const Endpoint>(&seed_endpoint, 1), now);
    std::vector<Member> list;
    for (size_t i = 1; i < n; ++i)
      list.push_back(member_of(i));
    node.on_message(seed_endpoint, msg(MembershipKind::kJoinReply, id_of(1), 0, id_of(0), list),
                    now);
    transport.take();
  }

  // Advances time to `until`, ticking at every deadline, and returns what was sent.
  std::vector<Sent> run_until(int64_t until) {
    while (node.next_deadline_ms() <= until) {
      now = std::max(now, node.next_deadline_ms());
      node.tick(now);
      REQUIRE(node.next_deadline_ms() > now);
    }
    now = until;
    return transport.take();
  }

  MemberState state_of(NodeId id) const { return node.find(id).value().state; }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Pure functions

TEST_CASE(
    "membership: precedence: larger incarnation wins, then Left over Dead over Suspect over "
    "Alive") {
  using S = MemberState;
  struct Row {
    uint32_t known_inc;
    S known;
    uint32_t update_inc;
    S update;
    bool wins;
  };
  const Row rows[] = {
      {0, S::kAlive, 0, S::kAlive, false},
      {0, S::kAlive, 0, S::kSuspect, true},
      {0, S::kAlive, 0, S::kDead, true},
      {0, S::kAlive, 0, S::kLeft, true},
      {0, S::kSuspect, 0, S::kAlive, false},
      {0, S::kSuspect, 0, S::kSuspect, false},
      {0, S::kSuspect, 0, S::kDead, true},
      {0, S::kDead, 0, S::kSuspect, false},
      {0, S::kDead, 0, S::kLeft, true},
      {0, S::kLeft, 0, S::kDead, false},
      {3, S::kSuspect, 4, S::kAlive, true},
      {3, S::kDead, 4, S::kAlive, true},
      {3, S::kLeft, 4, S::kAlive, true},
      {4, S::kAlive, 3, S::kLeft, false},
      {4, S::kAlive, 3, S::kDead, false},
      {7, S::kDead, 7, S::kAlive, false},
      {0, S::kAlive, 4'000'000'000u, S::kAlive, true},
  };
  for (const Row& row : rows) {
    CAPTURE(row.known_inc);
    CAPTURE(to_string(row.known));
    CAPTURE(row.update_inc);
    CAPTURE(to_string(row.update));
    CHECK(supersedes(record(2, "node-b", row.update_inc, row.update),
                     record(2, "node-b", row.known_inc, row.known)) == row.wins);

    // The same rule applied by a node that holds `known` (brought there by a kJoinReply, which
    // applies the same rule) and hears `update` piggybacked on an ack.
    HandDriven h(3);
    const Endpoint seed = endpoint_of(1);
    h.node.on_message(
        seed,
        msg(MembershipKind::kJoinReply, 2, 0, 1, {record(3, "node-c", row.known_inc, row.known)}),
        h.now);
    REQUIRE(h.node.find(3)->incarnation == row.known_inc);
    REQUIRE(h.state_of(3) == row.known);
    h.node.on_message(
        seed,
        msg(MembershipKind::kAck, 2, 999, 2, {record(3, "node-c", row.update_inc, row.update)}),
        h.now);
    const Member after = *h.node.find(3);
    if (row.wins) {
      CHECK(after.incarnation == row.update_inc);
      CHECK(after.state == row.update);
    } else {
      CHECK(after.incarnation == row.known_inc);
      CHECK(after.state == row.known);
    }
  }
}

TEST_CASE("membership: suspicion timeout falls from max to min with independent confirmations") {
  const MembershipOptions o;  // 1 s probe interval, suspicion_mult 1, max 6x, 3 confirmations
  // N = 5: min = log10(6) s = 778 ms, max = 6 * min, k = min(3, N - 2) = 3.
  CHECK(suspicion_timeout_ms(o, 5, 0) == 4'668);
  CHECK(suspicion_timeout_ms(o, 5, 1) == 2'723);  // max - (max - min) * log 2 / log 4
  CHECK(suspicion_timeout_ms(o, 5, 2) == 1'585);  // max - (max - min) * log 3 / log 4
  CHECK(suspicion_timeout_ms(o, 5, 3) == 778);
  CHECK(suspicion_timeout_ms(o, 5, 9) == 778);
  // N = 3: only one other member can confirm.
  CHECK(suspicion_timeout_ms(o, 3, 0) == 3'612);
  CHECK(suspicion_timeout_ms(o, 3, 1) == 602);
  // N = 2: nobody can confirm, so the floor applies at once.
  CHECK(suspicion_timeout_ms(o, 2, 0) == 477);
  // Larger clusters wait longer (log10(N + 1)).
  CHECK(suspicion_timeout_ms(o, 100, 3) == 2'004);
  CHECK(suspicion_timeout_ms(o, 100, 0) == 12'024);
  MembershipOptions slow = o;
  slow.suspicion_mult = 4;
  CHECK(suspicion_timeout_ms(slow, 5, 3) == 3'113);
}

TEST_CASE("membership: retransmit limit grows with log10 of the cluster size") {
  const MembershipOptions o;
  CHECK(retransmit_limit(o, 1) == 4);
  CHECK(retransmit_limit(o, 5) == 4);
  CHECK(retransmit_limit(o, 9) == 4);
  CHECK(retransmit_limit(o, 10) == 8);
  CHECK(retransmit_limit(o, 100) == 12);
}

TEST_CASE("membership: options are validated with the name of the offending setting") {
  CHECK(validate(MembershipOptions{}).ok());
  MembershipOptions o;
  o.probe_timeout_ms = 1'000;
  CHECK(validate(o).message().find("probe_timeout_ms") != std::string::npos);
  o = {};
  o.nack_timeout_ms = 600;
  CHECK(validate(o).message().find("nack_timeout_ms") != std::string::npos);
  o = {};
  o.max_gossip_per_message = 1;
  CHECK(validate(o).message().find("max_gossip_per_message") != std::string::npos);
  o = {};
  o.max_local_health = 0;
  CHECK(validate(o).message().find("max_local_health") != std::string::npos);
  RecordingTransport t;
  CHECK_THROWS_AS(Membership(member_of(0), o, t, 1), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// One node driven by hand

TEST_CASE(
    "membership: tick before the deadline does nothing, and the deadline is always in the future") {
  HandDriven h(4);
  const int64_t deadline = h.node.next_deadline_ms();
  REQUIRE(deadline > h.now);
  REQUIRE(deadline < h.now + 2 * kSec);  // a probe is due within an interval
  h.node.tick(deadline - 1);
  CHECK(h.transport.sent.empty());
  h.node.tick(deadline);
  CHECK(h.node.next_deadline_ms() > deadline);
}

TEST_CASE(
    "membership: round-robin probing visits every member once per pass, newcomers in the same "
    "pass") {
  HandDriven h(5);
  auto probe_next = [&]() -> NodeId {
    const uint64_t before = h.node.stats().probes_sent;
    while (h.node.stats().probes_sent == before) {
      h.now = h.node.next_deadline_ms();
      h.node.tick(h.now);
    }
    NodeId target = 0;
    for (const Sent& s : h.transport.take()) {
      if (s.message.kind != MembershipKind::kPing) continue;
      target = s.message.target;
      h.node.on_message(s.to, msg(MembershipKind::kAck, target, s.message.seq, target), h.now);
    }
    return target;
  };
  // Find the start of a pass: the order is reshuffled when a pass ends, so any 4 consecutive
  // probes from a pass boundary are a permutation of the 4 members.
  std::vector<NodeId> seen;
  for (int i = 0; i < 12; ++i)
    seen.push_back(probe_next());
  bool some_window_is_a_pass = false;
  for (size_t start = 0; start < 4; ++start) {
    bool all_passes = true;
    for (size_t p = start; p + 4 <= seen.size(); p += 4) {
      std::set<NodeId> pass(seen.begin() + static_cast<std::ptrdiff_t>(p),
                            seen.begin() + static_cast<std::ptrdiff_t>(p + 4));
      all_passes = all_passes && pass.size() == 4;
    }
    some_window_is_a_pass = some_window_is_a_pass || all_passes;
  }
  CHECK(some_window_is_a_pass);
  // A member that joins is probed within the current pass or the next one at the latest.
  const Member newcomer = member_of(9);
  h.node.on_message(endpoint_of(9), msg(MembershipKind::kJoin, newcomer.id, 0, 0, {newcomer}),
                    h.now);
  h.transport.take();
  bool probed = false;
  for (int i = 0; i < 10 && !probed; ++i)
    probed = probe_next() == newcomer.id;
  CHECK(probed);
}

TEST_CASE("membership: unknown, stale, forged and malformed messages are ignored and counted") {
  HandDriven h(4);
  const Endpoint stranger{"192.0.2.9", 7946};
  auto ignored = [&](IgnoredReason r) { return h.node.stats().ignored_of(r); };

  SUBCASE("a ping from an unknown member is answered, asking for its record; its records ignored") {
    h.node.on_message(
        stranger,
        msg(MembershipKind::kPing, 99, 5, 1, {record(3, "node-c", 4, MemberState::kDead)}), h.now);
    CHECK(ignored(IgnoredReason::kUnknownSender) == 1);
    REQUIRE(h.transport.sent.size() == 1);
    const Sent& ack = h.transport.sent.front();
    CHECK(ack.to == stranger);
    CHECK(ack.message.kind == MembershipKind::kAck);
    CHECK(ack.message.seq == 5);
    CHECK(ack.message.unknown_recipient);
    CHECK(h.state_of(3) == MemberState::kAlive);
    CHECK_FALSE(h.node.find(99).has_value());
    // Meant for another node (the address was reused): not answered.
    h.transport.take();
    h.node.on_message(stranger, msg(MembershipKind::kPing, 99, 6, 3), h.now);
    CHECK(ignored(IgnoredReason::kMalformed) == 1);
    CHECK(h.transport.sent.empty());
  }
  SUBCASE("acks and nacks for no pending probe") {
    h.node.on_message(endpoint_of(1), msg(MembershipKind::kAck, 2, 12345, 2), h.now);
    h.node.on_message(endpoint_of(1), msg(MembershipKind::kNack, 2, 12345, 3), h.now);
    CHECK(ignored(IgnoredReason::kUnknownSeq) == 2);
  }
  SUBCASE("our own id, a kJoin without the joiner's record, a ping-req about us") {
    h.node.on_message(endpoint_of(0), msg(MembershipKind::kPing, 1, 1, 1), h.now);
    CHECK(ignored(IgnoredReason::kFromSelf) == 1);
    h.node.on_message(endpoint_of(1), msg(MembershipKind::kJoin, 2, 0, 0), h.now);
    h.node.on_message(endpoint_of(1), msg(MembershipKind::kPingReq, 2, 1, 1), h.now);
    h.node.on_message(endpoint_of(1), msg(MembershipKind::kPing, 2, 1, 3), h.now);  // not for us
    CHECK(ignored(IgnoredReason::kMalformed) == 3);
    CHECK(h.transport.sent.empty());
  }
  SUBCASE("a kJoinReply nobody asked for") {
    HandDriven late(3);
    late.now += 10 * kSec;
    late.node.on_message(endpoint_of(2), msg(MembershipKind::kJoinReply, 3, 0, 1, {member_of(7)}),
                         late.now);
    CHECK(late.node.stats().ignored_of(IgnoredReason::kUnexpectedJoinReply) == 1);
    CHECK_FALSE(late.node.find(id_of(7)).has_value());
  }
  SUBCASE("an unknown kind") {
    MembershipMessage m = msg(MembershipKind::kPing, 2, 1, 1);
    m.kind = static_cast<MembershipKind>(42);
    h.node.on_message(endpoint_of(1), m, h.now);
    CHECK(ignored(IgnoredReason::kMalformed) == 1);
  }
  SUBCASE("seeded random junk never crashes and never touches self") {
    std::mt19937_64 rng(2024);
    const Member self_before = h.node.self();
    for (int i = 0; i < 3'000; ++i) {
      MembershipMessage m;
      m.kind = static_cast<MembershipKind>(rng() % 7);
      m.from = static_cast<NodeId>(rng() % 8);
      m.seq = static_cast<uint32_t>(rng() % 4);
      m.target = static_cast<NodeId>(rng() % 8);
      const size_t n = rng() % 4;
      for (size_t g = 0; g < n; ++g) {
        const NodeId id = static_cast<NodeId>(1 + rng() % 7);
        // Known ids (self included) keep their names, except now and then (identity conflicts).
        std::string name = id <= 4 && rng() % 5 == 0 ? "impostor" : member_of(id - 1u).name;
        m.gossip.push_back(record(id, name, static_cast<uint32_t>(rng() % 3),
                                  static_cast<MemberState>(rng() % 4)));
      }
      h.now += static_cast<int64_t>(rng() % 50);
      h.node.on_message(endpoint_of(rng() % 8), m, h.now);
      if (h.node.next_deadline_ms() <= h.now) h.node.tick(h.now);
    }
    CHECK(h.node.self().name == self_before.name);
    CHECK(h.node.self().state == MemberState::kAlive);
    CHECK(h.node.stats().ignored_of(IgnoredReason::kIdentityConflict) > 0);
    for (const Member& m : h.node.members())
      CHECK(m.name != "impostor");
  }
}

TEST_CASE(
    "membership: probes carry no record of their sender, and a member that does not know the "
    "sender gets it at once") {
  HandDriven h(6);
  const auto carries_self = [](const Sent& s) {
    return std::any_of(s.message.gossip.begin(), s.message.gossip.end(),
                       [](const Member& g) { return g.id == id_of(0); });
  };
  // Two probe rounds, every ping answered at once: no member is told who we are.
  const auto next_probe = [&h] {
    for (int step = 0; step < 30; ++step)
      for (Sent& s : h.run_until(h.now + 100))
        if (s.message.kind == MembershipKind::kPing) return s;
    FAIL("no probe within 3 s");
    return Sent{};
  };
  for (int probes = 0; probes < 10; ++probes) {
    const Sent s = next_probe();
    CHECK_FALSE(carries_self(s));
    h.node.on_message(
        s.to, msg(MembershipKind::kAck, s.message.target, s.message.seq, s.message.target), h.now);
    CHECK(h.transport.take().empty());
  }
  // A member answers a ping without knowing us: it is sent our record at once, in a kPing.
  const Sent probe = next_probe();
  MembershipMessage ack =
      msg(MembershipKind::kAck, probe.message.target, probe.message.seq, probe.message.target);
  ack.unknown_recipient = true;
  h.node.on_message(probe.to, ack, h.now);
  const std::vector<Sent> intro = h.transport.take();
  REQUIRE(intro.size() == 1);
  CHECK(intro[0].to == probe.to);
  CHECK(intro[0].message.kind == MembershipKind::kPing);
  CHECK(carries_self(intro[0]));
  CHECK(h.node.stats().probes_failed == 0);
}

TEST_CASE("membership: a record of our id under another name never replaces anything") {
  HandDriven h(3);
  const Member impostor = record(2, "mallory", 50, MemberState::kAlive);
  h.node.on_message(endpoint_of(2), msg(MembershipKind::kPing, 3, 1, 1, {impostor}), h.now);
  CHECK(h.node.find(2)->name == "node-b");
  CHECK(h.node.find(2)->incarnation == 0);
  const MembershipStats s = h.node.stats();
  CHECK(s.ignored_of(IgnoredReason::kIdentityConflict) == 1);
  REQUIRE(s.last_identity_conflict.has_value());
  CHECK(s.last_identity_conflict->id == 2);
  CHECK(s.last_identity_conflict->known_name == "node-b");
  CHECK(s.last_identity_conflict->claimed_name == "mallory");
  // A claim on our own id, through gossip or kJoin.
  h.node.on_message(
      endpoint_of(2),
      msg(MembershipKind::kPing, 3, 1, 1, {record(1, "mallory", 9, MemberState::kDead)}), h.now);
  h.node.on_message(
      endpoint_of(2),
      msg(MembershipKind::kJoin, 1, 0, 0, {record(1, "mallory", 0, MemberState::kAlive)}), h.now);
  CHECK(h.node.stats().ignored_of(IgnoredReason::kIdentityConflict) == 3);
  CHECK(h.node.self().incarnation == 0);
  CHECK(h.node.self().state == MemberState::kAlive);
}

TEST_CASE("membership: a node that hears it is suspected refutes with a larger incarnation") {
  HandDriven h(4);
  h.node.on_message(
      endpoint_of(1),
      msg(MembershipKind::kPing, 2, 7, 1, {record(1, "node-a", 0, MemberState::kSuspect)}), h.now);
  CHECK(h.node.self().incarnation == 1);
  CHECK(h.node.self().state == MemberState::kAlive);
  CHECK(h.node.stats().refutations == 1);
  CHECK(h.node.stats().local_health == 1);
  // The ack, and an immediate gossip round, carry the refutation.
  const std::vector<Sent> sent = h.transport.take();
  size_t carrying = 0;
  for (const Sent& s : sent)
    for (const Member& g : s.message.gossip)
      if (g.id == 1 && g.incarnation == 1 && g.state == MemberState::kAlive) ++carrying;
  CHECK(carrying >= 2);
  // Old news about us (a lower incarnation) changes nothing.
  h.node.on_message(
      endpoint_of(1),
      msg(MembershipKind::kPing, 2, 8, 1, {record(1, "node-a", 0, MemberState::kDead)}), h.now);
  CHECK(h.node.self().incarnation == 1);
  // A record of an earlier life with a larger incarnation (after a restart) is outbid.
  h.node.on_message(
      endpoint_of(1),
      msg(MembershipKind::kPing, 2, 9, 1, {record(1, "node-a", 6, MemberState::kAlive)}), h.now);
  CHECK(h.node.self().incarnation == 7);
}

TEST_CASE(
    "membership: a probe without ack goes indirect, then the target becomes Suspect, then Dead") {
  HandDriven h(5);  // self + 4 others: k = 3, timeout 4.7 s unconfirmed
  int64_t t0 = h.node.next_deadline_ms();
  std::vector<Sent> sent = h.run_until(t0);
  REQUIRE(sent.size() == 1);
  REQUIRE(sent[0].message.kind == MembershipKind::kPing);
  const NodeId target = sent[0].message.target;
  const uint32_t seq = sent[0].message.seq;
  // Nothing for 500 ms: three relays are asked.
  sent = h.run_until(t0 + 500);
  size_t ping_reqs = 0;
  for (const Sent& s : sent) {
    if (s.message.kind != MembershipKind::kPingReq) continue;
    ++ping_reqs;
    CHECK(s.message.target == target);
    CHECK(s.message.seq == seq);
  }
  CHECK(ping_reqs == 3);
  // The relays nack (Lifeguard): our own messages get through, so our health is unharmed.
  h.now += 5;
  for (const Sent& s : sent)
    if (s.message.kind == MembershipKind::kPingReq) {
      const NodeId relay = static_cast<NodeId>(std::stoi(s.to.host.substr(7)));
      h.node.on_message(s.to, msg(MembershipKind::kNack, relay, seq, target), h.now);
    }
  CHECK(h.node.stats().nacks_received == 3);
  // A late answer is still welcome until the end of the probe interval: Suspect only then.
  h.run_until(t0 + 999);
  CHECK(h.state_of(target) == MemberState::kAlive);
  h.run_until(t0 + 1'000);
  CHECK(h.state_of(target) == MemberState::kSuspect);
  CHECK(h.node.stats().local_health == 0);
  CHECK(h.node.stats().probes_failed == 1);
  // No confirmations: the long timeout (max = 6 * 778 ms) before Dead.
  h.run_until(t0 + 1'000 + 4'667);
  CHECK(h.state_of(target) == MemberState::kSuspect);
  h.run_until(t0 + 1'000 + 4'668);
  CHECK(h.state_of(target) == MemberState::kDead);
  CHECK(h.node.stats().deaths_declared == 1);
}

// Advances `h` to `until` as HandDriven::run_until does, every member but `silent` answering
// each ping sent to it at once; returns what was sent.
std::vector<Sent> run_answering(HandDriven& h, int64_t until, NodeId silent) {
  std::vector<Sent> all;
  while (h.node.next_deadline_ms() <= until) {
    h.now = std::max(h.now, h.node.next_deadline_ms());
    h.node.tick(h.now);
    for (Sent& s : h.transport.take()) {
      if (s.message.kind == MembershipKind::kPing && s.message.target != silent) {
        h.node.on_message(
            s.to, msg(MembershipKind::kAck, s.message.target, s.message.seq, s.message.target),
            h.now);
      }
      all.push_back(std::move(s));
    }
  }
  h.now = until;
  return all;
}

TEST_CASE(
    "membership: probe_now probes a member that went silent at once, out of the round-robin, "
    "and it is Suspect when neither it nor a relay answers") {
  HandDriven h(5);
  const NodeId target = 3;
  h.node.probe_now(target, h.now);
  std::vector<Sent> sent = h.transport.take();
  CHECK(std::count_if(sent.begin(), sent.end(), [&](const Sent& s) {
          return s.message.kind == MembershipKind::kPing && s.message.target == target;
        }) == 1);
  CHECK(h.node.stats().early_probes == 1);
  // Under way: asked again, nothing more is sent. Self and unknown ids are not probed.
  h.node.probe_now(target, h.now);
  h.node.probe_now(id_of(0), h.now);
  h.node.probe_now(99, h.now);
  CHECK(h.transport.take().empty());
  CHECK(h.node.stats().early_probes == 1);
  // No ack: indirect probes after the probe timeout, then Suspect at the end of the interval.
  const int64_t asked = h.now;
  sent = run_answering(h, asked + 500, target);
  CHECK(std::count_if(sent.begin(), sent.end(), [&](const Sent& s) {
          return s.message.kind == MembershipKind::kPingReq && s.message.target == target;
        }) == 3);
  run_answering(h, asked + 999, target);
  CHECK(h.state_of(target) == MemberState::kAlive);
  run_answering(h, asked + 1'000, target);
  CHECK(h.state_of(target) == MemberState::kSuspect);
}

TEST_CASE("membership: probe_now of a member that answers changes nothing") {
  HandDriven h(4);
  h.node.probe_now(2, h.now);
  CHECK(h.node.stats().early_probes == 1);
  run_answering(h, h.now + 3'000, 0);  // everyone answers
  CHECK(h.state_of(2) == MemberState::kAlive);
  CHECK(h.node.stats().probes_failed == 0);
}

TEST_CASE("membership: a confirmation probe ends as soon as every relay has nacked, and confirms") {
  HandDriven h(5);
  const Member c_suspect = record(3, "node-c", 0, MemberState::kSuspect);
  h.node.on_message(endpoint_of(1), msg(MembershipKind::kPing, 2, 1, 1, {c_suspect}), h.now);
  const int64_t learned = h.now;
  std::vector<Sent> sent = h.transport.take();
  const auto ping = std::find_if(sent.begin(), sent.end(), [](const Sent& s) {
    return s.message.kind == MembershipKind::kPing && s.message.target == 3;
  });
  REQUIRE(ping != sent.end());
  const uint32_t seq = ping->message.seq;
  sent = h.run_until(learned + 500);
  size_t relays = 0;
  h.now += 5;
  for (const Sent& s : sent)
    if (s.message.kind == MembershipKind::kPingReq) {
      ++relays;
      const NodeId relay = static_cast<NodeId>(std::stoi(s.to.host.substr(7)));
      h.node.on_message(s.to, msg(MembershipKind::kNack, relay, seq, 3), h.now);
    }
  CHECK(relays == 3);  // every Alive member but the target, the accuser included
  h.run_until(learned + 505);
  CHECK(h.node.stats().probes_failed == 1);
  CHECK(h.node.stats().suspicions_raised == 1);
  // Our own failed probe is the first confirmation: max - (max - min) * log 2 / log 4 = 2723 ms.
  h.run_until(learned + 2'722);
  CHECK(h.state_of(3) == MemberState::kSuspect);
  h.run_until(learned + 2'723);
  CHECK(h.state_of(3) == MemberState::kDead);
}

TEST_CASE(
    "membership: independent confirmations shorten the suspicion and repeats do not count twice") {
  HandDriven h(5);
  const Endpoint b = endpoint_of(1);
  const Member c_suspect = record(3, "node-c", 0, MemberState::kSuspect);
  // node-b suspects node-c; we learn it and start a confirmation probe of our own.
  h.node.on_message(b, msg(MembershipKind::kPing, 2, 1, 1, {c_suspect}), h.now);
  CHECK(h.state_of(3) == MemberState::kSuspect);
  CHECK(h.node.stats().confirmation_probes == 1);
  // node-c answers our probe (it is only slow to refute), so we do not accuse it ourselves.
  for (const Sent& s : h.transport.take())
    if (s.message.kind == MembershipKind::kPing && s.message.target == 3)
      h.node.on_message(endpoint_of(2), msg(MembershipKind::kAck, 3, s.message.seq, 3), h.now);
  CHECK(h.node.stats().probe_acks == 1);
  // node-b repeating itself is no confirmation; node-d and node-e are.
  h.node.on_message(b, msg(MembershipKind::kPing, 2, 2, 1, {c_suspect}), h.now);
  CHECK(h.node.stats().confirmations_received == 0);
  h.node.on_message(endpoint_of(3), msg(MembershipKind::kPing, 4, 3, 1, {c_suspect}), h.now);
  h.node.on_message(endpoint_of(4), msg(MembershipKind::kPing, 5, 4, 1, {c_suspect}), h.now);
  CHECK(h.node.stats().confirmations_received == 2);
  // Two confirmations of three: 1585 ms.
  const int64_t learned = h.now;
  h.run_until(learned + 1'584);
  CHECK(h.state_of(3) == MemberState::kSuspect);
  h.run_until(learned + 1'585);
  CHECK(h.state_of(3) == MemberState::kDead);
}

TEST_CASE(
    "membership: a suspected member is pinged with its Suspect record 8 times per shortest "
    "suspicion timeout until it refutes") {
  HandDriven h(5);  // min = 778 ms: a suspect ping every 97 ms
  const Endpoint c = endpoint_of(2);
  const Member c_suspect = record(3, "node-c", 0, MemberState::kSuspect);
  h.node.on_message(endpoint_of(1), msg(MembershipKind::kPing, 2, 1, 1, {c_suspect}), h.now);
  const int64_t learned = h.now;
  // What went to node-c, and when, over the next 600 ms; node-c does not answer.
  std::vector<std::pair<int64_t, MembershipMessage>> to_c;
  auto collect = [&](int64_t at) {
    for (Sent& s : h.transport.take())
      if (s.to == c) to_c.emplace_back(at, std::move(s.message));
  };
  collect(h.now);
  while (h.node.next_deadline_ms() <= learned + 600) {
    h.now = h.node.next_deadline_ms();
    h.node.tick(h.now);
    collect(h.now);
  }
  // The confirmation probe's ping at once (with node-c's Suspect record), then a suspect ping
  // every 97 ms carrying that record and nothing else: no queued news is spent on a member that
  // may be dead.
  REQUIRE_FALSE(to_c.empty());
  CHECK(to_c[0].first == learned);
  CHECK(to_c[0].second.kind == MembershipKind::kPing);
  CHECK(std::count(to_c[0].second.gossip.begin(), to_c[0].second.gossip.end(), c_suspect) == 1);
  std::vector<int64_t> suspect_pings;
  for (size_t i = 1; i < to_c.size(); ++i)  // after the probe's ping
    if (to_c[i].second.kind == MembershipKind::kPing &&
        to_c[i].second.gossip == std::vector<Member>{c_suspect})
      suspect_pings.push_back(to_c[i].first - learned);
  CHECK(suspect_pings == std::vector<int64_t>{97, 194, 291, 388, 485, 582});
  CHECK(h.node.stats().suspect_pings == 6);
  // node-c answers the probe at last, with its refutation: the suspicion ends, and so do the
  // pings.
  h.node.on_message(c,
                    msg(MembershipKind::kAck, 3, to_c[0].second.seq, 3,
                        {record(3, "node-c", 1, MemberState::kAlive)}),
                    h.now);
  CHECK(h.state_of(3) == MemberState::kAlive);
  h.transport.take();
  const uint64_t pinged = h.node.stats().suspect_pings;
  const int64_t refuted = h.now;
  size_t lean_to_c = 0;  // for 500 ms, before any probe of ours could fail again
  while (h.node.next_deadline_ms() <= refuted + 500) {
    h.now = h.node.next_deadline_ms();
    h.node.tick(h.now);
    for (const Sent& sent : h.transport.take())
      if (sent.to == c && sent.message.gossip.size() == 1 && sent.message.gossip[0].id == 3)
        ++lean_to_c;
  }
  CHECK(lean_to_c == 0);
  CHECK(h.node.stats().suspect_pings == pinged);
}

TEST_CASE(
    "membership: with more than 8 members suspected at once, each is pinged proportionally less "
    "often") {
  // 30 members: min = log10(31) s = 1491 ms, a suspect ping every 186 ms at full rate.
  for (const size_t suspects : {size_t{4}, size_t{16}}) {
    CAPTURE(suspects);
    HandDriven h(30);
    std::vector<Member> accused;
    for (size_t i = 0; i < suspects; ++i)
      accused.push_back(record(id_of(2 + i), member_of(2 + i).name, 0, MemberState::kSuspect));
    h.node.on_message(endpoint_of(1), msg(MembershipKind::kPing, 2, 1, 1, accused), h.now);
    const int64_t learned = h.now;
    std::map<NodeId, std::vector<int64_t>> pinged;  // lean suspect pings, by suspect
    h.transport.take();
    while (h.node.next_deadline_ms() <= learned + 900) {
      h.now = h.node.next_deadline_ms();
      h.node.tick(h.now);
      for (const Sent& sent : h.transport.take()) {
        const MembershipMessage& m = sent.message;
        if (m.kind == MembershipKind::kPing && m.gossip.size() == 1 &&
            m.gossip[0].state == MemberState::kSuspect && m.gossip[0].id == m.target)
          pinged[m.target].push_back(h.now - learned);
      }
    }
    REQUIRE(pinged.size() == suspects);
    // After the confirmation probe's ping, the first at 186 ms, then every 186 ms for 4
    // suspects and every 372 ms for 16 (16 / 8 = 2 times as long).
    const std::vector<int64_t> want =
        suspects <= 8 ? std::vector<int64_t>{186, 372, 558, 744} : std::vector<int64_t>{186, 558};
    for (const auto& [id, times] : pinged) {
      CAPTURE(id);
      CHECK(times == want);
    }
  }
}

TEST_CASE("membership: local health: missed nacks slow probing down, answered probes speed it up") {
  MembershipOptions patient;
  patient.suspicion_mult = 100;  // nobody is declared dead during the test
  HandDriven h(5, patient);
  // Nobody answers anything: every probe misses its ack and its three nacks (+3 each).
  std::vector<int64_t> probe_times;
  const int64_t until = h.now + 40 * kSec;
  while (h.node.next_deadline_ms() <= until) {
    h.now = h.node.next_deadline_ms();
    h.node.tick(h.now);
    h.transport.take();
    if (h.node.stats().probes_sent > probe_times.size()) probe_times.push_back(h.now);
  }
  const MembershipStats s = h.node.stats();
  CHECK(s.local_health == 7);  // max_local_health - 1
  CHECK(s.nacks_missed > 0);
  CHECK(s.probes_failed >= 5);
  REQUIRE(probe_times.size() >= 5);
  // Probes start interval * (score + 1) apart: 1 s at first, then longer, at most 8 s.
  CHECK(probe_times[1] - probe_times[0] == 1 * kSec);
  for (size_t i = 2; i < probe_times.size(); ++i) {
    CHECK(probe_times[i] - probe_times[i - 1] >= probe_times[i - 1] - probe_times[i - 2]);
    CHECK(probe_times[i] - probe_times[i - 1] <= 8 * kSec);
  }
  CHECK(probe_times.back() - probe_times[probe_times.size() - 2] == 8 * kSec);

  // Now every ping is answered at once: one step down per answered probe.
  for (int i = 0; i < 200 && h.node.stats().local_health > 0; ++i) {
    h.now = h.node.next_deadline_ms();
    h.node.tick(h.now);
    for (const Sent& sent : h.transport.take())
      if (sent.message.kind == MembershipKind::kPing)
        h.node.on_message(
            sent.to,
            msg(MembershipKind::kAck, sent.message.target, sent.message.seq, sent.message.target),
            h.now + 2);
  }
  CHECK(h.node.stats().local_health == 0);
  CHECK(h.node.stats().probe_acks >= 7);
}

TEST_CASE("membership: leave marks self Left with a larger incarnation and tells members at once") {
  HandDriven h(5);
  h.node.leave(h.now);
  CHECK(h.node.self().state == MemberState::kLeft);
  CHECK(h.node.self().incarnation == 1);
  const std::vector<Sent> sent = h.transport.take();
  CHECK(sent.size() == 4);  // leave_fanout
  for (const Sent& s : sent) {
    const bool carries_left =
        std::any_of(s.message.gossip.begin(), s.message.gossip.end(), [](const Member& g) {
          return g.id == 1 && g.state == MemberState::kLeft && g.incarnation == 1;
        });
    CHECK(carries_left);
  }
  // It still answers pings, with its Left record, but probes no more.
  h.node.on_message(endpoint_of(1), msg(MembershipKind::kPing, 2, 5, 1), h.now);
  const std::vector<Sent> answer = h.transport.take();
  REQUIRE(answer.size() == 1);
  CHECK(answer[0].message.kind == MembershipKind::kAck);
  CHECK(std::any_of(answer[0].message.gossip.begin(), answer[0].message.gossip.end(),
                    [](const Member& g) { return g.id == 1 && g.state == MemberState::kLeft; }));
  const uint64_t probes = h.node.stats().probes_sent;
  h.run_until(h.now + 10 * kSec);
  CHECK(h.node.stats().probes_sent == probes);
}
