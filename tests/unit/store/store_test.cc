#include "store/store.h"

#include <doctest/doctest.h>
#include <rocksdb/db.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "one_rule_policy.h"
#include "record_collector.h"
#include "store_open.h"
#include "temp_dir.h"

namespace {

using namespace sluice;
namespace fs = std::filesystem;

constexpr int64_t kT0 = 28'333'333LL * 60'000;  // an epoch-aligned minute
constexpr uint64_t kSeed = 7;

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("sluice-store") {}
};

using testing::open_failure;
using testing::open_store;

// One minute in one bucket: the spec these cases were worked out for (merged totals and records
// per minute bucket, expiry two minutes on), the default before windows under ten minutes got
// ten buckets (window::default_bucket_ms).
const window::WindowSpec kMinute = window::make_spec(60'000, 60'000);

testing::OneRule per_user(uint64_t limit = 100) {
  testing::OneRule o;
  o.domain = "api";
  o.rule = "per-user";
  o.key = "user";
  o.limit = limit;
  o.spec = kMinute;
  return o;
}

struct Checker {
  engine::Engine& e;
  engine::BatchResult out;
  bool check(const std::string& user, int64_t now, uint64_t hits = 1) {
    const rules::Descriptor d[] = {{"user", user}};
    const rules::CheckRequest req{"api", d, hits};
    e.check({&req, 1}, now, out);
    return out.decisions.at(0).allowed;
  }
};

uint64_t counter_of(const engine::Engine& e, const std::string& user) {
  const auto policy = e.policy();
  const rules::Rule& r = policy->rules().domains[0].rules[0];
  const std::string_view values[] = {user};
  return rules::counter_id(rules::key_hash(kSeed, "api", r, values), r.limits[0].spec);
}

}  // namespace

TEST_CASE("a snapshot restored into a new engine gives every counter back") {
  TempDir tmp;
  const auto policy = testing::one_rule_policy(per_user(), kSeed);
  {
    engine::Engine e(policy);
    Checker c{e, {}};
    for (int u = 0; u < 500; ++u)
      for (int i = 0; i <= u % 7; ++i)
        c.check("u" + std::to_string(u), kT0 + 1000);
    auto store = open_store(tmp.sub("db"), true);
    const auto r = store->snapshot(e);
    CHECK(r.ok);
    CHECK(r.written == 500);
    CHECK(r.bytes > 500 * engine::kRecordKeyBytes);
  }
  engine::Engine e2(policy);
  auto store = open_store(tmp.sub("db"), false);
  const auto rr = store->restore(e2, kT0 + 2000).value();
  CHECK(rr.restored == 500);
  CHECK(rr.expired == 0);
  CHECK(rr.malformed == 0);
  for (int u = 0; u < 500; u += 37) {
    const auto v = e2.inspect(counter_of(e2, "u" + std::to_string(u)), kMinute);
    REQUIRE(v.has_value());
    CHECK(v->own.back() == static_cast<uint32_t>(u % 7 + 1));
  }
  // The restored counts decide: user u1 had 2 of 100, so 98 more fit and the 99th does not.
  Checker c{e2, {}};
  CHECK(c.check("u1", kT0 + 3000, 98));
  CHECK_FALSE(c.check("u1", kT0 + 3000));
}

TEST_CASE("a snapshot writes only the counters changed since the previous one") {
  TempDir tmp;
  engine::Engine e(testing::one_rule_policy(per_user(), kSeed));
  Checker c{e, {}};
  for (int u = 0; u < 100; ++u)
    c.check("u" + std::to_string(u), kT0);
  auto store = open_store(tmp.sub("db"), true);
  CHECK(store->snapshot(e).written == 100);
  CHECK(store->snapshot(e).written == 0);
  c.check("u5", kT0 + 10);
  c.check("u6", kT0 + 10);
  c.check("new", kT0 + 10);
  CHECK(store->snapshot(e).written == 3);
  // A full snapshot writes everything regardless.
  const auto full = store->snapshot(e, true);
  CHECK(full.full);
  CHECK(full.written == 101);
  // A denied check that counts nothing changes nothing.
  engine::Engine e2(testing::one_rule_policy(per_user(1), kSeed));
  Checker c2{e2, {}};
  CHECK(c2.check("x", kT0));
  CHECK(store->snapshot(e2).written == 1);
  CHECK_FALSE(c2.check("x", kT0));
  CHECK(store->snapshot(e2).written == 0);
}

