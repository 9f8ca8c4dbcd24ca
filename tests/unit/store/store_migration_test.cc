// The overrides' database of its own (store.h, data format 2): a format 1 directory (overrides in
// a column family of the counters' database) opens with its overrides moved exactly once, an
// interrupted move completes at the next open without losing or resurrecting anything, and a
// missing, locked or corrupt overrides database is an error that names it.
#include "store/store.h"

#include <doctest/doctest.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/release.h"
#include "one_rule_policy.h"
#include "store_open.h"
#include "temp_dir.h"

namespace {

using namespace sluice;
namespace fs = std::filesystem;

constexpr int64_t kT0 = 28'333'333LL * 60'000;  // an epoch-aligned minute
constexpr uint64_t kSeed = 7;
constexpr int kUsers = 50;

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("sluice-store-mig") {}
};

using testing::open_failure;
using testing::open_store;

std::shared_ptr<const rules::Policy> policy() {
  testing::OneRule o;
  o.domain = "api";
  o.rule = "per-user";
  o.key = "user";
  o.limit = 100;
  return testing::one_rule_policy(o, kSeed);
}

// An engine holding kUsers counters (user u counted u % 5 + 1 times).
std::unique_ptr<engine::Engine> counted_engine() {
  auto e = std::make_unique<engine::Engine>(policy());
  engine::BatchResult out;
  for (int u = 0; u < kUsers; ++u) {
    const std::string user = "u" + std::to_string(u);
    const rules::Descriptor d[] = {{"user", user}};
    const rules::CheckRequest req{"api", d, static_cast<uint64_t>(u % 5 + 1)};
    e->check({&req, 1}, kT0 + 1000, out);
  }
  return e;
}

using Entries = std::vector<std::pair<std::string, std::string>>;

// Override records as a sluiced before format 2 stored them (store.cc, record_to_json): keyed by
// rules::override_id, the override as JSON; an unversioned one (written before cluster-wide
// overrides), a versioned set and a tombstone.
std::map<std::string, std::string> format1_records() {
  return {
      {rules::override_id("api", Entries{{"user", "7"}}),
       R"({"domain":"api","entries":[["user","7"]],"expires_at_ms":0,"limits":[],"plan":"gold"})"},
      {rules::override_id("api", Entries{{"user", "42"}}),
       R"({"domain":"api","entries":[["user","42"]],"expires_at_ms":0,"limits":[{"bucket_ms":1000,)"
       R"("name":"","requests":500,"window_ms":60000}],"mode":"shadow","plan":"",)"
       R"("version_ms":1700000000005,"version_node":3})"},
      {rules::override_id("api", Entries{{"user", "gone"}}),
       R"({"deleted":true,"domain":"api","entries":[["user","gone"]],"expires_at_ms":0,)"
       R"("limits":[],"plan":"","version_ms":1700000000009,"version_node":65535})"},
  };
}

std::vector<rocksdb::ColumnFamilyDescriptor> format1_families() {
  return {{rocksdb::kDefaultColumnFamilyName, {}}, {"counters", {}}, {"overrides", {}}};
}

// The format 1 database in `dir` opened raw, as the older sluiced had it.
struct Format1Db {
  explicit Format1Db(const std::string& dir) {
    rocksdb::DBOptions o;
    o.create_if_missing = true;
    o.create_missing_column_families = true;
    rocksdb::DB* raw = nullptr;
    REQUIRE(rocksdb::DB::Open(o, dir, format1_families(), &handles, &raw).ok());
    db.reset(raw);
  }
  ~Format1Db() {
    for (auto* h : handles)
      db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    db->Close().PermitUncheckedError();
  }
  void put(int family, const std::string& k, const std::string& v) {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    REQUIRE(db->Put(wo, handles[static_cast<size_t>(family)], k, v).ok());
  }
  void erase(int family, const std::string& k) {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    REQUIRE(db->Delete(wo, handles[static_cast<size_t>(family)], k).ok());
  }
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;  // default, counters, overrides
};

