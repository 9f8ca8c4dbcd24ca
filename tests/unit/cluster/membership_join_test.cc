// Unit tests of lib/cluster/membership's join and anti-entropy, one node driven by hand through a
// recording transport: join retries and the seeds' answers (kJoin, kJoinReply split over several
// messages), and the anti-entropy pull's interval as the cluster grows and shrinks (unscaled up
// to 32 live members, then memberlist's logarithmic scale), and the digests the pull carries.
// The rest of membership is in membership_test.cc and membership_cluster_test.cc.
//
// Everything is deterministic: time is simulated and randomness comes from seeded generators.
#include "cluster/membership.h"

#include <doctest/doctest.h>

#include "membership_fakes.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

using namespace sluice::cluster;

namespace {

constexpr int64_t kSec = 1'000;

NodeId id_of(size_t index) {
  return static_cast<NodeId>(index + 1);
}

// Up to 65,535 nodes: 10.0.x.y.
Endpoint endpoint_of(size_t index) {
  const size_t n = index + 1;
  return {"10.0." + std::to_string(n >> 8) + "." + std::to_string(n & 0xff), 7946};
}

Member member_of(size_t index) {
  Member m;
  m.id = id_of(index);
  char name[32];
  std::snprintf(name, sizeof name, "node-%04zu", index);
  m.name = name;
  m.host = endpoint_of(index).host;
  m.peer_port = 7946;
  m.check_port = 7947;
  m.admin_port = 7948;
  return m;
}

using sluice::testing::msg;
using sluice::testing::RecordingTransport;
using sluice::testing::Sent;

// Node 0 that joined through node 1 at `start` and knows nodes 1..n-1 as Alive at incarnation 0,
// through kJoinReply messages as a seed sends them.
struct HandDriven {
  RecordingTransport transport;
  Membership node;
  int64_t start = 1'000'000;
  int64_t now = start;
  std::vector<std::pair<int64_t, Sent>> sent_log;  // by step(): when, and what

  explicit HandDriven(size_t n, MembershipOptions options = {}, uint64_t seed = 7)
      : node(member_of(0), options, transport, seed) {
    const Endpoint seed_endpoint = endpoint_of(1);
    node.join(std::span<const Endpoint>(&seed_endpoint, 1), now);
    std::vector<Member> list;
    for (size_t i = 1; i < n; ++i) {
      list.push_back(member_of(i));
      if (list.size() == options.max_join_reply_entries || i + 1 == n) {
        node.on_message(seed_endpoint,
                        msg(MembershipKind::kJoinReply, id_of(1), 0, id_of(0), std::move(list)),
                        now);
        list.clear();
      }
    }
    transport.take();
  }

  // Ticks once, at the next deadline; every member answers every ping at once (so nobody is
  // suspected). True when the tick sent an anti-entropy pull (kJoin to a member, once the join
  // was answered).
  bool step() {
    now = std::max(now, node.next_deadline_ms());
    node.tick(now);
    REQUIRE(node.next_deadline_ms() > now);
    bool pulled = false;
    for (const Sent& s : transport.take()) {
      sent_log.emplace_back(now, s);
      pulled = pulled || s.message.kind == MembershipKind::kJoin;
      if (s.message.kind != MembershipKind::kPing) continue;
      node.on_message(
          s.to, msg(MembershipKind::kAck, s.message.target, s.message.seq, s.message.target), now);
    }
    transport.take();
    return pulled;
  }

  // Advances time to `until`; returns the times of the anti-entropy pulls.
  std::vector<int64_t> run_answering_until(int64_t until) {
    std::vector<int64_t> pulls;
    while (node.next_deadline_ms() <= until)
      if (step()) pulls.push_back(now);
    now = until;
    return pulls;
  }

