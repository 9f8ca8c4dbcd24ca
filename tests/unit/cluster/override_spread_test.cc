// Unit tests of lib/cluster/override_spread: what a node sends to whom to spread overrides. A
// local write is pushed to every live member; digests go to members newly live at once and to
// one random member per interval; a differing digest is answered with the whole table, split
// over datagrams, and a full table that asked for it with ours when the tables still differ; a
// whole table goes to one member at most every full_gap_ms. Two and three tables that start
// apart end equal through these answers alone. Time is a parameter; randomness is seeded.
#include "cluster/override_spread.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace sluice;
using cluster::NodeId;
using cluster::OverrideAnswer;
using cluster::OverrideDigest;
using cluster::OverrideOutbox;
using cluster::OverrideRecord;
using cluster::OverrideSpread;
using cluster::OverrideSyncKind;
using cluster::OverrideSyncMessage;
using cluster::OverrideTable;

constexpr int64_t kNow = 1'700'000'000'000;

OverrideRecord set_of(const std::string& user, uint64_t requests, int64_t ms, uint16_t node) {
  OverrideRecord r;
  r.value.domain = "api";
  r.value.entries = {{"user", user}};
  rules::Limit l;
  REQUIRE(rules::parse_limit(std::to_string(requests) + "/1m", 0, l).ok());
  r.value.limits.push_back(l);
  r.version = {ms, node};
  return r;
}

struct Sent {
  NodeId to;
  OverrideSyncMessage m;
};

struct Recorder {
  std::vector<Sent> sent;
  std::vector<NodeId> refuse;  // the send callback fails for these
  OverrideSpread::SendFn fn() {
    return [this](NodeId to, const OverrideSyncMessage& m) {
      if (std::find(refuse.begin(), refuse.end(), to) != refuse.end()) return false;
      sent.push_back({to, m});
      return true;
    };
  }
};

OverrideSyncMessage of_kind(OverrideSyncKind kind, OverrideDigest digest, bool want_full = false) {
  OverrideSyncMessage m;
  m.kind = kind;
  m.digest = digest;
  m.want_full = want_full;
  return m;
}

}  // namespace

TEST_CASE("override_spread: a local write is pushed to every live member, and counted") {
  Recorder rec;
  rec.refuse = {4};
  OverrideSpread spread({}, rec.fn(), 1);
  spread.start(kNow);
  const std::vector<NodeId> live = {2, 3, 4, 5};
  spread.on_local_write(set_of("u1", 10, kNow, 1), live);
  REQUIRE(rec.sent.size() == 3);
  for (const Sent& s : rec.sent) {
    CHECK(s.m.kind == OverrideSyncKind::kPush);
    CHECK(s.m.records.size() == 1);
  }
  CHECK(rec.sent[0].to == 2);
  CHECK(rec.sent[2].to == 5);
  CHECK(spread.stats().pushes_sent == 3);  // not the refused one
  CHECK(spread.stats().records_sent == 3);
}

