// Unit tests of lib/cluster/peer_codec: round trips of every message kind, each rejection reason
// (tag, size, version, kind, sender, clock skew, replay window, payload bounds), hand-crafted
// messages under a valid tag, a seeded random search for crashes or forged acceptances, and the
// no-allocation promise once warm.
//
// Hand-crafted messages follow `capnp compile -ocapnp schema/peer.capnp`: Envelope is 4 data
// words and 1 pointer (version ^ 1 in bits 0-15, sender 16-31, kind 32-47; bootId, seq, sentMs in
// words 1-3); Membership 1 data word and 1 pointer; Member 2 data words and 2 pointers.
// Randomness comes from seeded std::mt19937_64.
#include "cluster/peer_codec.h"

#include <doctest/doctest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "peer.capnp.h"

#include "alloc_counter.h"  // this binary counts its heap allocations
#include "capnp_words.h"

namespace {

using namespace sluice::cluster;
using sluice::engine::RemoteTotal;
using sluice::window::WindowSpec;
namespace ps = sluice::schema::peer;
using Bytes = std::vector<uint8_t>;

constexpr std::string_view kSecret = "correct horse battery staple";
constexpr int64_t kNow = 1'700'000'000'000;  // 2023-11-14 22:13:20 UTC
constexpr uint64_t kBootA = 1'699'999'000'000;
constexpr NodeId kA = 1;
constexpr NodeId kB = 2;

Member member(NodeId id, std::string name, std::string host, MemberState state) {
  Member m;
  m.id = id;
  m.name = std::move(name);
  m.host = std::move(host);
  m.peer_port = static_cast<uint16_t>(7000 + id);
  m.check_port = static_cast<uint16_t>(8000 + id);
  m.admin_port = static_cast<uint16_t>(9000 + id);
  m.incarnation = 40'000u + id;
  m.state = state;
  return m;
}

MembershipMessage sample_membership(MembershipKind kind) {
  MembershipMessage m;
  m.kind = kind;
  m.from = kA;
  m.seq = 0xfeedbeef;
  m.target = 65'535;
  m.gossip = {
      member(1, "node-a", "10.0.0.1", MemberState::kAlive),
      member(7, "a-rather-long-node-name.eu-west-1", "2001:db8::7", MemberState::kSuspect),
      member(9, std::string(kMaxPeerNameBytes, 'n'), "203.0.113.255", MemberState::kDead),
      member(65'535, "node-z", "::1", MemberState::kLeft),
  };
  return m;
}

SyncBatch sample_sync() {
  SyncBatch b;
  b.from = kA;
  b.handoff = true;
  b.totals = {
      {0xffff'ffff'ffff'ffffULL, WindowSpec{60'000, 60'000}, 1, 28'333'333, 17},
      {42, WindowSpec{86'400'000, 60'000}, 65'535, -5, 0xffff'ffffu},
      {7, WindowSpec{1'000, 10}, 3, std::numeric_limits<int64_t>::max(), 1},
  };
  return b;
}

void check_same(const MembershipMessage& got, const MembershipMessage& want) {
  CHECK(got.kind == want.kind);
  CHECK(got.from == want.from);
  CHECK(got.seq == want.seq);
  CHECK(got.target == want.target);
  REQUIRE(got.gossip.size() == want.gossip.size());
  for (size_t i = 0; i < want.gossip.size(); ++i) {
    CAPTURE(i);
    CHECK(got.gossip[i] == want.gossip[i]);
  }
  CHECK(got.view_digest == want.view_digest);
  CHECK(got.unknown_recipient == want.unknown_recipient);
}

void check_same(const SyncBatch& got, const SyncBatch& want) {
  CHECK(got.from == want.from);
  CHECK(got.handoff == want.handoff);
  REQUIRE(got.totals.size() == want.totals.size());
  for (size_t i = 0; i < want.totals.size(); ++i) {
    CAPTURE(i);
    const RemoteTotal& g = got.totals[i];
    const RemoteTotal& w = want.totals[i];
    CHECK(g.counter == w.counter);
    CHECK(g.spec == w.spec);
    CHECK(g.node == w.node);
    CHECK(g.bucket == w.bucket);
    CHECK(g.total == w.total);
  }
}

Bytes seal(PeerCodec& codec, const MembershipMessage& m, int64_t now = kNow) {
  Bytes out;
  REQUIRE(codec.seal(m, now, out) == PeerError::kOk);
  return out;
}

Bytes seal(PeerCodec& codec, const SyncBatch& b, int64_t now = kNow) {
  Bytes out;
  REQUIRE(codec.seal(b, now, out) == PeerError::kOk);
  return out;
}

// ---- envelopes built with Cap'n Proto's own builder, signed with a codec's key --------------

// Builds an envelope from `a`'s point of view (sender kA, boot kBootA, the given seq, sent at
// kNow) and lets `fill` change anything; returns the message bytes, unsigned.
Bytes build_envelope(uint64_t seq, const std::function<void(ps::Envelope::Builder)>& fill) {
  capnp::MallocMessageBuilder builder;
  auto env = builder.initRoot<ps::Envelope>();
  env.setSender(kA);
  env.setBootId(kBootA);
  env.setSeq(seq);
  env.setSentMs(kNow);
  env.setKind(ps::Kind::MEMBERSHIP);
  fill(env);
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  return Bytes(bytes.begin(), bytes.end());
}

// A membership payload with `n` gossip entries named node-<i>.
void fill_gossip(ps::Envelope::Builder env, unsigned int n) {
  auto m = env.getPayload().initAs<ps::Membership>();
  m.setKind(ps::MembershipKind::JOIN_REPLY);
  auto list = m.initGossip(n);
  for (unsigned int i = 0; i < n; ++i) {
    const std::string name = "node-" + std::to_string(i);
    list[i].setId(static_cast<uint16_t>(i));
    list[i].setName(name);
    list[i].setHost("10.0.0.1");
  }
}

// ---- hand-crafted messages, word by word ------------------------------------------------------

using sluice::testing::far_ptr;  // capnp_words.h
using sluice::testing::kByte;
using sluice::testing::kEightBytes;
using sluice::testing::kInlineComposite;
using sluice::testing::list_ptr;
using sluice::testing::struct_ptr;

// One segment: the root pointer (word 0) and an Envelope (words 1-5) from kA, kind membership,
// sent at kNow; the payload pointer is word 5, left null for the caller.
struct RawEnvelope {
  static constexpr size_t kPayload = 5;
  std::vector<uint64_t> w;

  explicit RawEnvelope(uint64_t seq, uint16_t kind = 0) : w(6, 0) {
    w[0] = struct_ptr(0, 4, 1);
    w[1] = uint64_t{kA} << 16 | uint64_t{kind} << 32;  // version 1 is stored as 0
    w[2] = kBootA;
    w[3] = seq;
    w[4] = static_cast<uint64_t>(kNow);
  }
  size_t alloc(size_t n) {
    const size_t at = w.size();
    w.resize(at + n, 0);
    return at;
  }
  static int64_t offset(size_t from, size_t to) {
    return static_cast<int64_t>(to) - static_cast<int64_t>(from) - 1;
  }
  // Framed as one segment, or with a segment table that claims `claimed_words` instead.
  Bytes bytes(std::optional<uint32_t> claimed_words = std::nullopt) const {
    const uint32_t table[2] = {0, claimed_words.value_or(static_cast<uint32_t>(w.size()))};
    // The test hosts are little-endian. (Appended byte by byte: g++ 12 at -O2 takes a memcpy of
    // w.size() * 8 bytes here for one of 2^64 - 7.)
    Bytes out(reinterpret_cast<const uint8_t*>(table), reinterpret_cast<const uint8_t*>(table) + 8);
    const auto* words = reinterpret_cast<const uint8_t*>(w.data());
    out.insert(out.end(), words, words + w.size() * sizeof(uint64_t));
    return out;
  }
};

// ---- fixtures ----------------------------------------------------------------------------------

struct Pair {
  PeerCodec a{kSecret, kA, kBootA};
  PeerCodec b{kSecret, kB, 1'700'000'000'001};
  PeerMessage got;
  uint64_t next_raw_seq = 1'000'000;  // crafted envelopes from kA use their own seq range

  PeerError open(const Bytes& datagram, int64_t now = kNow) { return b.open(datagram, now, got); }
  // `message` (bytes of an envelope from kA) under a's valid tag, opened by b.
  PeerError open_signed(const Bytes& message) {
    Bytes datagram;
    a.TEST_sign(message, datagram);
    return open(datagram);
  }
  PeerError open_built(const std::function<void(ps::Envelope::Builder)>& fill) {
    return open_signed(build_envelope(next_raw_seq++, fill));
  }
};

// ---- round trips -----------------------------------------------------------------------------

TEST_CASE("peer_codec: round-trips every membership kind with all fields") {
  Pair p;
  for (auto kind : {MembershipKind::kPing, MembershipKind::kAck, MembershipKind::kPingReq,
                    MembershipKind::kNack, MembershipKind::kJoin, MembershipKind::kJoinReply}) {
    CAPTURE(static_cast<int>(kind));
    const MembershipMessage m = sample_membership(kind);
    const Bytes d = seal(p.a, m);
    REQUIRE(p.open(d) == PeerError::kOk);
    CHECK(p.got.header.sender == kA);
    CHECK(p.got.header.boot_id == kBootA);
    CHECK(p.got.header.seq == p.a.last_seq());
    CHECK(p.got.header.sent_ms == kNow);
    CHECK(p.got.header.kind == PeerKind::kMembership);
    check_same(p.got.membership, m);
  }
}

TEST_CASE("peer_codec: round-trips membership messages without gossip") {
  Pair p;
  MembershipMessage m;
  m.kind = MembershipKind::kPing;
  m.from = kA;
  m.seq = 1;
  REQUIRE(p.open(seal(p.a, m)) == PeerError::kOk);
  check_same(p.got.membership, m);
}

TEST_CASE(
    "peer_codec: round-trips a pull's view digest, and a membership message without one, as older "
    "nodes build it, reads as none") {
  Pair p;
  MembershipMessage m = sample_membership(MembershipKind::kJoin);
  m.gossip.resize(1);
  for (const size_t n : {size_t{1}, size_t{3}, kMaxViewBuckets}) {
    CAPTURE(n);
    m.view_digest.assign(n, 0);
    for (size_t i = 0; i < n; ++i)
      m.view_digest[i] = 0x9e37'79b9'7f4a'7c15ULL * (i + 1);
    const Bytes d = seal(p.a, m);
    REQUIRE(p.open(d) == PeerError::kOk);
    check_same(p.got.membership, m);
  }
  // Only a message with a digest pays for its pointer: a ping without gossip is the 8-byte
  // segment table, the root pointer, the envelope (4 data words, 1 pointer), the lean payload
  // (1 data word, 1 pointer) and the 32-byte tag, as before the field; one bucket makes the
  // payload the whole struct (2 data words, 2 pointers) and adds its word.
  MembershipMessage ping;
  ping.kind = MembershipKind::kPing;
  CHECK(seal(p.a, ping).size() == 8 + 8 + 40 + 16 + 32);
  ping.view_digest = {42};
  CHECK(seal(p.a, ping).size() == 8 + 8 + 40 + 16 + 32 + 24);
  // An answer that asks for its recipient's record: the whole struct, no digest.
  MembershipMessage ack;
  ack.kind = MembershipKind::kAck;
  ack.from = kA;
  ack.unknown_recipient = true;
  const Bytes asking = seal(p.a, ack);
  CHECK(asking.size() == 8 + 8 + 40 + 32 + 32);
  REQUIRE(p.open(asking) == PeerError::kOk);
  check_same(p.got.membership, ack);
  // Built by hand with the schema's first four fields only: the digest list is absent.
  REQUIRE(p.open_built([](ps::Envelope::Builder env) { fill_gossip(env, 2); }) == PeerError::kOk);
  CHECK(p.got.membership.view_digest.empty());
  CHECK(p.got.membership.gossip.size() == 2);
}

TEST_CASE("peer_codec: round-trips sync batches with all fields, handoff and empty") {
  Pair p;
  SyncBatch b = sample_sync();
  REQUIRE(p.open(seal(p.a, b)) == PeerError::kOk);
  CHECK(p.got.header.kind == PeerKind::kSync);
  check_same(p.got.sync, b);

  b.handoff = false;
  b.totals.clear();
  REQUIRE(p.open(seal(p.a, b)) == PeerError::kOk);
  check_same(p.got.sync, b);
}

TEST_CASE("peer_codec: takes the sender from the envelope, not from the message") {
  Pair p;
  MembershipMessage m = sample_membership(MembershipKind::kAck);
  m.from = 999;  // not sent
  REQUIRE(p.open(seal(p.a, m)) == PeerError::kOk);
  CHECK(p.got.membership.from == kA);
  SyncBatch b = sample_sync();
  b.from = 999;
  REQUIRE(p.open(seal(p.a, b)) == PeerError::kOk);
  CHECK(p.got.sync.from == kA);
}

TEST_CASE("peer_codec: numbers datagrams from 1 and a refused seal uses no number") {
  Pair p;
  CHECK(p.a.last_seq() == 0);
  seal(p.a, sample_sync());
  CHECK(p.a.last_seq() == 1);
  SyncBatch bad = sample_sync();
  bad.totals[0].spec = WindowSpec{60'000, 7};
  Bytes out{1, 2, 3};
  CHECK(p.a.seal(bad, kNow, out) == PeerError::kBadWindow);
  CHECK(out.empty());
  CHECK(p.a.last_seq() == 1);
  REQUIRE(p.open(seal(p.a, sample_sync())) == PeerError::kOk);
  CHECK(p.got.header.seq == 2);
}

TEST_CASE("peer_codec: names every reason for metrics") {
  CHECK(to_string(PeerError::kOk) == "ok");
  CHECK(to_string(PeerError::kMalformed) == "malformed");
  CHECK(to_string(PeerError::kTooLarge) == "too_large");
  CHECK(to_string(PeerError::kBadTag) == "bad_tag");
  CHECK(to_string(PeerError::kWrongVersion) == "wrong_version");
  CHECK(to_string(PeerError::kUnknownKind) == "unknown_kind");
  CHECK(to_string(PeerError::kFromSelf) == "from_self");
  CHECK(to_string(PeerError::kClockSkew) == "clock_skew");
  CHECK(to_string(PeerError::kStaleBoot) == "stale_boot");
  CHECK(to_string(PeerError::kReplayed) == "replayed");
  CHECK(to_string(PeerError::kTooOld) == "too_old");
  CHECK(to_string(PeerError::kTooManyEntries) == "too_many_entries");
  CHECK(to_string(PeerError::kStringTooLong) == "string_too_long");
  CHECK(to_string(PeerError::kBadField) == "bad_field");
  CHECK(to_string(PeerError::kBadWindow) == "bad_window");
  CHECK(to_string(PeerError::kReleaseOutsideWindow) == "release_outside_window");
  CHECK(to_string(PeerKind::kForwardAnswer) == "forward_answer");
}

// ---- construction ----------------------------------------------------------------------------

TEST_CASE("peer_codec: refuses a cluster secret shorter than 16 bytes") {
  CHECK(PeerCodec::check_secret("0123456789abcdef").ok());
  CHECK(PeerCodec::check_secret("0123456789abcde").message() ==
        "cluster secret must be at least 16 bytes, got 15");
  CHECK_THROWS_WITH_AS(PeerCodec("", kA, 1), "cluster secret must be at least 16 bytes, got 0",
                       std::invalid_argument);
  PeerLimits tiny;
  tiny.max_datagram_bytes = 40;
  CHECK_THROWS_AS(PeerCodec(kSecret, kA, 1, tiny), std::invalid_argument);
}

// ---- authentication --------------------------------------------------------------------------

TEST_CASE("peer_codec: drops a datagram with any single bit flipped as bad_tag") {
  Pair p;
  const Bytes d = seal(p.a, sample_membership(MembershipKind::kJoinReply));
  for (size_t bit = 0; bit < d.size() * 8; ++bit) {
    Bytes x = d;
    x[bit / 8] = static_cast<uint8_t>(x[bit / 8] ^ (1u << (bit % 8)));
    CAPTURE(bit);
    REQUIRE(p.open(x) == PeerError::kBadTag);
  }
  // The original was never recorded by the failed attempts.
  CHECK(p.open(d) == PeerError::kOk);
}

TEST_CASE("peer_codec: drops datagrams sealed with another secret as bad_tag") {
  PeerCodec other("another secret, same length!", kA, kBootA);
  Pair p;
  CHECK(p.open(seal(other, sample_sync())) == PeerError::kBadTag);
  // A secret that differs only in its last byte.
  std::string near(kSecret);
  near.back() = static_cast<char>(near.back() ^ 1);
  PeerCodec close(near, kA, kBootA);
  CHECK(p.open(seal(close, sample_sync())) == PeerError::kBadTag);
}

TEST_CASE("peer_codec: drops truncated and extended datagrams") {
  Pair p;
  const Bytes d = seal(p.a, sample_membership(MembershipKind::kJoin));
  for (size_t n = 0; n < d.size(); ++n) {
    CAPTURE(n);
    const Bytes x(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(n));
    REQUIRE(p.open(x) == (n < 48 ? PeerError::kMalformed : PeerError::kBadTag));
  }
  Bytes longer = d;
  longer.push_back(0);
  CHECK(p.open(longer) == PeerError::kBadTag);
  CHECK(p.open(Bytes{}) == PeerError::kMalformed);
}

TEST_CASE("peer_codec: drops oversized datagrams before any work and refuses to seal them") {
  Pair p;
  CHECK(p.open(Bytes(65'508, 0)) == PeerError::kTooLarge);
  CHECK(p.open(Bytes(1u << 20, 0xff)) == PeerError::kTooLarge);

  PeerLimits limits;
  limits.max_datagram_bytes = 512;
  PeerCodec small(kSecret, kA, kBootA, limits);
  Bytes out{1};
  MembershipMessage m = sample_membership(MembershipKind::kJoinReply);  // a 255-byte name
  CHECK(small.seal(m, kNow, out) == PeerError::kTooLarge);
  CHECK(out.empty());
  CHECK(small.last_seq() == 0);
  // Just under the limit is fine, and what the sealer accepts its peer accepts.
  m.gossip.resize(2);
  REQUIRE(small.seal(m, kNow, out) == PeerError::kOk);
  CHECK(out.size() <= 512);
  PeerCodec small_b(kSecret, kB, 1, limits);
  PeerMessage got;
  CHECK(small_b.open(out, kNow, got) == PeerError::kOk);
  // A large batch: the size is exact arithmetic, the biggest that fits is accepted.
  SyncBatch b;
  b.totals.resize(2'043, RemoteTotal{1, WindowSpec{}, 1, 1, 1});
  Bytes big;
  REQUIRE(p.a.seal(b, kNow, big) == PeerError::kOk);
  // 8 + (envelope 1 + 5, batch 3 (handoff, heardMs, totals), list tag 1, 4 words a total) * 8
  // + the 32-byte tag
  CHECK(big.size() == 65'496);
  CHECK(p.open(big) == PeerError::kOk);
  CHECK(p.got.sync.totals.size() == 2'043);
  b.totals.resize(2'044, RemoteTotal{1, WindowSpec{}, 1, 1, 1});
  CHECK(p.a.seal(b, kNow, big) == PeerError::kTooLarge);
}

// ---- freshness ---------------------------------------------------------------------------------

TEST_CASE("peer_codec: accepts a datagram once: a replay is dropped as replayed") {
  Pair p;
  const Bytes d = seal(p.a, sample_sync());
  CHECK(p.open(d) == PeerError::kOk);
  CHECK(p.open(d) == PeerError::kReplayed);
  CHECK(p.open(d, kNow + 1'000) == PeerError::kReplayed);
}

TEST_CASE("peer_codec: drops an older boot of a sender, and a newer boot starts afresh") {
  Pair p;
  PeerCodec old_boot(kSecret, kA, kBootA - 1);
  PeerCodec new_boot(kSecret, kA, kBootA + 1);
  const Bytes from_old = seal(old_boot, sample_sync());
  const Bytes d1 = seal(p.a, sample_sync());
  const Bytes d2 = seal(p.a, sample_sync());
  const Bytes from_new = seal(new_boot, sample_sync());  // seq 1 of the new boot
  CHECK(p.open(d2) == PeerError::kOk);
  CHECK(p.open(from_old) == PeerError::kStaleBoot);
  CHECK(p.open(from_new) == PeerError::kOk);
  CHECK(p.got.header.seq == 1);
  // Once the restart is seen, the previous boot's datagrams are stale, even unseen ones.
  CHECK(p.open(d1) == PeerError::kStaleBoot);
  CHECK(p.open(from_new) == PeerError::kReplayed);
}

TEST_CASE("peer_codec: accepts reordering within the window and drops what is older") {
  Pair p;
  std::vector<Bytes> d;
  for (uint64_t i = 0; i < ReplayGuard::kWindow + 1; ++i)
    d.push_back(seal(p.a, sample_sync()));  // seq i + 1
  // Newest first, then backwards through the window: every one is new.
  CHECK(p.open(d.back()) == PeerError::kOk);
  for (size_t i = d.size() - 2; i >= 1; --i) {
    CAPTURE(i);
    REQUIRE(p.open(d[i]) == PeerError::kOk);
  }
  // seq 1 is kWindow behind seq 1025: out of the window.
  CHECK(p.open(d[0]) == PeerError::kTooOld);
  CHECK(p.open(d[1]) == PeerError::kReplayed);
  CHECK(p.open(d[d.size() / 2]) == PeerError::kReplayed);
}

TEST_CASE("peer_codec: the replay guard slides its window and forgets senders") {
  constexpr uint64_t W = ReplayGuard::kWindow;
  constexpr uint64_t S = 5'000;
  ReplayGuard g;
  CHECK(g.admit(5, 10, S) == PeerError::kOk);
  CHECK(g.admit(5, 10, S) == PeerError::kReplayed);
  CHECK(g.admit(5, 10, S - W + 1) == PeerError::kOk);  // the oldest slot kept
  CHECK(g.admit(5, 10, S - W) == PeerError::kTooOld);
  CHECK(g.admit(5, 10, 0) == PeerError::kTooOld);
  CHECK(g.check(5, 10, S - 1) == PeerError::kOk);  // check records nothing
  CHECK(g.check(5, 10, S - 1) == PeerError::kOk);
  // A jump of less than a window keeps what is still inside it.
  CHECK(g.admit(5, 10, S + 500) == PeerError::kOk);
  CHECK(g.admit(5, 10, S) == PeerError::kReplayed);
  CHECK(g.admit(5, 10, S + 500 - W) == PeerError::kTooOld);
  CHECK(g.admit(5, 10, S + 1) == PeerError::kOk);  // a hole the slide cleared, still inside
  CHECK(g.admit(5, 10, S + 1) == PeerError::kReplayed);
  // A jump of more than a window forgets everything older.
  CHECK(g.admit(5, 10, S + 10'000) == PeerError::kOk);
  CHECK(g.admit(5, 10, S + 500) == PeerError::kTooOld);
  CHECK(g.admit(5, 10, S + 9'999) == PeerError::kOk);
  // A slot reused one window later is not mistaken for the seq that held it before.
  CHECK(g.admit(5, 10, S + 10'000 + W) == PeerError::kOk);
  CHECK(g.admit(5, 10, S + 10'000) == PeerError::kTooOld);
  CHECK(g.admit(5, 10, S + 10'001) == PeerError::kOk);
  // The largest seq does not overflow anything.
  CHECK(g.admit(5, 10, UINT64_MAX) == PeerError::kOk);
  CHECK(g.admit(5, 10, UINT64_MAX) == PeerError::kReplayed);
  CHECK(g.admit(5, 10, UINT64_MAX - 1) == PeerError::kOk);
  // Senders are independent; boots are per sender.
  CHECK(g.admit(6, 1, 1) == PeerError::kOk);
  CHECK(g.senders() == 2);
  CHECK(g.admit(5, 9, 50'000) == PeerError::kStaleBoot);
  CHECK(g.admit(5, 11, 1) == PeerError::kOk);
  CHECK(g.admit(5, 11, UINT64_MAX) == PeerError::kOk);
  // record() outside its precondition changes nothing: seq 3 shares a slot with UINT64_MAX-1020.
  g.record(5, 10, UINT64_MAX - 1'020);
  g.record(5, 11, 3);
  CHECK(g.check(5, 11, UINT64_MAX - 1'020) == PeerError::kOk);
  g.forget(5);
  CHECK(g.senders() == 1);
  CHECK(g.admit(5, 9, 1) == PeerError::kOk);
}

TEST_CASE("peer_codec: drops datagrams whose send time is too far from now, either way") {
  Pair p;
  const Bytes d = seal(p.a, sample_sync(), kNow);
  CHECK(p.open(d, kNow + 30'001) == PeerError::kClockSkew);  // too old, or receiver ahead
  CHECK(p.open(d, kNow - 30'001) == PeerError::kClockSkew);  // from the future
  CHECK(p.open(d, kNow - 30'000) == PeerError::kOk);         // the bound itself is accepted
  const Bytes d2 = seal(p.a, sample_sync(), kNow);
  CHECK(p.open(d2, kNow + 30'000) == PeerError::kOk);
  // Extreme times do not overflow the comparison.
  const Bytes far = seal(p.a, sample_sync(), std::numeric_limits<int64_t>::min());
  CHECK(p.open(far, std::numeric_limits<int64_t>::max()) == PeerError::kClockSkew);
  PeerLimits loose;
  loose.max_clock_skew_ms = 120'000;
  PeerCodec c(kSecret, 3, 1, loose);
  PeerMessage got;
  CHECK(c.open(seal(p.a, sample_sync(), kNow), kNow + 100'000, got) == PeerError::kOk);
}

TEST_CASE("peer_codec: drops its own datagrams as from_self") {
  Pair p;
  PeerCodec twin(kSecret, kB, 5);  // a misconfigured node with b's id, or a reflection
  CHECK(p.open(seal(twin, sample_sync())) == PeerError::kFromSelf);
}

// ---- hostile payloads under a valid tag ----------------------------------------------------

TEST_CASE("peer_codec: drops envelopes of another version or kind") {
  Pair p;
  CHECK(p.open_built([](ps::Envelope::Builder env) { env.setVersion(2); }) ==
        PeerError::kWrongVersion);
  CHECK(p.open_built([](ps::Envelope::Builder env) { env.setVersion(0); }) ==
        PeerError::kWrongVersion);
  for (auto kind : {ps::Kind::FORWARD, ps::Kind::FORWARD_ANSWER, ps::Kind::HANDOFF,
                    static_cast<ps::Kind>(6), static_cast<ps::Kind>(65'535)}) {
    CAPTURE(static_cast<int>(kind));
    CHECK(p.open_built([&](ps::Envelope::Builder env) {
      env.setKind(kind);
      fill_gossip(env, 1);
    }) == PeerError::kUnknownKind);
  }
  // A kind whose payload is missing or of another type.
  CHECK(p.open_built([](ps::Envelope::Builder) {}) == PeerError::kBadField);
  CHECK(p.open_built([](ps::Envelope::Builder env) {
    env.getPayload().initAs<capnp::List<uint64_t>>(3);
  }) == PeerError::kMalformed);
  // The same built envelope with valid fields is accepted: the helpers themselves are sound.
  CHECK(p.open_built([](ps::Envelope::Builder env) { fill_gossip(env, 2); }) == PeerError::kOk);
  CHECK(p.got.membership.gossip.size() == 2);
}

// ---- releases: the compatibility window --------------------------------------------------------

TEST_CASE("peer_codec: a node talks to the previous and the next minor release, and says which") {
  Pair p;
  p.b.TEST_set_release({0, 3, 0});
  for (const sluice::Release r : {sluice::Release{0, 2, 0}, sluice::Release{0, 3, 0},
                                  sluice::Release{0, 4, 0}, sluice::Release{0, 3, 7}}) {
    CAPTURE(sluice::to_string(r));
    p.a.TEST_set_release(r);
    REQUIRE(p.open(seal(p.a, sample_sync())) == PeerError::kOk);
    CHECK(p.got.header.release == sluice::Release{r.major, r.minor, 0});  // no patch on the wire
    check_same(p.got.sync, sample_sync());
  }
}

TEST_CASE("peer_codec: an envelope without a release, as 0.2 seals them, is 0.2 and accepted") {
  // build_envelope writes what a 0.2 node writes: the same words with the release bits at 0.
  Pair p;
  p.b.TEST_set_release({0, 3, 0});
  CHECK(p.open_built([](ps::Envelope::Builder env) { fill_gossip(env, 2); }) == PeerError::kOk);
  CHECK(p.got.header.release == sluice::kUnrecordedRelease);
  CHECK(p.got.membership.gossip.size() == 2);
  // The field took no room: the envelope has the data words and pointer it had before it.
  CHECK(capnp::_::structSize<ps::Envelope>().data == 4);
  CHECK(capnp::_::structSize<ps::Envelope>().pointers == 1);
}

TEST_CASE("peer_codec: drops datagrams of a release outside the window as release_outside_window") {
  Pair p;
  p.b.TEST_set_release({0, 3, 0});
  for (const sluice::Release r : {sluice::Release{0, 1, 0}, sluice::Release{0, 5, 0},
                                  sluice::Release{1, 3, 0}, sluice::Release{255, 255, 0}}) {
    CAPTURE(sluice::to_string(r));
    p.a.TEST_set_release(r);
    const Bytes d = seal(p.a, sample_membership(MembershipKind::kPing));
    CHECK(p.open(d) == PeerError::kReleaseOutsideWindow);
    CHECK(p.got.header.release == sluice::Release{r.major, r.minor, 0});  // for the log line
    CHECK(p.got.header.sender == kA);
  }
  // Nothing was recorded in the replay guard: the same sender, back in the window, is heard.
  p.a.TEST_set_release({0, 2, 0});
  CHECK(p.open(seal(p.a, sample_sync())) == PeerError::kOk);
  // And a 0.2 node (release 0) seen by a node two minors ahead is outside.
  p.b.TEST_set_release({0, 4, 0});
  CHECK(p.open_built([](ps::Envelope::Builder env) { fill_gossip(env, 1); }) ==
        PeerError::kReleaseOutsideWindow);
}

TEST_CASE("peer_codec: bounds gossip entries, names and hosts") {
  Pair p;
  CHECK(p.open_built([](ps::Envelope::Builder env) { fill_gossip(env, 64); }) == PeerError::kOk);
  CHECK(p.open_built([](ps::Envelope::Builder env) { fill_gossip(env, 65); }) ==
        PeerError::kTooManyEntries);
  CHECK(p.open_built([](ps::Envelope::Builder env) { fill_gossip(env, 100'000); }) ==
        PeerError::kTooLarge);

  auto with_member = [&](const std::function<void(ps::Member::Builder)>& set) {
    return p.open_built([&](ps::Envelope::Builder env) {
      fill_gossip(env, 2);
      set(env.getPayload().getAs<ps::Membership>().getGossip()[1]);
    });
  };
  CHECK(with_member([](ps::Member::Builder m) { m.setName(std::string(255, 'x')); }) ==
        PeerError::kOk);
  CHECK(with_member([](ps::Member::Builder m) { m.setName(std::string(256, 'x')); }) ==
        PeerError::kStringTooLong);
  CHECK(with_member([](ps::Member::Builder m) { m.setHost(std::string(256, '1')); }) ==
        PeerError::kStringTooLong);
  CHECK(with_member([](ps::Member::Builder m) { m.setName(""); }) == PeerError::kBadField);
  CHECK(with_member([](ps::Member::Builder m) { m.setName("two words"); }) == PeerError::kBadField);
  CHECK(with_member([](ps::Member::Builder m) { m.setName("tab\there"); }) == PeerError::kBadField);
  CHECK(with_member([](ps::Member::Builder m) { m.setName(capnp::Text::Reader("nul\0in", 6)); }) ==
        PeerError::kBadField);
  CHECK(with_member([](ps::Member::Builder m) { m.setHost(""); }) == PeerError::kBadField);
  CHECK(with_member([](ps::Member::Builder m) { m.setHost("node-b.example"); }) ==
        PeerError::kBadField);
  CHECK(with_member([](ps::Member::Builder m) { m.setHost("10.0.0.256"); }) ==
        PeerError::kBadField);
  CHECK(with_member([](ps::Member::Builder m) {
          m.setHost(capnp::Text::Reader("10.0.0.1\0junk", 13));
        }) == PeerError::kBadField);
  CHECK(with_member([](ps::Member::Builder m) { m.setHost("fe80::1"); }) == PeerError::kOk);

  // A pull's view digest: at most kMaxViewBuckets entries.
  auto with_digest = [&](unsigned int n) {
    return p.open_built([n](ps::Envelope::Builder env) {
      fill_gossip(env, 1);
      env.getPayload().getAs<ps::Membership>().initViewDigest(n);
    });
  };
  CHECK(with_digest(static_cast<unsigned int>(kMaxViewBuckets)) == PeerError::kOk);
  CHECK(with_digest(static_cast<unsigned int>(kMaxViewBuckets) + 1) == PeerError::kTooManyEntries);
}

TEST_CASE("peer_codec: drops out-of-range enums") {
  Pair p;
  CHECK(p.open_built([](ps::Envelope::Builder env) {
    fill_gossip(env, 1);
    env.getPayload().getAs<ps::Membership>().setKind(static_cast<ps::MembershipKind>(6));
  }) == PeerError::kBadField);
  CHECK(p.open_built([](ps::Envelope::Builder env) {
    fill_gossip(env, 3);
    env.getPayload().getAs<ps::Membership>().getGossip()[2].setState(
        static_cast<ps::MemberState>(4));
  }) == PeerError::kBadField);
  CHECK(p.open_built([](ps::Envelope::Builder env) {
    fill_gossip(env, 1);
    env.getPayload().getAs<ps::Membership>().getGossip()[0].setState(ps::MemberState::LEFT);
  }) == PeerError::kOk);
}

TEST_CASE("peer_codec: drops sync batches over their bound or with invalid window specs") {
  Pair p;
  auto batch = [&](unsigned int n, const std::function<void(ps::RemoteTotal::Builder)>& set) {
    return p.open_built([&](ps::Envelope::Builder env) {
      env.setKind(ps::Kind::SYNC);
      auto b = env.getPayload().initAs<ps::SyncBatch>();
      auto list = b.initTotals(n);
      for (auto t : list) {
        t.setWindowMs(60'000);
        t.setBucketMs(60'000);
      }
      if (n > 0) set(list[n - 1]);
    });
  };
  CHECK(batch(3, [](ps::RemoteTotal::Builder) {}) == PeerError::kOk);
  // At the default limits the datagram size binds before the count (2'043 totals fit).
  CHECK(batch(2'049, [](ps::RemoteTotal::Builder) {}) == PeerError::kTooLarge);
  CHECK(batch(1, [](ps::RemoteTotal::Builder t) { t.setWindowMs(0); }) == PeerError::kBadWindow);
  CHECK(batch(1, [](ps::RemoteTotal::Builder t) { t.setBucketMs(0); }) == PeerError::kBadWindow);
  CHECK(batch(1, [](ps::RemoteTotal::Builder t) { t.setBucketMs(7'000); }) ==
        PeerError::kBadWindow);
  CHECK(batch(1, [](ps::RemoteTotal::Builder t) { t.setWindowMs(86'400'001); }) ==
        PeerError::kBadWindow);
  CHECK(batch(1, [](ps::RemoteTotal::Builder t) { t.setWindowMs(0xffff'ffffu); }) ==
        PeerError::kBadWindow);
  CHECK(batch(1, [](ps::RemoteTotal::Builder t) {
          t.setWindowMs(86'400'000);
          t.setBucketMs(10);
        }) == PeerError::kBadWindow);  // more than 1440 buckets
  CHECK(batch(1, [](ps::RemoteTotal::Builder t) {
          t.setWindowMs(1'000);
          t.setBucketMs(10);
        }) == PeerError::kOk);
}

TEST_CASE("peer_codec: bounds sync totals by count under its limits") {
  PeerLimits limits;
  limits.max_totals = 100;
  PeerCodec a(kSecret, kA, kBootA);  // default limits: seals 101 totals
  PeerCodec b(kSecret, kB, 1, limits);
  SyncBatch batch;
  batch.totals.resize(100, RemoteTotal{1, WindowSpec{}, 1, 1, 1});
  PeerMessage got;
  CHECK(b.open(seal(a, batch), kNow, got) == PeerError::kOk);
  batch.totals.resize(101, RemoteTotal{1, WindowSpec{}, 1, 1, 1});
  CHECK(b.open(seal(a, batch), kNow, got) == PeerError::kTooManyEntries);
  Bytes out;
  CHECK(b.seal(batch, kNow, out) == PeerError::kTooManyEntries);
}

TEST_CASE("peer_codec: a sync batch of sync_totals_within(n) totals seals within n bytes") {
  PeerCodec a(kSecret, kA, kBootA);
  PeerCodec b(kSecret, kB, 1);
  for (const size_t bound : {kSyncDatagramBytes, size_t{512}, size_t{8'192}}) {
    const size_t n = sync_totals_within(bound);
    SyncBatch batch;
    batch.heard_ms = kNow;
    batch.totals.resize(n, RemoteTotal{~uint64_t{0}, sluice::window::make_spec(3'600'000, 60'000),
                                       0xffff, INT64_C(0x7fff'ffff), 0xffff'ffffu});
    const Bytes sealed = seal(a, batch);
    CHECK(sealed.size() == sync_datagram_bytes(n));
    CHECK(sealed.size() <= bound);
    batch.totals.push_back(batch.totals.back());  // one more does not fit
    CHECK(seal(a, batch).size() > bound);
    PeerMessage got;
    CHECK(b.open(sealed, kNow, got) == PeerError::kOk);
    CHECK(got.sync.totals.size() == n);
  }
  // The bound leaves room for a useful batch, and one total always goes.
  CHECK(sync_totals_within(kSyncDatagramBytes) >= 30);
  CHECK(sync_totals_within(1) == 1);
}

TEST_CASE("peer_codec: refuses to seal what its peers would drop") {
  Pair p;
  Bytes out;
  MembershipMessage m = sample_membership(MembershipKind::kJoinReply);
  m.gossip.resize(65, m.gossip[0]);
  CHECK(p.a.seal(m, kNow, out) == PeerError::kTooManyEntries);
  m = sample_membership(MembershipKind::kJoinReply);
  m.gossip[1].name.push_back('x');
  m.gossip[1].name.resize(256, 'x');
  CHECK(p.a.seal(m, kNow, out) == PeerError::kStringTooLong);
  m = sample_membership(MembershipKind::kJoinReply);
  m.gossip[2].host = "localhost";
  CHECK(p.a.seal(m, kNow, out) == PeerError::kBadField);
  m = sample_membership(MembershipKind::kJoinReply);
  m.gossip[0].name.clear();
  CHECK(p.a.seal(m, kNow, out) == PeerError::kBadField);
  m = sample_membership(MembershipKind::kJoinReply);
  m.gossip[3].state = static_cast<MemberState>(4);
  CHECK(p.a.seal(m, kNow, out) == PeerError::kBadField);
  m = sample_membership(static_cast<MembershipKind>(6));
  CHECK(p.a.seal(m, kNow, out) == PeerError::kBadField);
  m = sample_membership(MembershipKind::kJoin);
  m.view_digest.resize(kMaxViewBuckets + 1);
  CHECK(p.a.seal(m, kNow, out) == PeerError::kTooManyEntries);
  SyncBatch b = sample_sync();
  b.totals.resize(2'049);
  CHECK(p.a.seal(b, kNow, out) == PeerError::kTooManyEntries);
  b = sample_sync();
  b.totals[1].spec = WindowSpec{-60'000, 60'000};
  CHECK(p.a.seal(b, kNow, out) == PeerError::kBadWindow);
  CHECK(p.a.last_seq() == 0);
}

TEST_CASE("peer_codec: drops hand-crafted pointer tricks under a valid tag as malformed") {
  Pair p;
  uint64_t seq = 1;
  auto open_raw = [&](const RawEnvelope& e, std::optional<uint32_t> claimed = std::nullopt) {
    return p.open_signed(e.bytes(claimed));
  };
  {  // sanity: a crafted Ping with no gossip is accepted
    RawEnvelope e(seq++);
    const size_t m = e.alloc(2);
    e.w[RawEnvelope::kPayload] = struct_ptr(RawEnvelope::offset(RawEnvelope::kPayload, m), 1, 1);
    REQUIRE(open_raw(e) == PeerError::kOk);
  }
  {  // payload pointer past the end of the segment
    RawEnvelope e(seq++);
    e.w[RawEnvelope::kPayload] = struct_ptr(1'000, 1, 1);
    CHECK(open_raw(e) == PeerError::kMalformed);
  }
  {  // payload pointer before the start of the segment
    RawEnvelope e(seq++);
    e.w[RawEnvelope::kPayload] = struct_ptr(-100, 1, 1);
    CHECK(open_raw(e) == PeerError::kMalformed);
  }
  {  // a far pointer to a segment the message does not have
    RawEnvelope e(seq++);
    e.w[RawEnvelope::kPayload] = far_ptr(0, false, 3);
    CHECK(open_raw(e) == PeerError::kMalformed);
  }
  {  // the payload points at itself: its gossip "list" is a struct pointer
    RawEnvelope e(seq++);
    e.w[RawEnvelope::kPayload] = struct_ptr(-1, 0, 1);
    CHECK(open_raw(e) == PeerError::kMalformed);
  }
  {  // gossip: a list of 2^29-1 zero-sized structs (amplification), stopped by the limits
    RawEnvelope e(seq++);
    const size_t m = e.alloc(2);
    e.w[RawEnvelope::kPayload] = struct_ptr(RawEnvelope::offset(RawEnvelope::kPayload, m), 1, 1);
    const size_t tag = e.alloc(1);
    e.w[m + 1] = list_ptr(RawEnvelope::offset(m + 1, tag), kInlineComposite, 0);
    e.w[tag] = uint64_t{(1u << 29) - 1} << 2;     // a struct "pointer" as tag: count, 0 words
    CHECK(open_raw(e) == PeerError::kMalformed);  // Cap'n Proto: "amplified list pointer"
  }
  {  // gossip: an element count whose words run past the segment
    RawEnvelope e(seq++);
    const size_t m = e.alloc(2);
    e.w[RawEnvelope::kPayload] = struct_ptr(RawEnvelope::offset(RawEnvelope::kPayload, m), 1, 1);
    const size_t tag = e.alloc(1);
    e.w[m + 1] = list_ptr(RawEnvelope::offset(m + 1, tag), kInlineComposite, 4 * 10);
    e.w[tag] = struct_ptr(10, 2, 2);
    CHECK(open_raw(e) == PeerError::kMalformed);
  }
  {  // a member name that is not NUL-terminated
    RawEnvelope e(seq++);
    const size_t m = e.alloc(2);
    e.w[RawEnvelope::kPayload] = struct_ptr(RawEnvelope::offset(RawEnvelope::kPayload, m), 1, 1);
    const size_t tag = e.alloc(1 + 4);
    e.w[m + 1] = list_ptr(RawEnvelope::offset(m + 1, tag), kInlineComposite, 4);
    e.w[tag] = struct_ptr(1, 2, 2);
    const size_t name = e.alloc(1);
    std::memcpy(&e.w[name], "node-abc", 8);  // 8 bytes, no NUL
    e.w[tag + 3] = list_ptr(RawEnvelope::offset(tag + 3, name), kByte, 8);
    CHECK(open_raw(e) == PeerError::kMalformed);
  }
  {  // a segment table that claims more words than were sent
    RawEnvelope e(seq++);
    CHECK(open_raw(e, 1'000) == PeerError::kMalformed);
  }
  {  // bytes after the message
    RawEnvelope e(seq++);
    const size_t m = e.alloc(2);
    e.w[RawEnvelope::kPayload] = struct_ptr(RawEnvelope::offset(RawEnvelope::kPayload, m), 1, 1);
    e.alloc(1);  // framed as a segment one word shorter than what follows the table
    CHECK(open_raw(e, static_cast<uint32_t>(e.w.size() - 1)) == PeerError::kMalformed);
  }
  {  // a message that is not a whole number of words
    RawEnvelope e(seq++);
    Bytes b = e.bytes();
    b.push_back(0);
    CHECK(p.open_signed(b) == PeerError::kMalformed);
  }
  {  // the root is a list, not an envelope
    RawEnvelope e(seq++);
    e.w[0] = list_ptr(0, kEightBytes, 5);
    CHECK(open_raw(e) == PeerError::kMalformed);
  }
  // None of these counted as seen: sequence numbers of rejected datagrams stay usable.
  RawEnvelope ok(2);
  const size_t m = ok.alloc(2);
  ok.w[RawEnvelope::kPayload] = struct_ptr(RawEnvelope::offset(RawEnvelope::kPayload, m), 1, 1);
  CHECK(open_raw(ok) == PeerError::kOk);
}

// ---- randomized -------------------------------------------------------------------------------

// Every byte the decoded message exposes, with the bounds open() promises.
void check_bounds(const PeerMessage& got) {
  if (got.header.kind == PeerKind::kMembership) {
    CHECK(got.membership.gossip.size() <= 64);
    for (const Member& m : got.membership.gossip) {
      CHECK(!m.name.empty());
      CHECK(m.name.size() <= kMaxPeerNameBytes);
      CHECK(m.host.size() <= kMaxPeerNameBytes);
      CHECK(static_cast<int>(m.state) <= 3);
    }
  } else if (got.header.kind == PeerKind::kOverrides) {
    CHECK(got.overrides.records.size() <= 512);
    for (const OverrideRecord& r : got.overrides.records) {
      CHECK(r.value.domain.size() <= OverrideBounds{}.max_string_bytes);
      CHECK(r.value.entries.size() <= OverrideBounds{}.max_entries);
      CHECK(r.value.limits.size() <= OverrideBounds{}.max_limits);
    }
  } else {
    CHECK(got.header.kind == PeerKind::kSync);
    CHECK(got.sync.totals.size() <= 2'048);
    for (const RemoteTotal& t : got.sync.totals)
      CHECK(sluice::window::validate(t.spec).ok());
  }
}

TEST_CASE("peer_codec: never accepts random or mutated bytes without the right tag") {
  std::mt19937_64 rng(20'231'114);
  Pair p;
  const std::vector<Bytes> valid = {
      seal(p.a, sample_membership(MembershipKind::kJoinReply)),
      seal(p.a, sample_sync()),
      seal(p.a, MembershipMessage{}),
  };
  auto below = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  size_t accepted = 0;
  for (int iter = 0; iter < 20'000; ++iter) {
    Bytes x;
    if (iter % 4 == 0) {  // random bytes of a random length
      x.resize(below(600));
      for (auto& byte : x)
        byte = static_cast<uint8_t>(rng());
    } else {  // a valid datagram, mutated
      x = valid[below(valid.size())];
      const size_t edits = 1 + below(4);
      for (size_t e = 0; e < edits; ++e) {
        switch (below(4)) {
          case 0:
            x[below(x.size())] ^= static_cast<uint8_t>(1 + below(255));
            break;
          case 1:
            x.resize(below(x.size()));
            break;
          case 2:
            x.insert(x.begin() + static_cast<std::ptrdiff_t>(below(x.size() + 1)),
                     static_cast<uint8_t>(rng()));
            break;
          default:
            x.erase(x.begin() + static_cast<std::ptrdiff_t>(below(x.size())));
            break;
        }
        if (x.empty()) break;
      }
      if (std::find(valid.begin(), valid.end(), x) != valid.end()) continue;
    }
    const PeerError e = p.open(x);
    if (e == PeerError::kOk) ++accepted;
    REQUIRE(e != PeerError::kOk);
  }
  CHECK(accepted == 0);
}

TEST_CASE("peer_codec: survives random mutations of messages under a valid tag") {
  std::mt19937_64 rng(7);
  Pair p;
  // Message bytes of valid envelopes (datagram minus tag); replays are avoided by giving the
  // receiver a fresh guard whenever it accepted something.
  std::vector<Bytes> messages;
  for (const Bytes& d : {seal(p.a, sample_membership(MembershipKind::kJoinReply)),
                         seal(p.a, sample_sync()), seal(p.a, MembershipMessage{})})
    messages.emplace_back(d.begin(), d.end() - kPeerTagBytes);
  auto below = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  size_t by_reason[16] = {};
  for (int iter = 0; iter < 20'000; ++iter) {
    Bytes x = messages[below(messages.size())];
    const size_t edits = 1 + below(3);
    for (size_t e = 0; e < edits; ++e) {
      if (below(8) == 0) {
        x.resize(below(x.size() + 1) & ~size_t{7});  // whole words, so the reader runs
      } else {
        // Mostly the first words: the table, the root pointer, envelope and payload pointers.
        const size_t at = below(4) == 0 ? below(x.size()) : below(std::min<size_t>(x.size(), 80));
        x[at] = static_cast<uint8_t>(rng());
      }
      if (x.empty()) break;
    }
    const PeerError e = p.open_signed(x);
    ++by_reason[static_cast<size_t>(e)];
    if (e == PeerError::kOk) {
      check_bounds(p.got);
      p.b.replay_guard().forget(p.got.header.sender);
    }
  }
  // The mutations reach deep enough to produce several distinct reasons.
  size_t distinct = 0;
  for (size_t n : by_reason)
    distinct += n > 0 ? 1 : 0;
  CHECK(distinct >= 5);
  CHECK(by_reason[static_cast<size_t>(PeerError::kMalformed)] > 0);
}

// ---- allocation --------------------------------------------------------------------------------

TEST_CASE("peer_codec: opens and seals without allocating once warm") {
  Pair p;
  MembershipMessage big = sample_membership(MembershipKind::kJoinReply);
  for (Member& m : big.gossip) {
    if (m.name.size() < 100) m.name += "-with-a-name-longer-than-sso";
  }
  MembershipMessage small = sample_membership(MembershipKind::kAck);
  small.gossip.resize(1);
  const SyncBatch sync = sample_sync();
  Bytes out;
  // Warm: the output has held the largest shapes, and the guard knows the sender.
  for (int i = 0; i < 2; ++i) {
    REQUIRE(p.a.seal(big, kNow, out) == PeerError::kOk);
    REQUIRE(p.open(out) == PeerError::kOk);
    REQUIRE(p.a.seal(sync, kNow, out) == PeerError::kOk);
    REQUIRE(p.open(out) == PeerError::kOk);
    REQUIRE(p.a.seal(small, kNow, out) == PeerError::kOk);
    REQUIRE(p.open(out) == PeerError::kOk);
  }
  uint64_t seal_allocs = 0;
  uint64_t open_allocs = 0;
  for (int i = 0; i < 10; ++i) {
    for (const MembershipMessage* m : {&big, &small}) {  // shrink and grow the gossip
      uint64_t before = sluice::testing::allocations();
      const PeerError sealed = p.a.seal(*m, kNow, out);
      seal_allocs += sluice::testing::allocations() - before;
      before = sluice::testing::allocations();
      const PeerError opened = p.open(out);
      open_allocs += sluice::testing::allocations() - before;
      REQUIRE(sealed == PeerError::kOk);
      REQUIRE(opened == PeerError::kOk);
    }
    uint64_t before = sluice::testing::allocations();
    const PeerError sealed = p.a.seal(sync, kNow, out);
    seal_allocs += sluice::testing::allocations() - before;
    before = sluice::testing::allocations();
    const PeerError opened = p.open(out);
    open_allocs += sluice::testing::allocations() - before;
    REQUIRE(sealed == PeerError::kOk);
    REQUIRE(opened == PeerError::kOk);
  }
  CHECK(seal_allocs == 0);
  CHECK(open_allocs == 0);
  check_same(p.got.sync, sync);
  // Rejections before parsing allocate nothing either.
  Bytes forged = out;
  forged[20] ^= 1;
  const uint64_t before = sluice::testing::allocations();
  CHECK(p.open(forged) == PeerError::kBadTag);
  CHECK(p.open(out) == PeerError::kReplayed);
  CHECK(sluice::testing::allocations() - before == 0);
}

}  // namespace