// Snapshot records into the raw database's counters family, as the older Store::snapshot did.
class RawSink : public engine::RecordSink {
 public:
  explicit RawSink(Format1Db& db) : db_(db) {}
  void put(std::span<const uint8_t> key, std::span<const uint8_t> value) override {
    REQUIRE(batch_.Put(db_.handles[1], as_slice(key), as_slice(value)).ok());
  }
  void erase(std::span<const uint8_t> key) override {
    REQUIRE(batch_.Delete(db_.handles[1], as_slice(key)).ok());
  }
  void write() { REQUIRE(db_.db->Write(rocksdb::WriteOptions(), &batch_).ok()); }

 private:
  static rocksdb::Slice as_slice(std::span<const uint8_t> b) {
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }
  Format1Db& db_;
  rocksdb::WriteBatch batch_;
};

// Writes a data directory as the older sluiced left it: marker "1", the counters of
// counted_engine() and format1_records() in the counters' database.
void write_format1_dir(const std::string& dir) {
  Format1Db db(dir);
  db.put(0, "sluice.format", "1");
  auto e = counted_engine();
  engine::ExportCursor cursor;
  cursor.restart(true);
  RawSink sink(db);
  for (int steps = 0; steps < 10'000 && !e->export_step(cursor, 256, sink); ++steps) {
  }
  sink.write();
  for (const auto& [k, v] : format1_records())
    db.put(2, k, v);
}

std::vector<std::string> families_of(const std::string& dir) {
  std::vector<std::string> names;
  REQUIRE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir, &names).ok());
  std::sort(names.begin(), names.end());
  return names;
}

// The counters' database's default column family: key's value (nullopt: absent), or with
// `set` that value written first (an empty string deletes the key), as another release left it.
std::optional<std::string> default_key(const std::string& dir, const std::string& key,
                                       std::optional<std::string> set = std::nullopt) {
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const std::string& name : families_of(dir))
    families.emplace_back(name, rocksdb::ColumnFamilyOptions());
  rocksdb::DB* raw = nullptr;
  REQUIRE(rocksdb::DB::Open(rocksdb::DBOptions(), dir, families, &handles, &raw).ok());
  if (set && set->empty()) REQUIRE(raw->Delete(rocksdb::WriteOptions(), key).ok());
  if (set && !set->empty()) REQUIRE(raw->Put(rocksdb::WriteOptions(), key, *set).ok());
  std::string v;
  const rocksdb::Status s = raw->Get(rocksdb::ReadOptions(), key, &v);
  for (auto* h : handles)
    raw->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  delete raw;
  if (s.IsNotFound()) return std::nullopt;
  REQUIRE(s.ok());
  return v;
}

std::string marker_of(const std::string& dir) {
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  for (const std::string& name : families_of(dir))
    families.emplace_back(name, rocksdb::ColumnFamilyOptions());
  rocksdb::DB* raw = nullptr;
  REQUIRE(rocksdb::DB::OpenForReadOnly(rocksdb::DBOptions(), dir, families, &handles, &raw).ok());
  std::string v;
  const rocksdb::Status s = raw->Get(rocksdb::ReadOptions(), "sluice.format", &v);
  for (auto* h : handles)
    raw->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  delete raw;
  REQUIRE(s.ok());
  return v;
}

const cluster::OverrideRecord* find_user(const std::vector<cluster::OverrideRecord>& records,
                                         const std::string& user) {
  for (const auto& r : records) {
    for (const auto& [k, v] : r.value.entries)
      if (k == "user" && v == user) return &r;
  }
  return nullptr;
}

// Everything format1_records() and write_format1_dir() put there, read through the Store.
void check_format1_content(store::Store& s) {
  const auto records = s.load_override_records().value();
  CHECK(records.size() == 3);
  const auto* gold = find_user(records, "7");
  const auto* set = find_user(records, "42");
  const auto* tomb = find_user(records, "gone");
  REQUIRE(gold != nullptr);
  REQUIRE(set != nullptr);
  REQUIRE(tomb != nullptr);
  CHECK(gold->value.plan == "gold");
  CHECK(gold->version == cluster::OverrideVersion{0, 0});
  CHECK_FALSE(gold->deleted);
  REQUIRE(set->value.limits.size() == 1);
  CHECK(set->value.limits[0].requests == 500);
  CHECK(set->value.mode == rules::Mode::kShadow);
  CHECK(set->version == cluster::OverrideVersion{1700000000005, 3});
  CHECK(tomb->deleted);
  CHECK(tomb->version == cluster::OverrideVersion{1700000000009, 65535});
  CHECK(s.load_overrides().value().size() == 2);
  engine::Engine e(policy());
  const auto r = s.restore(e, kT0 + 2000).value();
  CHECK(r.restored == kUsers);
  CHECK(r.malformed == 0);
}