TEST_CASE("override_spread: digests go at once to members newly live, and to one per interval") {
  Recorder rec;
  OverrideSpread spread({}, rec.fn(), 7);
  spread.start(kNow);
  // Everyone is new at the first tick: all of them, in id order; no random round yet.
  CHECK(spread.digest_targets(kNow + 100, std::vector<NodeId>{5, 2, 3}) ==
        std::vector<NodeId>{2, 3, 5});
  CHECK(spread.digest_targets(kNow + 200, std::vector<NodeId>{5, 2, 3}).empty());
  // One interval after start: one member at random, then none until the next interval.
  const std::vector<NodeId> round =
      spread.digest_targets(kNow + 1'000, std::vector<NodeId>{5, 2, 3});
  REQUIRE(round.size() == 1);
  CHECK((round[0] == 2 || round[0] == 3 || round[0] == 5));
  CHECK(spread.digest_targets(kNow + 1'900, std::vector<NodeId>{5, 2, 3}).empty());
  // A member that comes (back): at once. One that went and came back: again.
  CHECK(spread.digest_targets(kNow + 1'950, std::vector<NodeId>{5, 2, 3, 9}) ==
        std::vector<NodeId>{9});
  CHECK(spread.digest_targets(kNow + 1'960, std::vector<NodeId>{5, 3, 9}).empty());
  CHECK(spread.digest_targets(kNow + 1'970, std::vector<NodeId>{5, 2, 3, 9}) ==
        std::vector<NodeId>{2});
  // Nobody live: nothing, and the round waits for someone.
  CHECK(spread.digest_targets(kNow + 5'000, std::vector<NodeId>{}).empty());
  CHECK(spread.digest_targets(kNow + 5'100, std::vector<NodeId>{3}) == std::vector<NodeId>{3, 3});

  // Rounds pick every member over time (the generator is seeded: deterministic).
  std::map<NodeId, int> picked;
  for (int i = 1; i <= 300; ++i) {
    for (const NodeId to :
         spread.digest_targets(kNow + 10'000 + i * 1'000, std::vector<NodeId>{2, 3, 5}))
      ++picked[to];
  }
  CHECK(picked.size() == 3);
  CHECK(picked[2] + picked[3] + picked[5] == 300 + 2);  // 2 and 5 were new again
}

TEST_CASE("override_spread: what a digest or a full table calls for") {
  const OverrideDigest ours{3, 111};
  const OverrideDigest theirs{2, 222};
  CHECK(answer_to(of_kind(OverrideSyncKind::kDigest, ours), ours) == OverrideAnswer::kNothing);
  CHECK(answer_to(of_kind(OverrideSyncKind::kDigest, theirs), ours) ==
        OverrideAnswer::kFullWantBack);
  CHECK(answer_to(of_kind(OverrideSyncKind::kFull, theirs, true), ours) == OverrideAnswer::kFull);
  CHECK(answer_to(of_kind(OverrideSyncKind::kFull, ours, true), ours) == OverrideAnswer::kNothing);
  CHECK(answer_to(of_kind(OverrideSyncKind::kFull, theirs, false), ours) ==
        OverrideAnswer::kNothing);
  CHECK(answer_to(of_kind(OverrideSyncKind::kPush, theirs), ours) == OverrideAnswer::kNothing);
}

TEST_CASE("override_spread: a whole table is split over datagrams, want_full on the last only") {
  std::vector<OverrideRecord> records;
  for (int i = 0; i < 5; ++i)
    records.push_back(set_of("u" + std::to_string(i), static_cast<uint64_t>(10 + i), kNow, 1));
  const OverrideDigest own{5, 42};
  cluster::PeerLimits limits;
  limits.max_override_records = 2;
  const OverrideOutbox out = full_table(7, records, own, true, limits);
  CHECK(out.full_table);
  REQUIRE(out.messages.size() == 3);
  size_t total = 0;
  for (size_t i = 0; i < out.messages.size(); ++i) {
    const auto& [to, m] = out.messages[i];
    CHECK(to == 7);
    CHECK(m.kind == OverrideSyncKind::kFull);
    CHECK(m.digest == own);
    CHECK(m.want_full == (i + 1 == out.messages.size()));
    total += m.records.size();
  }
  CHECK(total == 5);
  // An empty table is still one message: it carries the digest and the request.
  const OverrideOutbox empty = full_table(7, {}, OverrideDigest{}, true, limits);
  REQUIRE(empty.messages.size() == 1);
  CHECK(empty.messages[0].second.records.empty());
  CHECK(empty.messages[0].second.want_full);
  // Without the request, no part asks.
  for (const auto& [to, m] : full_table(7, records, own, false, limits).messages)
    CHECK_FALSE(m.want_full);
}

TEST_CASE("override_spread: a whole table goes to one member at most every full_gap_ms") {
  Recorder rec;
  OverrideSpread spread({}, rec.fn(), 1);
  spread.start(kNow);
  const std::vector<OverrideRecord> records = {set_of("u1", 10, kNow, 1)};
  const OverrideDigest own{1, 9};
  spread.send(full_table(2, records, own, true, {}), kNow);
  spread.send(full_table(2, records, own, true, {}), kNow + 249);  // too soon
  spread.send(full_table(3, records, own, true, {}), kNow + 249);  // another member: fine
  spread.send(full_table(2, records, own, true, {}), kNow + 250);
  spread.send(cluster::digest_message(2, own), kNow + 251);  // digests are not held back
  REQUIRE(rec.sent.size() == 4);
  CHECK(rec.sent[0].to == 2);
  CHECK(rec.sent[1].to == 3);
  CHECK(rec.sent[2].to == 2);
  CHECK(rec.sent[3].m.kind == OverrideSyncKind::kDigest);
  CHECK(spread.stats().full_sent == 3);
  CHECK(spread.stats().digests_sent == 1);
  CHECK(spread.stats().records_sent == 3);
}

namespace {

// A node of the exchange below: a table and the spread, the table side run inline.
struct Peer {
  NodeId id;
  OverrideTable table;
  Recorder rec;
  OverrideSpread spread;
  explicit Peer(NodeId i) : id(i), spread({}, rec.fn(), i) { spread.start(kNow); }

  void receive(const OverrideSyncMessage& in, int64_t now) {
    for (const OverrideRecord& r : in.records)
      table.merge(r, now);
    const OverrideDigest own = table.digest(now);
    const OverrideAnswer a = answer_to(in, own);
    if (a == OverrideAnswer::kNothing) return;
    spread.send(
        full_table(in.from, table.records(now), own, a == OverrideAnswer::kFullWantBack, {}), now);
  }
};

// Delivers every message sent until none is left; returns how many were delivered.
size_t deliver_all(std::vector<Peer*> peers, int64_t now) {
  size_t delivered = 0;
  for (bool any = true; any;) {
    any = false;
    for (Peer* from : peers) {
      std::vector<Sent> out = std::exchange(from->rec.sent, {});
      for (Sent& s : out) {
        s.m.from = from->id;
        for (Peer* to : peers)
          if (to->id == s.to) to->receive(s.m, now);
        ++delivered;
        any = true;
      }
    }
  }
  return delivered;
}

}  // namespace

TEST_CASE("override_spread: two tables that differ both ways are equal after one digest") {
  Peer a(1), b(2);
  a.table.merge(set_of("u1", 10, kNow - 5, 1), kNow);
  a.table.merge(set_of("u2", 20, kNow - 5, 1), kNow);
  b.table.merge(set_of("u2", 25, kNow - 1, 2), kNow);  // newer than a's
  b.table.merge(set_of("u3", 30, kNow - 5, 2), kNow);
  REQUIRE(a.table.digest(kNow) != b.table.digest(kNow));
  // a's digest to b: b answers with its table (asking for a's), a merges and answers with its
  // own, b merges. Three messages, then nothing: the exchange ends.
  a.spread.send(cluster::digest_message(2, a.table.digest(kNow)), kNow);
  CHECK(deliver_all({&a, &b}, kNow) == 3);
  CHECK(a.table.digest(kNow) == b.table.digest(kNow));
  CHECK(a.table.size() == 3);
  CHECK(a.table.find(cluster::record_id(set_of("u2", 1, 0, 0)))->version.node == 2);
  // Equal digests call for nothing.
  a.spread.send(cluster::digest_message(2, a.table.digest(kNow)), kNow + 1'000);
  CHECK(deliver_all({&a, &b}, kNow + 1'000) == 1);
}

TEST_CASE("override_spread: a write pushed to three nodes, one push lost, is repaired by digest") {
  Peer a(1), b(2), c(3);
  const OverrideRecord w = set_of("u9", 9, kNow, 1);
  a.table.merge(w, kNow);
  a.spread.on_local_write(w, std::vector<NodeId>{2, 3});
  // The push to 3 is lost.
  std::erase_if(a.rec.sent, [](const Sent& s) { return s.to == 3; });
  deliver_all({&a, &b, &c}, kNow);
  CHECK(b.table.digest(kNow) == a.table.digest(kNow));
  CHECK(c.table.size() == 0);
  // c's next digest round, whoever it picks, brings the record.
  c.spread.digest_targets(kNow, std::vector<NodeId>{1, 2});  // both new: digests to 1 and 2
  for (const NodeId to : c.spread.digest_targets(kNow + 1'000, std::vector<NodeId>{1, 2}))
    c.spread.send(cluster::digest_message(to, c.table.digest(kNow)), kNow + 1'000);
  deliver_all({&a, &b, &c}, kNow + 1'000);
  CHECK(c.table.digest(kNow) == a.table.digest(kNow));
}
