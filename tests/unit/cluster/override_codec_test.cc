// Unit tests of the OverrideSync peer message (lib/cluster/override_codec.cc through
// peer_codec.h): round trips of every kind with every field, splitting a large table over
// datagrams, and hostile input (truncated, oversized, forged, over its bounds, out-of-range enums,
// random mutations under a valid tag): dropped with a reason, never accepted, never a crash.
// Randomness is a seeded std::mt19937_64.
#include "cluster/peer_codec.h"

#include <doctest/doctest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "peer.capnp.h"

namespace {

using namespace sluice;
using namespace sluice::cluster;
namespace ps = sluice::schema::peer;
using Bytes = std::vector<uint8_t>;

constexpr std::string_view kSecret = "correct horse battery staple";
constexpr int64_t kNow = 1'700'000'000'000;
constexpr uint64_t kBootA = 1'699'999'000'000;
constexpr NodeId kA = 1;
constexpr NodeId kB = 2;

OverrideRecord full_record(int i) {
  OverrideRecord r;
  r.value.domain = "api";
  r.value.entries = {{"plan-owner", "org-" + std::to_string(i)}, {"user", "u" + std::to_string(i)}};
  rules::Limit a, b;
  REQUIRE(rules::parse_limit("500/1m", 0, a).ok());
  REQUIRE(rules::parse_limit("20000/1h", 60'000, b).ok());
  b.name = "hourly";
  r.value.limits = {a, b};
  r.value.plan = "gold";
  r.value.mode = rules::Mode::kDryRun;
  r.value.expires_at_ms = kNow + 3'600'000;
  r.version = {kNow - i, static_cast<uint16_t>(65'535 - i)};
  return r;
}

struct Pair {
  PeerCodec a{kSecret, kA, kBootA};
  PeerCodec b{kSecret, kB, kBootA + 1};
  PeerMessage got;
  uint64_t next_raw_seq = 1'000'000;

  PeerError round_trip(const OverrideSyncMessage& m) {
    Bytes out;
    const PeerError e = a.seal(m, kNow, out);
    if (e != PeerError::kOk) return e;
    return b.open(out, kNow, got);
  }
  // An envelope from kA with an OverrideSync payload that `fill` writes, under a's valid tag.
  PeerError open_built(const std::function<void(ps::OverrideSync::Builder)>& fill) {
    capnp::MallocMessageBuilder builder;
    auto env = builder.initRoot<ps::Envelope>();
    env.setSender(kA);
    env.setBootId(kBootA);
    env.setSeq(next_raw_seq++);
    env.setSentMs(kNow);
    env.setKind(ps::Kind::OVERRIDES);
    fill(env.getPayload().initAs<ps::OverrideSync>());
    auto words = capnp::messageToFlatArray(builder);
    auto bytes = words.asBytes();
    Bytes datagram;
    a.TEST_sign(Bytes(bytes.begin(), bytes.end()), datagram);
    return b.open(datagram, kNow, got);
  }
};

void fill_record(ps::OverrideRecord::Builder r, unsigned entries = 1) {
  r.setVersionMs(kNow);
  r.setVersionNode(3);
  r.setDomain("api");
  auto e = r.initEntries(entries);
  for (unsigned i = 0; i < entries; ++i) {
    e[i].setKey("k" + std::to_string(i));
    e[i].setValue("v");
  }
  auto l = r.initLimits(1);
  l[0].setRequests(10);
  l[0].setWindowMs(60'000);
  l[0].setBucketMs(1'000);
}

}  // namespace

TEST_CASE("override_codec: round-trips push, digest and full with every field") {
  Pair p;
  OverrideSyncMessage m;
  m.kind = OverrideSyncKind::kFull;
  m.digest = {3, 0xfedc'ba98'7654'3210ULL};
  m.want_full = true;
  m.records = {full_record(0), full_record(1)};
  OverrideRecord tomb;
  tomb.value.domain = "api";
  tomb.value.entries = {{"user", "gone"}};
  tomb.version = {kNow, 9};
  tomb.deleted = true;
  m.records.push_back(tomb);
  OverrideRecord keep_mode = full_record(2);
  keep_mode.value.mode.reset();
  keep_mode.value.plan.clear();
  keep_mode.value.expires_at_ms = 0;
  m.records.push_back(keep_mode);
  REQUIRE(p.round_trip(m) == PeerError::kOk);
  CHECK(p.got.header.kind == PeerKind::kOverrides);
  CHECK(p.got.overrides.from == kA);
  CHECK(p.got.overrides.kind == OverrideSyncKind::kFull);
  CHECK(p.got.overrides.digest == m.digest);
  CHECK(p.got.overrides.want_full);
  REQUIRE(p.got.overrides.records.size() == m.records.size());
  for (size_t i = 0; i < m.records.size(); ++i) {
    CAPTURE(i);
    CHECK(p.got.overrides.records[i] == m.records[i]);
  }
  for (const auto kind : {OverrideSyncKind::kPush, OverrideSyncKind::kDigest}) {
    OverrideSyncMessage d;
    d.kind = kind;
    d.digest = {0, 0};
    if (kind == OverrideSyncKind::kPush) d.records = {full_record(5)};
    REQUIRE(p.round_trip(d) == PeerError::kOk);
    CHECK(p.got.overrides.kind == kind);
    CHECK(p.got.overrides.records == d.records);
    CHECK_FALSE(p.got.overrides.want_full);
  }
  CHECK(to_string(PeerKind::kOverrides) == "overrides");
}

TEST_CASE("override_codec: a table larger than a datagram is split and every part opens") {
  Pair p;
  std::vector<OverrideRecord> all;
  for (int i = 0; i < 3'000; ++i)
    all.push_back(full_record(i));
  // The largest record the bounds allow: 32 entries of 256-byte keys and values, 8 named limits.
  OverrideRecord big = full_record(0);
  big.value.domain = std::string(256, 'd');
  big.value.entries.clear();
  for (int i = 0; i < 32; ++i)
    big.value.entries.emplace_back(std::string(255, 'k') + char('A' + i), std::string(256, 'v'));
  big.value.limits.clear();
  for (int i = 0; i < 8; ++i) {
    rules::Limit l;
    REQUIRE(
        rules::parse_limit(std::to_string(i + 1) + "/" + std::to_string(i + 1) + "h", 0, l).ok());
    l.name = std::string(256, 'n');
    big.value.limits.push_back(l);
  }
  big.value.plan = std::string(256, 'p');
  REQUIRE(check_record(big, kNow).empty());
  all.insert(all.begin() + 1'500, big);
  std::span<const OverrideRecord> rest(all);
  size_t parts = 0, received = 0;
  while (!rest.empty() && parts < all.size()) {
    const size_t n = fit_overrides(rest, p.a.limits());
    REQUIRE(n > 0);
    CHECK(n <= p.a.limits().max_override_records);
    OverrideSyncMessage m;
    m.kind = OverrideSyncKind::kFull;
    m.records.assign(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(n));
    REQUIRE(p.round_trip(m) == PeerError::kOk);
    CHECK(p.got.overrides.records == m.records);
    received += p.got.overrides.records.size();
    rest = rest.subspan(n);
    ++parts;
  }
  CHECK(received == all.size());
  CHECK(parts >= 6);  // 512 records a part at most
  // A message over one datagram is refused at seal, never sent truncated.
  OverrideSyncMessage too_many;
  too_many.records.assign(all.begin(), all.begin() + 513);
  Bytes out;
  CHECK(p.a.seal(too_many, kNow, out) == PeerError::kTooManyEntries);
  OverrideSyncMessage too_big;
  too_big.records.assign(10, big);
  CHECK(p.a.seal(too_big, kNow, out) == PeerError::kTooLarge);
  CHECK(out.empty());
}

TEST_CASE("override_codec: truncated, oversized and forged datagrams are dropped") {
  Pair p;
  OverrideSyncMessage m;
  m.records = {full_record(1), full_record(2)};
  Bytes good;
  REQUIRE(p.a.seal(m, kNow, good) == PeerError::kOk);
  for (size_t cut : {size_t{1}, size_t{8}, good.size() / 2, good.size() - 33}) {
    CAPTURE(cut);
    Bytes t(good.begin(), good.end() - static_cast<std::ptrdiff_t>(cut));
    const PeerError e = p.b.open(t, kNow, p.got);
    CHECK((e == PeerError::kBadTag || e == PeerError::kMalformed));
  }
  Bytes oversized(70'000, 0);
  CHECK(p.b.open(oversized, kNow, p.got) == PeerError::kTooLarge);
  // Sealed with another secret: a node that is not ours.
  PeerCodec forger("not the cluster's secret at all", kA, kBootA);
  Bytes forged;
  REQUIRE(forger.seal(m, kNow, forged) == PeerError::kOk);
  CHECK(p.b.open(forged, kNow, p.got) == PeerError::kBadTag);
  // Every single flipped bit is caught by the tag.
  for (size_t bit = 0; bit < good.size() * 8; bit += 61) {
    Bytes flipped = good;
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    CHECK(p.b.open(flipped, kNow, p.got) == PeerError::kBadTag);
  }
  // The genuine one opens once; its replay is dropped.
  CHECK(p.b.open(good, kNow, p.got) == PeerError::kOk);
  CHECK(p.b.open(good, kNow, p.got) == PeerError::kReplayed);
}

TEST_CASE("override_codec: payloads over their bounds or with bad enums are dropped by reason") {
  Pair p;
  // The helper itself builds an acceptable message.
  CHECK(p.open_built([](ps::OverrideSync::Builder o) { fill_record(o.initRecords(1)[0]); }) ==
        PeerError::kOk);
  CHECK(p.open_built([](ps::OverrideSync::Builder o) { fill_record(o.initRecords(1)[0], 32); }) ==
        PeerError::kOk);
  CHECK(p.open_built([](ps::OverrideSync::Builder o) { o.initRecords(513); }) ==
        PeerError::kTooManyEntries);
  CHECK(p.open_built([](ps::OverrideSync::Builder o) { fill_record(o.initRecords(1)[0], 33); }) ==
        PeerError::kTooManyEntries);
  CHECK(p.open_built([](ps::OverrideSync::Builder o) {
    auto r = o.initRecords(1)[0];
    fill_record(r);
    r.initLimits(9);
  }) == PeerError::kTooManyEntries);
  CHECK(p.open_built([](ps::OverrideSync::Builder o) {
    auto r = o.initRecords(1)[0];
    fill_record(r);
    r.setDomain(std::string(257, 'd'));
  }) == PeerError::kStringTooLong);
  CHECK(p.open_built([](ps::OverrideSync::Builder o) {
    auto r = o.initRecords(1)[0];
    fill_record(r);
    r.getEntries()[0].setValue(std::string(300, 'v'));
  }) == PeerError::kStringTooLong);
  CHECK(p.open_built([](ps::OverrideSync::Builder o) {
    auto r = o.initRecords(1)[0];
    fill_record(r);
    r.setMode(static_cast<ps::OverrideMode>(4));
  }) == PeerError::kBadField);
  CHECK(p.open_built([](ps::OverrideSync::Builder o) {
    o.setKind(static_cast<ps::OverrideSyncKind>(3));
  }) == PeerError::kBadField);
  // A key far over the bound is refused before it is copied anywhere.
  CHECK(p.open_built([](ps::OverrideSync::Builder o) {
    o.initRecords(1)[0].initEntries(1)[0].setKey(std::string(5'000, 'k'));
  }) == PeerError::kStringTooLong);
}

TEST_CASE("override_codec: random mutations under a valid tag never crash or break the bounds") {
  Pair p;
  OverrideSyncMessage m;
  m.kind = OverrideSyncKind::kFull;
  m.records = {full_record(1), full_record(2), full_record(3)};
  // The message bytes without the tag.
  Bytes sealed;
  REQUIRE(p.a.seal(m, kNow, sealed) == PeerError::kOk);
  const Bytes message(sealed.begin(), sealed.end() - static_cast<std::ptrdiff_t>(kPeerTagBytes));
  std::mt19937_64 rng(7);
  size_t accepted = 0;
  for (int i = 0; i < 3'000; ++i) {
    Bytes mutated = message;
    for (uint64_t k = 1 + rng() % 4; k > 0; --k)
      mutated[rng() % mutated.size()] = static_cast<uint8_t>(rng());
    Bytes datagram;
    p.a.TEST_sign(mutated, datagram);
    PeerCodec fresh(kSecret, kB, kBootA + 1);  // no replay window in the way
    PeerMessage got;
    if (fresh.open(datagram, kNow, got) != PeerError::kOk) continue;
    ++accepted;
    if (got.header.kind != PeerKind::kOverrides) continue;
    CHECK(got.overrides.records.size() <= fresh.limits().max_override_records);
    for (const OverrideRecord& r : got.overrides.records) {
      CHECK(r.value.entries.size() <= OverrideBounds{}.max_entries);
      CHECK(r.value.limits.size() <= OverrideBounds{}.max_limits);
      CHECK(r.value.domain.size() <= OverrideBounds{}.max_string_bytes);
    }
  }
  // Most mutations hit data (numbers, text), which any bytes make valid: accepted, then checked
  // per record by the node (check_record).
  CHECK(accepted > 0);
}