// After a completed move: the counters' database has no overrides family and says format 2.
void check_moved(const std::string& dir) {
  CHECK(families_of(dir) == std::vector<std::string>{"counters", "default"});
  CHECK(marker_of(dir) == "2");
  CHECK(fs::exists(fs::path(store::Store::overrides_dir(dir)) / "CURRENT"));
}

// A deleted override stays deleted across restarts: the old family is not read again.
void check_delete_sticks(const std::string& dir) {
  {
    auto s = open_store(dir, false);
    CHECK(s->delete_override("api", Entries{{"user", "7"}}).ok());
  }
  for (int restart = 0; restart < 2; ++restart) {
    auto s = open_store(dir, false);
    const auto records = s->load_override_records().value();
    CHECK(records.size() == 2);
    CHECK(find_user(records, "7") == nullptr);
  }
}

struct Crash : std::runtime_error {
  Crash() : std::runtime_error("crash injected") {}
};

}  // namespace

TEST_CASE("a format 1 data directory opens with its overrides moved into their own database") {
  TempDir tmp;
  const std::string dir = tmp.sub("data");
  write_format1_dir(dir);
  {
    auto s = open_store(dir, false);
    check_format1_content(*s);
    const auto usage = s->disk_usage();
    CHECK(usage.counters > 0);
    CHECK(usage.overrides > 0);
    CHECK(s->disk_bytes() == usage.total());
  }
  check_moved(dir);
  // Opened again: nothing to move, the same content.
  {
    auto s = open_store(dir, false);
    check_format1_content(*s);
  }
  check_delete_sticks(dir);
}

TEST_CASE("a move interrupted after either step completes at the next open, losing nothing") {
  for (int step = 1; step <= 2; ++step) {
    CAPTURE(step);
    TempDir tmp;
    const std::string dir = tmp.sub("data");
    write_format1_dir(dir);
    int reached = 0;
    CHECK_THROWS_AS(store::Store::TEST_open_migrating(dir,
                                                      [&](int at) {
                                                        reached = at;
                                                        if (at == step) throw Crash();
                                                      }),
                    Crash);
    CHECK(reached == step);
    // The crash left the old family in place (dropping it is the last step).
    CHECK(families_of(dir) == std::vector<std::string>{"counters", "default", "overrides"});
    CHECK(marker_of(dir) == (step == 1 ? "1" : "2"));
    {
      auto s = open_store(dir, false);
      check_format1_content(*s);
    }
    check_moved(dir);
    check_delete_sticks(dir);
  }
}

TEST_CASE("after an interrupted move the old family is copied exactly: nothing deleted returns") {
  TempDir tmp;
  const std::string dir = tmp.sub("data");
  write_format1_dir(dir);
  CHECK_THROWS_AS(store::Store::TEST_open_migrating(dir,
                                                    [](int at) {
                                                      if (at == 1) throw Crash();
                                                    }),
                  Crash);
  // An older sluiced ran on the directory in between (a rollback): it deleted one override and
  // set another, in the old family only.
  {
    Format1Db db(dir);
    db.erase(2, rules::override_id("api", Entries{{"user", "gone"}}));
    db.put(2, rules::override_id("api", Entries{{"user", "new"}}),
           R"({"domain":"api","entries":[["user","new"]],"expires_at_ms":0,"limits":[],)"
           R"("plan":"silver"})");
  }
  auto s = open_store(dir, false);
  const auto records = s->load_override_records().value();
  CHECK(records.size() == 3);
  CHECK(find_user(records, "gone") == nullptr);
  REQUIRE(find_user(records, "new") != nullptr);
  CHECK(find_user(records, "new")->value.plan == "silver");
  CHECK(find_user(records, "7") != nullptr);
  CHECK(find_user(records, "42") != nullptr);
}

