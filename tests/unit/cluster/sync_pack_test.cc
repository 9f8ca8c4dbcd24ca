// Unit tests of lib/cluster/sync_pack: the compact form of sync totals against the list form on
// seeded random batches (every total back as it went, the size known total by total), its
// boundaries, hostile bytes, and the batches DeltaSync makes for members that read it and for
// those that do not, sealed and opened by the peer codec.
#include "cluster/sync_pack.h"

#include <doctest/doctest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cluster/delta_sync.h"
#include "cluster/peer_codec.h"
#include "one_rule_policy.h"
#include "peer.capnp.h"

namespace {

using namespace sluice;
using cluster::NodeId;
using cluster::PeerError;
using engine::RemoteTotal;
using window::make_spec;
using window::WindowSpec;
using Bytes = std::vector<uint8_t>;

constexpr std::string_view kSecret = "correct horse battery staple";
constexpr int64_t kNow = 1'700'000'000'000;  // 2023-11-14 22:13:20 UTC

bool same(const RemoteTotal& a, const RemoteTotal& b) {
  return a.counter == b.counter && a.spec.window_ms == b.spec.window_ms &&
         a.spec.bucket_ms == b.spec.bucket_ms && a.node == b.node && a.bucket == b.bucket &&
         a.total == b.total;
}

void check_same(const std::vector<RemoteTotal>& got, const std::vector<RemoteTotal>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(same(got[i], want[i]));
  }
}

// A batch as DeltaSync makes them: runs of totals of one counter (several nodes, a few buckets),
// of a few specs, near now; now and then a far bucket, a large node id or total.
std::vector<RemoteTotal> random_totals(std::mt19937_64& rng, size_t n) {
  const WindowSpec specs[] = {make_spec(1'000), make_spec(60'000), make_spec(3'600'000),
                              make_spec(86'400'000), make_spec(365 * 86'400'000LL)};
  std::vector<RemoteTotal> out;
  while (out.size() < n) {
    RemoteTotal t;
    t.counter = rng();
    t.spec = specs[rng() % std::size(specs)];
    const int64_t now_bucket = kNow / t.spec.bucket_ms;
    const size_t run = 1 + rng() % 12;
    for (size_t i = 0; i < run && out.size() < n; ++i) {
      t.node = rng() % 8 == 0 ? static_cast<uint16_t>(rng()) : static_cast<uint16_t>(rng() % 10);
      t.bucket = now_bucket - static_cast<int64_t>(rng() % (t.spec.buckets() + 1));
      if (rng() % 50 == 0) t.bucket = static_cast<int64_t>(rng() % 1'000'000);
      t.total = rng() % 6 == 0 ? static_cast<uint32_t>(rng()) : static_cast<uint32_t>(rng() % 300);
      out.push_back(t);
    }
  }
  return out;
}

TEST_CASE("sync_pack: random batches come back as they went, and cost() is what add() writes") {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 300; ++round) {
    const auto totals = random_totals(rng, 1 + rng() % 400);
    cluster::TotalsPacker sizer, writer;
    Bytes buf(totals.size() * 40);
    for (const RemoteTotal& t : totals) {
      REQUIRE(cluster::packable(t));
      const size_t cost = sizer.cost(t);
      CHECK(sizer.add(t, nullptr) == cost);
      CHECK(writer.add(t, buf.data()) == cost);
    }
    CHECK(sizer.bytes() == writer.bytes());
    CHECK(cluster::packed_bytes(totals) == sizer.bytes());
    Bytes packed;
    cluster::pack_totals(totals, packed);
    REQUIRE(packed.size() == writer.bytes());
    CHECK(std::equal(packed.begin(), packed.end(), buf.begin()));
    std::vector<RemoteTotal> got;
    REQUIRE(cluster::unpack_totals(packed, 2'048, got) == PeerError::kOk);
    check_same(got, totals);
  }
}

TEST_CASE("sync_pack: an owner's push of ten nodes' totals costs a fifth of the list form") {
  std::vector<RemoteTotal> push;
  for (uint16_t node = 1; node <= 10; ++node)
    push.push_back({0x1234'5678'9abc'def0, make_spec(1'000), node, kNow / 100, 40u + node});
  // The first group of a batch carries its start as ms since the epoch (6 bytes today).
  const size_t packed = cluster::packed_bytes(push);
  CHECK(packed <= 21 + 9 * 3);
  CHECK(packed * 6 <= push.size() * 32);
  CHECK(cluster::packed_bytes({push.data(), 1}) <= 21);
  // A later counter's total of the same bucket: counter, start, count, node and total.
  std::vector<RemoteTotal> two = {push[0], push[1]};
  two[1].counter = 77;
  CHECK(cluster::packed_bytes(two) - cluster::packed_bytes({push.data(), 1}) <= 13);
}