TEST_CASE("the memtables stay within the write buffer bound however much the snapshots write") {
  // Regression (found by the key-spray benchmark): the counters' write buffers were 64 MiB, two of
  // them, on top of memory_cap_mb; a spray of 1M keys under a 32 MiB cap ran sluiced at 132 MiB
  // RSS.
  TempDir tmp;
  engine::Engine e(testing::one_rule_policy(per_user(), kSeed));
  Checker c{e, {}};
  constexpr uint64_t kBound = 1ull << 20;
  auto store = open_store(tmp.sub("db"), true, kBound);
  uint64_t written = 0, peak = 0;
  for (int round = 0; round < 8; ++round) {
    for (int u = 0; u < 10'000; ++u)
      c.check("r" + std::to_string(round) + "-" + std::to_string(u), kT0);
    const auto r = store->snapshot(e);
    REQUIRE(r.ok);
    written += r.written;
    peak = std::max(peak, store->memtable_bytes());
  }
  // 80,000 records, several MiB of memtable without the bound, went through 1 MiB of buffers.
  CHECK(written == 80'000);
  CHECK(peak > 0);
  CHECK(peak <= kBound);
  // Nothing was lost on the way: a restore gives every counter back.
  store.reset();
  auto again = open_store(tmp.sub("db"), false, kBound);
  engine::Engine e2(testing::one_rule_policy(per_user(), kSeed));
  CHECK(again->restore(e2, kT0 + 10).value().restored == 80'000);
}

TEST_CASE("what RocksDB holds in memory is reported: the memtables a pass filled, then tables") {
  TempDir tmp;
  engine::Engine e(testing::one_rule_policy(per_user(), kSeed));
  Checker c{e, {}};
  auto store = open_store(tmp.sub("db"), true, 4ull << 20);
  const store::Store::MemoryUsage empty = store->memory_usage();
  for (int u = 0; u < 10'000; ++u)
    c.check("u" + std::to_string(u), kT0);
  REQUIRE(store->snapshot(e).written == 10'000);
  const store::Store::MemoryUsage filled = store->memory_usage();
  // 10,000 records of over 40 bytes each sit in the memtables, as memtable_bytes says.
  CHECK(filled.memtables > empty.memtables + 400'000);
  CHECK(filled.memtables == store->memtable_bytes());
  CHECK(filled.total() == filled.memtables + filled.table_readers + filled.block_cache);
  store->flush();
  const store::Store::MemoryUsage flushed = store->memory_usage();
  CHECK(flushed.memtables < filled.memtables / 10);
  CHECK(flushed.table_readers > filled.table_readers);  // the new table file's reader
}

TEST_CASE("counters the engine drops are deleted from the store, and one created again is kept") {
  TempDir tmp;
  const auto policy = testing::one_rule_policy(per_user(), kSeed);
  engine::Engine e(policy);
  Checker c{e, {}};
  c.check("gone", kT0);
  c.check("again", kT0);
  auto store = open_store(tmp.sub("db"), true);
  CHECK(store->snapshot(e).written == 2);
  // Two minutes later both have expired; the sweep drops them.
  const int64_t later = kT0 + 2 * 60'000;
  CHECK(e.sweep(later) == 2);
  c.check("again", later);  // created again before the next snapshot
  const auto r = store->snapshot(e);
  CHECK(r.erased == 2);
  CHECK(r.written == 1);
  engine::Engine e2(policy);
  const auto rr = store->restore(e2, later).value();
  CHECK(rr.restored == 1);
  CHECK(e2.inspect(counter_of(e2, "again"), kMinute).has_value());
  CHECK_FALSE(e2.inspect(counter_of(e2, "gone"), kMinute).has_value());
}

TEST_CASE("restore skips and deletes records whose window has passed") {
  TempDir tmp;
  const auto policy = testing::one_rule_policy(per_user(), kSeed);
  engine::Engine e(policy);
  Checker c{e, {}};
  c.check("old", kT0);
  c.check("recent", kT0 + 60'000);
  auto store = open_store(tmp.sub("db"), true);
  store->snapshot(e);
  engine::Engine e2(policy);
  const auto rr = store->restore(e2, kT0 + 2 * 60'000 + 5).value();
  CHECK(rr.restored == 1);
  CHECK(rr.expired == 1);
  engine::Engine e3(policy);
  const auto again = store->restore(e3, kT0 + 2 * 60'000 + 5).value();
  CHECK(again.restored == 1);
  CHECK(again.expired == 0);  // deleted by the first restore
}

TEST_CASE("remote totals survive a restart and merging them again counts nothing twice") {
  TempDir tmp;
  const auto policy = testing::one_rule_policy(per_user(), kSeed);
  engine::Engine e(policy);
  Checker c{e, {}};
  c.check("k", kT0, 4);
  const uint64_t ctr = counter_of(e, "k");
  const int64_t b = window::bucket_of(kT0, 60'000);
  const std::vector<engine::RemoteTotal> totals{{ctr, kMinute, 2, b, 30}, {ctr, kMinute, 3, b, 5}};
  CHECK(e.merge(totals, kT0) == 2);
  auto store = open_store(tmp.sub("db"), true);
  store->snapshot(e);
  engine::Engine e2(policy);
  REQUIRE(store->restore(e2, kT0 + 100).ok());
  auto v = e2.inspect(ctr, kMinute);
  REQUIRE(v.has_value());
  CHECK(v->own.back() == 4);
  CHECK(v->others.back() == 35);
  CHECK(e2.merge(totals, kT0 + 100) == 0);  // the same reports again: nothing new
  CHECK(e2.merge(std::vector<engine::RemoteTotal>{{ctr, kMinute, 2, b, 31}}, kT0 + 100) == 1);
  v = e2.inspect(ctr, kMinute);
  CHECK(v->others.back() == 36);
}

TEST_CASE("importing a record into a counter that exists keeps the larger count per bucket") {
  const auto policy = testing::one_rule_policy(per_user(), kSeed);
  engine::Engine a(policy);
  Checker ca{a, {}};
  ca.check("k", kT0, 10);
  testing::RecordCollector sink;
  sink.export_all(a, false);
  REQUIRE(sink.puts.size() == 1);
  engine::Engine b(policy);
  Checker cb{b, {}};
  cb.check("k", kT0, 3);
  const auto& [k, v] = sink.puts[0];
  CHECK(b.import_record(k, v, kT0) == engine::ImportResult::kImported);
  CHECK(b.inspect(counter_of(b, "k"), kMinute)->own.back() == 10);
  CHECK(b.import_record(k, v, kT0) == engine::ImportResult::kImported);  // idempotent
  CHECK(b.inspect(counter_of(b, "k"), kMinute)->own.back() == 10);

  SUBCASE("malformed records change nothing") {
    std::vector<uint8_t> bad = v;
    bad[0] = 99;  // unknown version
    CHECK(b.import_record(k, bad, kT0) == engine::ImportResult::kMalformed);
    bad = v;
    bad.pop_back();  // truncated
    CHECK(b.import_record(k, bad, kT0) == engine::ImportResult::kMalformed);
    bad = v;
    bad.push_back(0);  // trailing bytes
    CHECK(b.import_record(k, bad, kT0) == engine::ImportResult::kMalformed);
    std::vector<uint8_t> bad_key = k;
    bad_key[15] = 7;  // a bucket that does not divide the window: an invalid spec
    CHECK(b.import_record(bad_key, v, kT0) == engine::ImportResult::kMalformed);
    CHECK(b.import_record(std::span<const uint8_t>(k).first(8), v, kT0) ==
          engine::ImportResult::kMalformed);
    CHECK(b.inspect(counter_of(b, "k"), kMinute)->own.back() == 10);
  }
}

TEST_CASE("overrides are stored, listed and deleted") {
  TempDir tmp;
  auto store = open_store(tmp.sub("db"), true);
  rules::Override o;
  o.domain = "api";
  o.entries = {{"user", "42"}, {"ip", "10.0.0.1"}};
  rules::Limit l;
  REQUIRE(rules::parse_limit("500/1m", 0, l).ok());
  o.limits = {l};
  o.mode = rules::Mode::kDryRun;
  o.expires_at_ms = kT0 + 86'400'000;
  CHECK(store->put_override(o).ok());
  rules::Override p;
  p.domain = "api";
  p.entries = {{"client_id", "shop-17"}};
  p.plan = "starter";
  CHECK(store->put_override(p).ok());
  store.reset();

  auto again = open_store(tmp.sub("db"), false);
  auto list = again->load_overrides().value();
  REQUIRE(list.size() == 2);
  const rules::Override* got = nullptr;
  for (const auto& x : list)
    if (x.plan.empty()) got = &x;
  REQUIRE(got != nullptr);
  CHECK(got->domain == "api");
  CHECK(got->entries.size() == 2);
  REQUIRE(got->limits.size() == 1);
  CHECK(got->limits[0].requests == 500);
  CHECK(got->limits[0].spec == l.spec);
  CHECK(got->mode == rules::Mode::kDryRun);
  CHECK(got->expires_at_ms == kT0 + 86'400'000);
  // The same entries in another order name the same override.
  const std::vector<std::pair<std::string, std::string>> reordered{{"ip", "10.0.0.1"},
                                                                   {"user", "42"}};
  CHECK(again->delete_override("api", reordered).ok());
  list = again->load_overrides().value();
  REQUIRE(list.size() == 1);
  CHECK(list[0].plan == "starter");
}

TEST_CASE("override records keep their versions and tombstones, old records read as version 0") {
  TempDir tmp;
  auto store = open_store(tmp.sub("db"), true);
  // A record as nodes before cluster-wide overrides wrote it: no version.
  rules::Override old;
  old.domain = "api";
  old.entries = {{"user", "7"}};
  old.plan = "gold";
  CHECK(store->put_override(old).ok());
  cluster::OverrideRecord set;
  set.value.domain = "api";
  set.value.entries = {{"ip", "10.0.0.1"}, {"user", "42"}};
  rules::Limit l;
  REQUIRE(rules::parse_limit("500/1m", 0, l).ok());
  set.value.limits = {l};
  set.value.mode = rules::Mode::kShadow;
  set.value.expires_at_ms = kT0 + 60'000;
  set.version = {kT0 + 5, 3};
  cluster::OverrideRecord tomb;
  tomb.value.domain = "api";
  tomb.value.entries = {{"user", "gone"}};
  tomb.version = {kT0 + 9, 65'535};
  tomb.deleted = true;
  const std::vector<cluster::OverrideRecord> batch{set, tomb};
  CHECK(store->put_override_records(batch).ok());
  store.reset();

  auto again = open_store(tmp.sub("db"), false);
  auto records = again->load_override_records().value();
  REQUIRE(records.size() == 3);
  const auto find = [&](const std::string& user) -> const cluster::OverrideRecord* {
    for (const auto& r : records) {
      for (const auto& [k, v] : r.value.entries)
        if (k == "user" && v == user) return &r;
    }
    return nullptr;
  };
  const cluster::OverrideRecord* got_old = find("7");
  const cluster::OverrideRecord* got_set = find("42");
  const cluster::OverrideRecord* got_tomb = find("gone");
  REQUIRE(got_old != nullptr);
  REQUIRE(got_set != nullptr);
  REQUIRE(got_tomb != nullptr);
  CHECK(got_old->version == cluster::OverrideVersion{0, 0});
  CHECK_FALSE(got_old->deleted);
  CHECK(got_old->value.plan == "gold");
  CHECK(*got_set == set);
  CHECK(*got_tomb == tomb);
  // load_overrides() lists what is in force: tombstones left out.
  CHECK(again->load_overrides().value().size() == 2);
  // Erasing by id (forgetting records past their horizon).
  const std::vector<std::string> ids{cluster::record_id(tomb),
                                     rules::override_id(old.domain, old.entries)};
  CHECK(again->erase_override_records(ids).ok());
  records = again->load_override_records().value();
  REQUIRE(records.size() == 1);
  CHECK(records[0] == set);
}

TEST_CASE("a missing or empty data directory is created only when asked") {
  TempDir tmp;
  CHECK(open_failure(tmp.sub("nope"), false).find("does not exist") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.sub("nope")));
  fs::create_directories(tmp.sub("empty"));
  CHECK(open_failure(tmp.sub("empty"), false).find("is empty") != std::string::npos);
  CHECK(open_store(tmp.sub("empty"), true) != nullptr);
  CHECK(open_store(tmp.sub("empty"), false) != nullptr);  // now initialized
}

TEST_CASE("a directory that is not a Sluice database is refused with the way out") {
  TempDir tmp;
  fs::create_directories(tmp.sub("other"));
  std::ofstream(tmp.sub("other") + "/notes.txt") << "hello";
  CHECK(open_failure(tmp.sub("other"), true).find("holds no RocksDB database") !=
        std::string::npos);
  // A RocksDB database of someone else's.
  rocksdb::Options opts;
  opts.create_if_missing = true;
  rocksdb::DB* raw = nullptr;
  REQUIRE(rocksdb::DB::Open(opts, tmp.sub("foreign"), &raw).ok());
  delete raw;
  CHECK(open_failure(tmp.sub("foreign"), false).find("not Sluice's") != std::string::npos);
}

TEST_CASE("a corrupt database is a clear error, and --repair-data brings its records back") {
  TempDir tmp;
  const auto policy = testing::one_rule_policy(per_user(), kSeed);
  engine::Engine e(policy);
  Checker c{e, {}};
  for (int u = 0; u < 50; ++u)
    c.check("u" + std::to_string(u), kT0, 3);
  {
    auto store = open_store(tmp.sub("db"), true);
    store->snapshot(e);
    store->flush();  // as a clean stop does
  }
  // Garble the MANIFEST that CURRENT points at.
  std::string manifest;
  std::ifstream(tmp.sub("db") + "/CURRENT") >> manifest;
  REQUIRE_FALSE(manifest.empty());
  {
    std::ofstream f(tmp.sub("db") + "/" + manifest, std::ios::binary | std::ios::trunc);
    f << "this is not a manifest";
  }
  {
    const std::string what = open_failure(tmp.sub("db"), false);
    CHECK(what.find(tmp.sub("db")) != std::string::npos);
    CHECK(what.find("--repair-data") != std::string::npos);
  }
  REQUIRE(store::Store::repair(tmp.sub("db")).ok());
  auto store = open_store(tmp.sub("db"), false);
  engine::Engine e2(policy);
  CHECK(store->restore(e2, kT0 + 10).value().restored == 50);
}

TEST_CASE("a second process cannot open a data directory in use") {
  TempDir tmp;
  auto first = open_store(tmp.sub("db"), true);
  CHECK(open_failure(tmp.sub("db"), false).find("Another process") != std::string::npos);
}

TEST_CASE("the snapshotter writes on its interval, on demand, and once more at stop") {
  TempDir tmp;
  engine::Engine e(testing::one_rule_policy(per_user(), kSeed));
  Checker c{e, {}};
  auto store = open_store(tmp.sub("db"), true);
  int64_t fake_now = 1000;
  store::Snapshotter snap(*store, e, 3'600'000, [&] { return fake_now; });  // interval: never
  c.check("a", kT0);
  const auto r = snap.snapshot_now();
  CHECK(r.written == 1);
  CHECK(snap.status().passes == 1);
  CHECK(snap.status().last_ms == 1000);
  c.check("b", kT0);
  fake_now = 2000;
  const auto last = snap.stop();
  CHECK(last.written == 1);
  CHECK(snap.status().passes == 2);
  CHECK(snap.stop().written == 1);  // idempotent: the final result again
}

TEST_CASE(
    "others' counts in a record without nodes count in the decisions of the node that reads it") {
  // The check path reads others' counts only in slots flagged as holding them
  // (CounterTable::counted_view); a record written with others' counts but no reporting nodes
  // (counts carried over from an override's earlier counter) must flag its slot as well.
  const auto policy = testing::one_rule_policy(per_user(100), kSeed);
  engine::Engine a(policy);
  Checker ca{a, {}};
  REQUIRE(ca.check("k", kT0, 10));
  testing::RecordCollector sink;
  sink.export_all(a, false);
  REQUIRE(sink.puts.size() == 1);
  // The value: version (1), head (8), ring (2), own (4 x ring), others (4 x ring), nodes (2).
  auto [k, v] = sink.puts[0];
  const size_t ring = kMinute.ring_size();
  REQUIRE(v.size() == 1 + 8 + 2 + 8 * ring + 2);
  size_t moved = 0;
  for (size_t p = 0; p < ring; ++p) {
    const size_t own_at = 11 + 4 * p, others_at = 11 + 4 * (ring + p);
    for (size_t b = 0; b < 4; ++b) {
      std::swap(v[own_at + b], v[others_at + b]);
      moved += v[others_at + b];
    }
  }
  REQUIRE(moved == 10);

  SUBCASE("into a new counter") {
    engine::Engine b(policy);
    Checker cb{b, {}};
    REQUIRE(b.import_record(k, v, kT0) == engine::ImportResult::kImported);
    CHECK(b.inspect(counter_of(b, "k"), kMinute)->others.back() == 10);
    CHECK_FALSE(cb.check("k", kT0 + 1, 91));
    CHECK(cb.check("k", kT0 + 1, 90));
    CHECK_FALSE(cb.check("k", kT0 + 2, 1));
  }
  SUBCASE("into a counter that exists") {
    engine::Engine b(policy);
    Checker cb{b, {}};
    REQUIRE(cb.check("k", kT0, 3));
    REQUIRE(b.import_record(k, v, kT0) == engine::ImportResult::kImported);
    CHECK_FALSE(cb.check("k", kT0 + 1, 88));
    CHECK(cb.check("k", kT0 + 1, 87));
    CHECK_FALSE(cb.check("k", kT0 + 2, 1));
  }
}