TEST_CASE("a move past its marker whose overrides database went missing is refused, not emptied") {
  TempDir tmp;
  const std::string dir = tmp.sub("data");
  write_format1_dir(dir);
  CHECK_THROWS_AS(store::Store::TEST_open_migrating(dir,
                                                    [](int at) {
                                                      if (at == 2) throw Crash();
                                                    }),
                  Crash);
  const std::string ovdir = store::Store::overrides_dir(dir);
  fs::remove_all(ovdir);
  CHECK(open_failure(dir, false).find(ovdir) != std::string::npos);
  // Nothing was created or dropped: the old family still holds the overrides, and repair turns
  // the directory back to format 1, so the next open moves them again.
  CHECK_FALSE(fs::exists(ovdir));
  CHECK(families_of(dir) == std::vector<std::string>{"counters", "default", "overrides"});
  REQUIRE(store::Store::repair(dir).ok());
  CHECK(marker_of(dir) == "1");
  {
    auto s = open_store(dir, false);
    check_format1_content(*s);
  }
  check_moved(dir);
}

TEST_CASE("a new data directory keeps its overrides apart from the counters") {
  TempDir tmp;
  const std::string dir = tmp.sub("data");
  {
    auto s = open_store(dir, true);
    rules::Override o;
    o.domain = "api";
    o.entries = {{"user", "1"}};
    o.plan = "gold";
    CHECK(s->put_override(o).ok());
    auto e = counted_engine();
    CHECK(s->snapshot(*e).written == kUsers);
  }
  check_moved(dir);
  CHECK(families_of(store::Store::overrides_dir(dir)) ==
        std::vector<std::string>{"default", "overrides"});
  auto s = open_store(dir, false);
  CHECK(s->load_overrides().value().size() == 1);
  engine::Engine e(policy());
  CHECK(s->restore(e, kT0 + 2000).value().restored == kUsers);
}