  // Advances time to the next anti-entropy pull; returns its time.
  int64_t next_pull() {
    while (!step()) {
    }
    return now;
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Join

TEST_CASE("membership: join retries every interval, then reports that no seed answered") {
  RecordingTransport t;
  Membership node(member_of(0), {}, t, 3);
  CHECK(node.join_state() == JoinState::kNotStarted);
  const std::vector<Endpoint> seeds = {endpoint_of(0), endpoint_of(5), endpoint_of(6)};
  int64_t now = 0;
  node.join(seeds, now);
  CHECK(node.join_state() == JoinState::kJoining);
  // Our own endpoint is skipped; the two others get kJoin carrying our record.
  REQUIRE(t.sent.size() == 2);
  CHECK(t.sent[0].message.kind == MembershipKind::kJoin);
  CHECK(t.sent[0].message.gossip.at(0) == member_of(0));
  auto run_until = [&](int64_t until) {
    while (node.next_deadline_ms() <= until) {
      now = node.next_deadline_ms();
      node.tick(now);
    }
  };
  run_until(10 * kSec);
  CHECK(t.sent.size() == 10);  // 5 rounds to 2 seeds, 1 s apart
  CHECK(node.join_state() == JoinState::kNoSeedAnswered);
  // Alone, it keeps trying at the slower rejoin interval (30 s).
  run_until(40 * kSec);
  CHECK(t.sent.size() == 12);
  run_until(64 * kSec);
  CHECK(t.sent.size() == 12);
  run_until(65 * kSec);
  CHECK(t.sent.size() == 14);

  // Seeds that are all this node: nothing to send.
  RecordingTransport t2;
  Membership lonely(member_of(0), {}, t2, 3);
  lonely.join(std::vector<Endpoint>{endpoint_of(0)}, 0);
  CHECK(lonely.join_state() == JoinState::kNoSeedAnswered);
  CHECK(t2.sent.empty());
}

TEST_CASE("membership: a seed answers kJoin with every member it knows and gossips the newcomer") {
  HandDriven h(3);
  Member joiner = member_of(5);
  h.node.on_message(endpoint_of(5), msg(MembershipKind::kJoin, joiner.id, 0, 0, {joiner}), h.now);
  const std::vector<Sent> sent = h.transport.take();
  const auto reply = std::find_if(sent.begin(), sent.end(), [](const Sent& s) {
    return s.message.kind == MembershipKind::kJoinReply;
  });
  REQUIRE(reply != sent.end());
  CHECK(reply->to == endpoint_of(5));
  CHECK(reply->message.gossip.size() == 4);  // self, node-b, node-c and the joiner
  CHECK(h.node.find(joiner.id).value().state == MemberState::kAlive);
  // Gossiped at once to other members.
  const bool gossiped = std::any_of(sent.begin(), sent.end(), [&](const Sent& s) {
    return s.message.kind == MembershipKind::kPing && s.to != endpoint_of(5) &&
           std::find(s.message.gossip.begin(), s.message.gossip.end(), joiner) !=
               s.message.gossip.end();
  });
  CHECK(gossiped);
  CHECK(h.node.stats().joins_answered == 1);
}

TEST_CASE(
    "membership: a large member list goes out in several kJoinReply, and the joiner merges them "
    "all") {
  MembershipOptions small;
  small.max_join_reply_entries = 4;
  HandDriven seed(11, small);  // node-a knows node-b .. node-k: 11 members
  RecordingTransport t;
  Membership joiner(member_of(20), small, t, 5);
  const Endpoint seed_endpoint = endpoint_of(0);
  joiner.join(std::span<const Endpoint>(&seed_endpoint, 1), seed.now);
  REQUIRE(t.sent.size() == 1);
  seed.node.on_message(endpoint_of(20), t.take()[0].message, seed.now);
  std::vector<Sent> replies;
  for (Sent& s : seed.transport.take())
    if (s.message.kind == MembershipKind::kJoinReply) replies.push_back(std::move(s));
  REQUIRE(replies.size() == 3);  // 12 members with the joiner, 4 per message
  for (const Sent& r : replies) {
    CHECK(r.message.gossip.size() <= 4);
    joiner.on_message(seed_endpoint, r.message, seed.now);
  }
  CHECK(joiner.join_state() == JoinState::kJoined);
  CHECK(joiner.members().size() == 12);  // the seed, its 10 members, and the joiner
  CHECK(joiner.stats().join_replies == 3);
}

// ---------------------------------------------------------------------------------------------
// Anti-entropy

TEST_CASE("membership: the anti-entropy interval is unscaled up to 32 live members, then log2") {
  const MembershipOptions o;  // sync_interval_ms = 30 s
  struct Row {
    size_t live;
    int64_t interval_ms;
  };
  const Row rows[] = {{0, 30 * kSec},    {1, 30 * kSec},    {3, 30 * kSec},     {10, 30 * kSec},
                      {32, 30 * kSec},   {33, 60 * kSec},   {64, 60 * kSec},    {65, 90 * kSec},
                      {100, 90 * kSec},  {128, 90 * kSec},  {129, 120 * kSec},  {256, 120 * kSec},
                      {512, 150 * kSec}, {513, 180 * kSec}, {1000, 180 * kSec}, {1024, 180 * kSec},
                      {1025, 210 * kSec}};
  for (const Row& row : rows) {
    CAPTURE(row.live);
    CHECK(anti_entropy_interval_ms(o, row.live) == row.interval_ms);
  }
  // It scales the configured interval.
  MembershipOptions fast;
  fast.sync_interval_ms = 1'000;
  CHECK(anti_entropy_interval_ms(fast, 20) == 1'000);
  CHECK(anti_entropy_interval_ms(fast, 100) == 3'000);
}

TEST_CASE(
    "membership: a node pulls the member list first 30 to 60 s after start, then every scaled "
    "interval") {
  // 10 and 32 members: exactly as before the scale (every 30 s); 33, 100 and 1000: x2, x3, x6.
  for (const size_t n : {size_t{10}, size_t{32}, size_t{33}, size_t{100}, size_t{1000}}) {
    CAPTURE(n);
    HandDriven h(n);
    const int64_t interval = anti_entropy_interval_ms(MembershipOptions{}, n);
    const std::vector<int64_t> pulls = h.run_answering_until(h.start + 60 * kSec + 4 * interval);
    REQUIRE(pulls.size() == 5);  // the first, then 4 intervals
    CHECK(pulls[0] >= h.start + 30 * kSec);
    CHECK(pulls[0] < h.start + 60 * kSec);
    for (size_t i = 1; i < pulls.size(); ++i)
      CHECK(pulls[i] - pulls[i - 1] == interval);
    // Nobody was suspected: the interval was computed over all n members every time.
    CHECK(h.node.stats().alive == n);
    CHECK(h.node.stats().suspicions_raised == 0);
  }
}

TEST_CASE("membership: the anti-entropy interval follows the live members as the cluster shrinks") {
  HandDriven h(40);  // 40 live members: every 60 s
  std::vector<int64_t> pulls = h.run_answering_until(h.start + 60 * kSec + 60 * kSec);
  REQUIRE(pulls.size() == 2);
  CHECK(pulls[1] - pulls[0] == 60 * kSec);
  // 10 members leave (their Left records, gossiped by node 1): 30 live members, so the pull after
  // the next one comes 30 s after it. The next one was scheduled before they left.
  std::vector<Member> left;
  for (size_t i = 30; i < 40; ++i) {
    Member m = member_of(i);
    m.incarnation = 1;
    m.state = MemberState::kLeft;
    left.push_back(m);
  }
  h.node.on_message(endpoint_of(1), msg(MembershipKind::kPing, id_of(1), 77, id_of(0), left),
                    h.now);
  h.transport.take();
  REQUIRE(h.node.stats().left == 10);
  const int64_t last = pulls.back();
  pulls = h.run_answering_until(last + 60 * kSec + 30 * kSec);
  REQUIRE(pulls.size() == 2);
  CHECK(pulls[0] == last + 60 * kSec);
  CHECK(pulls[1] == last + 60 * kSec + 30 * kSec);
}

TEST_CASE(
    "membership: a pull that mends the view is followed by the next at the unscaled interval") {
  HandDriven h(100);  // every 90 s
  const int64_t first = h.next_pull();
  // The member pulled from knew one member more: the next pull 30 s after this one.
  const Endpoint pulled = endpoint_of(1);
  h.node.on_message(
      pulled, msg(MembershipKind::kJoinReply, id_of(1), 0, id_of(0), {member_of(150)}), h.now);
  REQUIRE(h.node.stats().alive == 101);
  const int64_t second = h.next_pull();
  CHECK(second == first + 30 * kSec);
  // Nothing new this time: back to the scaled interval.
  h.node.on_message(pulled, msg(MembershipKind::kJoinReply, id_of(1), 0, id_of(0), {member_of(5)}),
                    h.now);
  const int64_t third = h.next_pull();
  CHECK(third == second + 90 * kSec);
  // News that comes long after the pull (not its answer) does not bring the next one forward.
  h.run_answering_until(third + 10 * kSec);
  h.node.on_message(
      pulled, msg(MembershipKind::kJoinReply, id_of(1), 0, id_of(0), {member_of(151)}), h.now);
  CHECK(h.next_pull() == third + 90 * kSec);
}

TEST_CASE(
    "membership: above 32 live members a death rides on every message for one sync interval") {
  // 33 members with the dead one: 32 live after the death, so not above 32.
  for (const size_t n : {size_t{20}, size_t{33}, size_t{34}, size_t{100}}) {
    CAPTURE(n);
    HandDriven h(n);
    h.run_answering_until(h.start + 5 * kSec);
    // Node 1 tells us the last member died.
    const NodeId dead = id_of(n - 1);
    Member record = member_of(n - 1);
    record.state = MemberState::kDead;
    h.node.on_message(endpoint_of(1), msg(MembershipKind::kPing, id_of(1), 9, id_of(0), {record}),
                      h.now);
    const int64_t learned = h.now;
    REQUIRE(h.node.find(dead)->state == MemberState::kDead);
    h.sent_log.clear();
    h.run_answering_until(learned + 40 * kSec);
    // The gossip queue is done with it within a second or two; count the messages to live
    // members that carry it after that, within the interval and after it (a kJoin carries only
    // its sender).
    size_t messages = 0, within = 0, after = 0;
    for (const auto& [at, s] : h.sent_log) {
      if (at < learned + 5 * kSec || s.to == endpoint_of(n - 1) ||
          s.message.kind == MembershipKind::kJoin)
        continue;
      const bool carries = std::any_of(s.message.gossip.begin(), s.message.gossip.end(),
                                       [dead](const Member& m) { return m.id == dead; });
      if (at < learned + 30 * kSec) {
        ++messages;
        within += carries ? 1 : 0;
      } else {
        after += carries ? 1 : 0;
      }
    }
    CHECK(messages > 20);  // probes, about one a second
    if (n - 1 > 32) {
      CHECK(within == messages);
    } else {
      CHECK(within == 0);  // as before: the queue's retransmissions only
    }
    CHECK(after == 0);
  }
}

TEST_CASE("membership: more recent deaths than fit in one message all ride, in turn") {
  HandDriven h(100);
  h.run_answering_until(h.start + 5 * kSec);
  // 20 members die at once (a rack), told by node 1 in three messages.
  std::vector<Member> dead;
  for (size_t i = 80; i < 100; ++i) {
    Member m = member_of(i);
    m.state = MemberState::kDead;
    dead.push_back(m);
  }
  for (size_t first = 0; first < dead.size(); first += 8) {
    const std::vector<Member> part(
        dead.begin() + static_cast<std::ptrdiff_t>(first),
        dead.begin() + static_cast<std::ptrdiff_t>(std::min(dead.size(), first + 8)));
    h.node.on_message(endpoint_of(1), msg(MembershipKind::kPing, id_of(1), 9, id_of(0), part),
                      h.now);
  }
  const int64_t learned = h.now;
  REQUIRE(h.node.stats().dead == 20);
  h.sent_log.clear();
  h.run_answering_until(learned + 30 * kSec);
  // After the queue is done with them: every one of them rode on some message, 8 at most each.
  std::map<NodeId, size_t> rode;
  for (const auto& [at, s] : h.sent_log) {
    if (at < learned + 10 * kSec) continue;
    CHECK(s.message.gossip.size() <= 8);
    for (const Member& m : s.message.gossip)
      if (m.state == MemberState::kDead) ++rode[m.id];
  }
  CHECK(rode.size() == 20);
}

// ---------------------------------------------------------------------------------------------
// Anti-entropy digests: the pull carries the puller's view digest, the answer only what differs

namespace {

// A pull from node `from` whose view is `view` (itself included), as Membership::sync sends it.
MembershipMessage pull_from(size_t from, const std::vector<Member>& view) {
  MembershipMessage m = msg(MembershipKind::kJoin, id_of(from), 0, 0, {member_of(from)});
  m.view_digest = view_digest(view, view_buckets(view.size()));
  return m;
}

std::vector<Sent> replies_in(std::vector<Sent> sent) {
  std::erase_if(sent, [](const Sent& s) { return s.message.kind != MembershipKind::kJoinReply; });
  return sent;
}

}  // namespace

TEST_CASE("membership: a view digest is order-free and changes with any id, incarnation or state") {
  std::vector<Member> view;
  for (size_t i = 0; i < 40; ++i)
    view.push_back(member_of(i));
  CHECK(view_buckets(1) == 1);
  CHECK(view_buckets(16) == 1);
  CHECK(view_buckets(17) == 2);
  CHECK(view_buckets(40) == 3);
  CHECK(view_buckets(1'000) == 63);
  CHECK(view_buckets(5'000) == kMaxViewBuckets);
  const std::vector<uint64_t> digest = view_digest(view, 3);
  REQUIRE(digest.size() == 3);
  std::vector<Member> reversed(view.rbegin(), view.rend());
  CHECK(view_digest(reversed, 3) == digest);
  // One member's incarnation, or its state, changes its bucket's digest and no other.
  for (const auto change :
       {+[](Member& m) { ++m.incarnation; }, +[](Member& m) { m.state = MemberState::kSuspect; },
        +[](Member& m) { m.state = MemberState::kLeft; }}) {
    std::vector<Member> other = view;
    change(other[7]);  // id 8: bucket 2
    const std::vector<uint64_t> d = view_digest(other, 3);
    CHECK(d[0] == digest[0]);
    CHECK(d[1] == digest[1]);
    CHECK(d[2] != digest[2]);
  }
  // A member missing, or one more.
  std::vector<Member> fewer(view.begin(), view.end() - 1);
  CHECK(view_digest(fewer, 3) != digest);
  std::vector<Member> more = view;
  more.push_back(member_of(40));
  CHECK(view_digest(more, 3) != digest);
}

TEST_CASE("membership: a pull whose digest matches the view is answered with no member") {
  HandDriven h(40);
  h.node.on_message(endpoint_of(1), pull_from(1, h.node.members()), h.now);
  const std::vector<Sent> replies = replies_in(h.transport.take());
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].to == endpoint_of(1));
  CHECK(replies[0].message.gossip.empty());
  CHECK(h.node.stats().joins_answered == 1);
  CHECK(h.node.stats().pulls_in_sync == 1);
  CHECK(h.node.stats().pull_entries_sent == 0);
}

TEST_CASE(
    "membership: a pull whose view differs in one incarnation gets the members of that bucket "
    "only") {
  HandDriven h(40);  // 40 members: 3 buckets
  std::vector<Member> view = h.node.members();
  // The puller holds node 9 (id 10, bucket 1) one incarnation behind what node 0 knows.
  Member newer = member_of(9);
  newer.incarnation = 4;
  h.node.on_message(endpoint_of(2), msg(MembershipKind::kPing, id_of(2), 1, id_of(0), {newer}),
                    h.now);
  REQUIRE(h.node.find(id_of(9))->incarnation == 4);
  h.transport.take();
  h.node.on_message(endpoint_of(1), pull_from(1, view), h.now);
  const std::vector<Sent> replies = replies_in(h.transport.take());
  REQUIRE(replies.size() == 1);
  std::vector<NodeId> ids;
  for (const Member& m : replies[0].message.gossip) {
    CHECK(m.id % 3 == 1);
    ids.push_back(m.id);
  }
  CHECK(ids.size() == 14);  // ids 1, 4, ..., 37, 40 in bucket 1
  CHECK(std::count(replies[0].message.gossip.begin(), replies[0].message.gossip.end(), newer) == 1);
  CHECK(h.node.stats().pulls_in_sync == 0);
  CHECK(h.node.stats().pull_entries_sent == 14);
}

TEST_CASE(
    "membership: a pull without a digest, as a node older than digests sends, gets every "
    "member") {
  HandDriven h(40);
  MembershipMessage old_pull = pull_from(1, h.node.members());
  old_pull.view_digest.clear();
  h.node.on_message(endpoint_of(1), old_pull, h.now);
  size_t entries = 0;
  for (const Sent& r : replies_in(h.transport.take()))
    entries += r.message.gossip.size();
  CHECK(entries == 40);
  CHECK(h.node.stats().pulls_in_sync == 0);
}

TEST_CASE(
    "membership: the anti-entropy pull carries the puller's digest, merges a partial answer, and "
    "an answer with no member changes nothing") {
  HandDriven puller(40);
  // The answering member: node 1, which knows the same 40 members, and node 7 at incarnation 3.
  RecordingTransport t;
  Membership peer(member_of(1), {}, t, 11);
  {
    const Endpoint e = endpoint_of(0);
    peer.join(std::span<const Endpoint>(&e, 1), puller.now);
    std::vector<Member> list;
    for (size_t i = 0; i < 40; ++i)
      if (i != 1) list.push_back(member_of(i));
    peer.on_message(e, msg(MembershipKind::kJoinReply, id_of(0), 0, id_of(1), list), puller.now);
    Member seven = member_of(7);
    seven.incarnation = 3;
    peer.on_message(e, msg(MembershipKind::kPing, id_of(0), 1, id_of(1), {seven}), puller.now);
    t.take();
  }
  // The joins (in the constructor) carried no digest; the pull does.
  const int64_t at = puller.next_pull();
  const auto pull =
      std::find_if(puller.sent_log.begin(), puller.sent_log.end(), [&](const auto& s) {
        return s.first == at && s.second.message.kind == MembershipKind::kJoin;
      });
  REQUIRE(pull != puller.sent_log.end());
  const MembershipMessage& m = pull->second.message;
  CHECK(m.view_digest == view_digest(puller.node.members(), view_buckets(40)));
  // Node 1 answers (whichever member the pull went to): bucket 8 % 3 = 2 only.
  peer.on_message(endpoint_of(0), m, puller.now);
  std::vector<Sent> replies = replies_in(t.take());
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].message.gossip.size() == 13);
  const uint64_t applied = puller.node.stats().updates_applied;
  puller.node.on_message(endpoint_of(1), replies[0].message, puller.now);
  CHECK(puller.node.find(id_of(7))->incarnation == 3);
  CHECK(puller.node.stats().updates_applied == applied + 1);
  // The next pull: the views match now, and the empty answer changes nothing.
  const int64_t at2 = puller.next_pull();
  const auto pull2 =
      std::find_if(puller.sent_log.begin(), puller.sent_log.end(), [&](const auto& s) {
        return s.first == at2 && s.second.message.kind == MembershipKind::kJoin;
      });
  REQUIRE(pull2 != puller.sent_log.end());
  peer.on_message(endpoint_of(0), pull2->second.message, puller.now);
  replies = replies_in(t.take());
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].message.gossip.empty());
  const MembershipStats before = puller.node.stats();
  puller.node.on_message(endpoint_of(1), replies[0].message, puller.now);
  CHECK(puller.node.stats().updates_applied == before.updates_applied);
  CHECK(puller.node.stats().join_replies == before.join_replies + 1);
  CHECK(puller.node.stats().ignored_of(IgnoredReason::kUnexpectedJoinReply) == 0);
  CHECK(peer.stats().pulls_in_sync == 1);
}