TEST_CASE("sync_pack: boundaries of every field come back exactly") {
  const WindowSpec day = make_spec(86'400'000);
  const WindowSpec sec = make_spec(1'000);
  const int64_t max_bucket = cluster::kMaxStartMs / sec.bucket_ms;
  std::vector<RemoteTotal> totals = {
      {~uint64_t{0}, sec, 0xffff, max_bucket, 0xffff'ffffu},
      {~uint64_t{0}, sec, 0, -max_bucket, 0},  // a step across the whole range
      {0, day, 0, 0, 1},
      {0, day, 1, cluster::kMaxStartMs / day.bucket_ms, 2},
      {0, make_spec(365 * 86'400'000LL), 3, kNow / 86'400'000, 3},  // over the list form's 32 bits
  };
  // More than one group's worth of one counter: split into groups of at most 255.
  for (uint32_t i = 0; i < 600; ++i)
    totals.push_back({99, sec, static_cast<uint16_t>(i % 5), kNow / 100 - i % 11, i});
  for (const RemoteTotal& t : totals)
    REQUIRE(cluster::packable(t));
  Bytes packed;
  cluster::pack_totals(totals, packed);
  std::vector<RemoteTotal> got;
  REQUIRE(cluster::unpack_totals(packed, 2'048, got) == PeerError::kOk);
  check_same(got, totals);
  // The receiver's bound on totals holds across groups, and counts what `out` held before.
  got.clear();
  CHECK(cluster::unpack_totals(packed, totals.size() - 1, got) == PeerError::kTooManyEntries);
  got.assign(10, RemoteTotal{});
  CHECK(cluster::unpack_totals(packed, totals.size() + 9, got) == PeerError::kTooManyEntries);
  got.assign(10, RemoteTotal{});
  CHECK(cluster::unpack_totals(packed, totals.size() + 10, got) == PeerError::kOk);
  // Outside the range: no packed form.
  CHECK_FALSE(cluster::packable({1, sec, 1, max_bucket + 1, 1}));
  CHECK_FALSE(cluster::packable({1, sec, 1, -max_bucket - 1, 1}));
  CHECK_FALSE(cluster::packable({1, WindowSpec{1'000, 0}, 1, 0, 1}));
}

TEST_CASE("sync_pack: hostile bytes are refused with a reason, never read past their end") {
  const Bytes good = [] {
    Bytes b;
    std::mt19937_64 rng(3);
    cluster::pack_totals(random_totals(rng, 40), b);
    return b;
  }();
  std::vector<RemoteTotal> got;
  CHECK(cluster::unpack_totals({}, 2'048, got) == PeerError::kMalformed);
  // Every prefix is refused or is a prefix of the groups: never a total that was not sent.
  std::vector<RemoteTotal> all;
  REQUIRE(cluster::unpack_totals(good, 2'048, all) == PeerError::kOk);
  for (size_t n = 1; n < good.size(); ++n) {
    got.clear();
    const PeerError e = cluster::unpack_totals({good.data(), n}, 2'048, got);
    CHECK((e == PeerError::kOk || e == PeerError::kMalformed));
    REQUIRE(got.size() <= all.size());
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(same(got[i], all[i]));
  }
  const auto open = [&](Bytes b) {
    got.clear();
    return cluster::unpack_totals(b, 2'048, got);
  };
  const Bytes counter(8, 0x11);
  const auto with = [&](std::initializer_list<uint8_t> head, std::initializer_list<uint8_t> tail) {
    Bytes b(head);
    b.insert(b.end(), counter.begin(), counter.end());
    b.insert(b.end(), tail);
    return b;
  };
  // flags 3, counter, window 1000 (0xe8 0x07), bucket 100 (0x64), start 0, count, node, total
  CHECK(open(with({3}, {0xe8, 0x07, 0x64, 0, 1, 5, 9})) == PeerError::kOk);
  REQUIRE(got.size() == 1);
  CHECK(got[0].bucket == 0);
  CHECK(got[0].total == 9);
  CHECK(open({2, 0xe8, 0x07, 0x64, 0, 1, 5, 9}) ==
        PeerError::kBadField);  // first group: no counter
  CHECK(open(with({7}, {0xe8, 0x07, 0x64, 0, 1, 5, 9})) == PeerError::kBadField);   // unknown flag
  CHECK(open(with({3}, {0xe8, 0x07, 0x64, 0, 0})) == PeerError::kMalformed);        // count 0
  CHECK(open(with({3}, {0xe8, 0x07, 0x07, 0, 1, 5, 9})) == PeerError::kBadWindow);  // 7 ms buckets
  CHECK(open(with({3}, {0xe8, 0x07, 0x64, 2, 1, 5, 9})) == PeerError::kBadField);   // start 1 ms
  CHECK(open(with({3}, {0xe8, 0x07, 0x64, 0, 1, 0xff, 0xff, 0x04, 9})) ==
        PeerError::kBadField);  // node 2^16 + ...
  CHECK(open(with({3}, {0xe8, 0x07, 0x64, 0, 1, 5, 0x80, 0x80, 0x80, 0x80, 0x10})) ==
        PeerError::kBadField);  // total 2^32
  // An 11-byte varint, and one whose tenth byte carries bits past 64.
  Bytes long_varint = with({3}, {0xe8, 0x07, 0x64});
  long_varint.insert(long_varint.end(), 10, 0x80);
  long_varint.push_back(0);
  CHECK(open(long_varint) == PeerError::kMalformed);
  Bytes wide = with({3}, {0xe8, 0x07, 0x64});
  wide.insert(wide.end(), 9, 0xff);
  wide.push_back(0x02);
  CHECK(open(wide) == PeerError::kMalformed);
  // A start out of range, and a step that would leave it.
  Bytes far = with({3}, {0xe8, 0x07, 0x64});
  far.insert(far.end(), {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01});  // 2^63 zz
  far.insert(far.end(), {1, 5, 9});
  CHECK(open(far) == PeerError::kBadField);
  Bytes step = with({3}, {0xe8, 0x07, 0x64, 0, 2, 5, 9, 5});
  step.insert(step.end(), {0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 9});
  CHECK(open(step) == PeerError::kBadField);
  // Random mutations: whatever comes out is within the rules (ASan watches the reads).
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20'000; ++i) {
    Bytes b = good;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k)
      b[rng() % b.size()] = static_cast<uint8_t>(rng());
    if (rng() % 4 == 0) b.resize(rng() % b.size() + 1);
    got.clear();
    if (cluster::unpack_totals(b, 64, got) != PeerError::kOk) continue;
    CHECK(got.size() <= 64);
    for (const RemoteTotal& t : got) {
      CHECK(window::validate(t.spec).ok());
      CHECK(cluster::packable(t));
    }
  }
}

// ---- sealed by the codec -----------------------------------------------------------------------

struct Pair {
  cluster::PeerCodec a{kSecret, 1, 1'699'999'000'000};
  cluster::PeerCodec b{kSecret, 2, 1'700'000'000'001};
  cluster::PeerMessage got;
  Bytes out;
  PeerError seal_open(const cluster::SyncBatch& batch) {
    if (PeerError e = a.seal(batch, kNow, out); e != PeerError::kOk) return e;
    return b.open(out, kNow, got);
  }
};

TEST_CASE("sync_pack: a compact batch is sealed packed, opened with the same totals, and smaller") {
  Pair p;
  std::mt19937_64 rng(9);
  cluster::SyncBatch batch;
  batch.handoff = true;
  batch.heard_ms = kNow - 3;
  batch.totals = random_totals(rng, 40);
  for (auto& t : batch.totals)
    t.spec = make_spec(3'600'000);  // within the list form's 32 bits
  REQUIRE(p.seal_open(batch) == PeerError::kOk);
  const size_t list_bytes = p.out.size();
  CHECK_FALSE(p.got.sync.compact);
  batch.compact = true;
  REQUIRE(p.seal_open(batch) == PeerError::kOk);
  CHECK(p.got.sync.compact);
  CHECK(p.got.sync.handoff);
  CHECK(p.got.sync.heard_ms == kNow - 3);
  check_same(p.got.sync.totals, batch.totals);
  CHECK(p.out.size() == cluster::sync_packed_datagram_bytes(cluster::packed_bytes(batch.totals)));
  CHECK(p.out.size() * 2 < list_bytes);
  // An empty compact batch (a heartbeat) is the list form's, byte for byte the same size.
  batch.totals.clear();
  REQUIRE(p.seal_open(batch) == PeerError::kOk);
  CHECK(p.out.size() == cluster::sync_datagram_bytes(0));
  CHECK_FALSE(p.got.sync.compact);
}

TEST_CASE("sync_pack: windows over 32 bits of ms go packed, and are refused as a list") {
  Pair p;
  cluster::SyncBatch batch;
  batch.totals = {{5, make_spec(365 * 86'400'000LL), 1, kNow / 86'400'000, 7}};
  CHECK(p.seal_open(batch) == PeerError::kBadWindow);  // its window would arrive cut
  batch.compact = true;
  REQUIRE(p.seal_open(batch) == PeerError::kOk);
  check_same(p.got.sync.totals, batch.totals);
  // A total without a packed form sends the batch as a list.
  batch.totals = {{5, make_spec(60'000), 1, INT64_MAX, 7}};
  REQUIRE(p.seal_open(batch) == PeerError::kOk);
  CHECK_FALSE(p.got.sync.compact);
  check_same(p.got.sync.totals, batch.totals);
}

TEST_CASE("sync_pack: a batch with totals both listed and packed is dropped as bad_field") {
  Pair p;
  capnp::MallocMessageBuilder builder;
  auto env = builder.initRoot<sluice::schema::peer::Envelope>();
  env.setSender(1);
  env.setBootId(1'699'999'000'000);
  env.setSeq(1);
  env.setSentMs(kNow);
  env.setKind(sluice::schema::peer::Kind::SYNC);
  auto batch = env.getPayload().initAs<sluice::schema::peer::SyncBatch>();
  auto list = batch.initTotals(1);
  list[0].setCounter(5);
  list[0].setWindowMs(60'000);
  list[0].setBucketMs(6'000);
  list[0].setBucket(kNow / 6'000);
  list[0].setNode(1);
  list[0].setTotal(3);
  Bytes packed;
  cluster::pack_totals(std::vector<RemoteTotal>{{6, make_spec(60'000), 1, kNow / 6'000, 4}},
                       packed);
  batch.setPacked(kj::arrayPtr(packed.data(), packed.size()));
  const auto words = capnp::messageToFlatArray(builder);
  const auto bytes = words.asBytes();
  Bytes datagram;
  p.a.TEST_sign({bytes.begin(), bytes.size()}, datagram);
  CHECK(p.b.open(datagram, kNow, p.got) == PeerError::kBadField);
  // The same with the packed totals alone is opened.
  builder.getRoot<sluice::schema::peer::Envelope>().setSeq(2);
  batch.disownTotals();
  const auto alone_words = capnp::messageToFlatArray(builder);
  const auto alone = alone_words.asBytes();
  p.a.TEST_sign({alone.begin(), alone.size()}, datagram);
  REQUIRE(p.b.open(datagram, kNow, p.got) == PeerError::kOk);
  REQUIRE(p.got.sync.totals.size() == 1);
  CHECK(p.got.sync.totals[0].counter == 6);
}

TEST_CASE("sync_pack: sync_packed_within(n) packed bytes seal within n bytes") {
  for (const size_t bound : {cluster::kSyncDatagramBytes, size_t{512}, size_t{8'192}}) {
    CAPTURE(bound);
    const size_t within = cluster::sync_packed_within(bound);
    CHECK(cluster::sync_packed_datagram_bytes(within) <= bound);
    CHECK(cluster::sync_packed_datagram_bytes(within + 8) > bound);
  }
  CHECK(cluster::sync_packed_within(1) == 0);
}

// ---- DeltaSync's batches -----------------------------------------------------------------------

// Node 1 counts `keys` keys of one rule (a limit of `spec`) at kNow; its changed pass sends them
// to the other nodes of a 4-node ring, node `list_node` of which reads only the list form.
struct PassAt1 {
  PassAt1(WindowSpec spec, size_t keys, NodeId list_node) {
    testing::OneRule o;
    o.spec = spec;
    o.domain = "d";
    o.key = "k";
    o.limit = 1'000'000;
    o.consistency = rules::Consistency::kGossip;
    engine::EngineOptions eo;
    eo.node_id = 1;
    engine = std::make_unique<engine::Engine>(testing::one_rule_policy(o, 11), eo);
    sync = std::make_unique<cluster::DeltaSync>(
        *engine, 1, cluster::sync_totals_within(cluster::kSyncDatagramBytes));
    sync->set_compact([list_node](NodeId to) { return to != list_node; },
                      cluster::sync_packed_within(cluster::kSyncDatagramBytes));
    for (NodeId id = 1; id <= 4; ++id)
      ring.add(id, "node-" + std::to_string(id));
    engine::BatchResult res;
    for (size_t k = 0; k < keys; ++k) {
      const std::string key = "key-" + std::to_string(k);
      const rules::Descriptor d[] = {{"k", key}};
      const rules::CheckRequest req{"d", d, 1 + k % 3};
      engine->check({&req, 1}, kNow, res);
    }
  }
  // Each batch sealed by a codec and opened by another, as a node would.
  void pass() {
    sync->pass(
        ring, cluster::DeltaSync::Mode::kChanged, false,
        [&](NodeId to, cluster::SyncBatch& b) {
          Bytes out;
          REQUIRE(codec.seal(b, kNow, out) == PeerError::kOk);
          sizes[to].push_back(out.size());
          REQUIRE(receiver.open(out, kNow, got) == PeerError::kOk);
          CHECK(got.sync.compact == b.compact);
          for (const RemoteTotal& t : got.sync.totals)
            received[to].insert({t.counter, t.node, t.bucket, t.total});
        },
        nullptr, kNow);
  }
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<cluster::DeltaSync> sync;
  cluster::HashRing ring{2};
  cluster::PeerCodec codec{kSecret, 1, 1'699'999'000'000};
  cluster::PeerCodec receiver{kSecret, 9, 1'700'000'000'001};
  cluster::PeerMessage got;
  std::map<NodeId, std::vector<size_t>> sizes;
  std::map<NodeId, std::set<std::tuple<uint64_t, uint16_t, int64_t, uint32_t>>> received;
};

TEST_CASE("sync_pack: DeltaSync packs batches to the members that read it, within a datagram") {
  PassAt1 run(make_spec(60'000), 3'000, 4);
  run.pass();
  REQUIRE(run.sizes.size() == 3);
  const auto& stats = run.sync->stats();
  CHECK(stats.list_skipped == 0);
  for (const auto& [to, sizes] : run.sizes) {
    CAPTURE(to);
    for (const size_t s : sizes)
      CHECK(s <= cluster::kSyncDatagramBytes);
  }
  // Node 1's own totals of the keys each node holds: the packed nodes fit several times as many
  // totals in a datagram as the list node.
  const auto per_datagram = [&](NodeId to) {
    return static_cast<double>(run.received[to].size()) / static_cast<double>(run.sizes[to].size());
  };
  CHECK(per_datagram(2) > 2.0 * per_datagram(4));
  CHECK(per_datagram(3) > 2.0 * per_datagram(4));
  CHECK(run.received[4].size() > 500);  // the list node got its keys all the same
}

TEST_CASE("sync_pack: a limit over 49.7 days reaches the members that read packed totals only") {
  PassAt1 run(make_spec(365 * 86'400'000LL), 200, 4);
  run.pass();
  const auto& stats = run.sync->stats();
  CHECK(stats.list_skipped > 0);
  CHECK(run.received[4].empty());
  CHECK(run.received[2].size() + run.received[3].size() > 0);
}

}  // namespace