TEST_CASE("a format 2 directory without its overrides database is refused, repair makes one") {
  TempDir tmp;
  const std::string dir = tmp.sub("data");
  {
    auto s = open_store(dir, true);
    rules::Override o;
    o.domain = "api";
    o.entries = {{"user", "1"}};
    o.plan = "gold";
    CHECK(s->put_override(o).ok());
    auto e = counted_engine();
    s->snapshot(*e);
  }
  const std::string ovdir = store::Store::overrides_dir(dir);
  fs::remove_all(ovdir);
  {
    // `create` makes new directories only, never this.
    const std::string what = open_failure(dir, true);
    CHECK(what.find(ovdir) != std::string::npos);
    CHECK(what.find("--repair-data") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(ovdir));
  REQUIRE(store::Store::repair(dir).ok());
  auto s = open_store(dir, false);
  CHECK(s->load_overrides().value().empty());
  engine::Engine e(policy());
  CHECK(s->restore(e, kT0 + 2000).value().restored == kUsers);
}

TEST_CASE("an overrides database held by another process is an error naming it") {
  TempDir tmp;
  const std::string dir = tmp.sub("data");
  open_store(dir, true).reset();
  const std::string ovdir = store::Store::overrides_dir(dir);
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  REQUIRE(rocksdb::DB::Open(rocksdb::DBOptions(), ovdir,
                            {{rocksdb::kDefaultColumnFamilyName, {}}, {"overrides", {}}}, &handles,
                            &raw)
              .ok());
  {
    const std::string what = open_failure(dir, false);
    CHECK(what.find("Another process") != std::string::npos);
    CHECK(what.find(ovdir) != std::string::npos);
  }
  for (auto* h : handles)
    raw->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  delete raw;
  // The failed open let go of the counters' database too.
  CHECK(open_store(dir, false) != nullptr);
}

TEST_CASE("a corrupt overrides database is an error naming it, and repair brings them back") {
  TempDir tmp;
  const std::string dir = tmp.sub("data");
  {
    auto s = open_store(dir, true);
    for (int i = 0; i < 5; ++i) {
      rules::Override o;
      o.domain = "api";
      o.entries = {{"user", std::to_string(i)}};
      o.plan = "gold";
      CHECK(s->put_override(o).ok());
    }
  }
  const std::string ovdir = store::Store::overrides_dir(dir);
  std::string manifest;
  std::ifstream(ovdir + "/CURRENT") >> manifest;
  REQUIRE_FALSE(manifest.empty());
  {
    std::ofstream f(ovdir + "/" + manifest, std::ios::binary | std::ios::trunc);
    f << "this is not a manifest";
  }
  {
    const std::string what = open_failure(dir, false);
    CHECK(what.find(ovdir) != std::string::npos);
    CHECK(what.find("--repair-data") != std::string::npos);
  }
  REQUIRE(store::Store::repair(dir).ok());
  auto s = open_store(dir, false);
  CHECK(s->load_overrides().value().size() == 5);
}

TEST_CASE("a data directory of an unknown data format is refused, naming both it reads") {
  TempDir tmp;
  const std::string dir = tmp.sub("data");
  {
    Format1Db db(dir);
    db.put(0, "sluice.format", "3");
  }
  CHECK(open_failure(dir, false).find("has data format 3, this sluiced reads formats 1 and 2") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(store::Store::overrides_dir(dir)));
}

// ---- releases: the compatibility window (store.h, "Releases") ---------------------------------

namespace {

// A data directory holding kUsers counters, last opened by `release` ("" : by a release that
// recorded none).
std::string directory_of_release(TempDir& tmp, const std::string& name,
                                 const std::string& release) {
  const std::string dir = tmp.sub(name.c_str());
  {
    auto s = open_store(dir, true);
    auto e = counted_engine();
    REQUIRE(s->snapshot(*e).written == kUsers);
  }
  default_key(dir, "sluice.release", release);
  return dir;
}

std::string release_text(int major, int minor, int patch) {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

}  // namespace

TEST_CASE("a data directory records the release that opened it last") {
  TempDir tmp;
  const std::string dir = tmp.sub("data");
  CHECK(open_failure(dir, true) == "");
  CHECK(default_key(dir, "sluice.release") == std::string(sluice::kThisVersion));
}

TEST_CASE("a node restores every counter from a directory of the previous or next minor release") {
  const Release me = sluice::kThisRelease;
  std::vector<std::string> inside = {release_text(me.major, me.minor + 1, 5),
                                     release_text(me.major, me.minor, me.patch + 1)};
  if (me.minor > 0) inside.push_back(release_text(me.major, me.minor - 1, 0));
  // A directory that records no release was last opened by 0.2 (or earlier).
  if (sluice::within_window(me, sluice::kUnrecordedRelease)) inside.push_back("");
  TempDir tmp;
  int n = 0;
  for (const std::string& r : inside) {
    CAPTURE(r);
    const std::string dir = directory_of_release(tmp, "d" + std::to_string(n++), r);
    {
      auto s = open_store(dir, false);
      engine::Engine e(policy());
      CHECK(s->restore(e, kT0 + 2000).value().restored == kUsers);
    }
    // Now this release's directory: the next release in the window reads it.
    CHECK(default_key(dir, "sluice.release") == std::string(sluice::kThisVersion));
  }
}

TEST_CASE(
    "a directory of a release outside the window is refused naming both, and left as it was") {
  const Release me = sluice::kThisRelease;
  std::vector<std::string> outside = {release_text(me.major, me.minor + 2, 0),
                                      release_text(me.major + 1, me.minor, 0)};
  if (me.minor >= 2) outside.push_back(release_text(me.major, me.minor - 2, 0));
  if (!sluice::within_window(me, sluice::kUnrecordedRelease)) outside.push_back("");
  TempDir tmp;
  int n = 0;
  for (const std::string& r : outside) {
    CAPTURE(r);
    const std::string dir = directory_of_release(tmp, "d" + std::to_string(n++), r);
    const std::string why = open_failure(dir, false);
    CAPTURE(why);
    CHECK(why.find("sluiced " + (r.empty() ? sluice::to_string(sluice::kUnrecordedRelease) : r)) !=
          std::string::npos);
    CHECK(why.find("this sluiced is " + std::string(sluice::kThisVersion)) != std::string::npos);
    CHECK(why.find(sluice::window_text(me)) != std::string::npos);
    CHECK(default_key(dir, "sluice.release") ==
          (r.empty() ? std::nullopt : std::optional<std::string>(r)));
  }
  // Garbage where the release should be is refused too, not taken for any release.
  const std::string dir = directory_of_release(tmp, "garbage", "banana");
  const std::string why = open_failure(dir, false);
  CHECK(why.find("names its release as \"banana\"") != std::string::npos);
}
