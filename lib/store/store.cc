#include "store/store.h"

#include <rocksdb/db.h>
#include <rocksdb/memtablerep.h>
#include <rocksdb/options.h>
#include <rocksdb/utilities/options_util.h>
#include <rocksdb/write_batch.h>
#include <rocksdb/write_buffer_manager.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <thread>

#include "base/release.h"

namespace sluice::store {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kFormatKey = "sluice.format";
// The release that last opened the directory (store.h, "Releases"); absent before 0.3.
constexpr const char* kReleaseKey = "sluice.release";
// Data formats (store.h): 2 keeps the overrides in a database of their own; 1 kept them in the
// counters' database, and open moves them. The overrides' database has its own marker.
constexpr const char* kFormat = "2";
constexpr const char* kFormatShared = "1";
constexpr const char* kOverridesFormat = "1";
constexpr const char* kCountersCf = "counters";
constexpr const char* kOverridesCf = "overrides";  // format 1: in the counters' database
constexpr const char* kOverridesSubdir = "overrides";
// A snapshot writes to RocksDB in batches of at most kRecordsPerBatch records and about
// kBatchBytes: a batch is working memory outside the write buffer bound (store.h, "Memory").
constexpr size_t kRecordsPerBatch = 4096;
constexpr size_t kBatchBytes = 256u << 10;
// The buffer of each file RocksDB writes (the WAL, a flush's or a compaction's table file); its
// default, 1 MiB each, was working memory outside the write buffer bound.
constexpr size_t kFileBufferBytes = 64u << 10;
constexpr size_t kSlotsPerStep = 256;  // slots visited per shard lock hold (export_step)

int64_t elapsed_us(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               since)
      .count();
}

std::string recovery_hint(const std::string& dir) {
  return "To recover: stop every process using it and keep a copy, then run `sluiced "
         "--repair-data --data-dir " +
         dir +
         "` (RocksDB repair keeps every record it can read); or move the directory aside and "
         "start with --init-data (counters start empty; re-apply overrides from a `sluicectl "
         "override list --json` backup). See docs/operations.md, \"Data directory\".";
}

Status open_error(const rocksdb::Status& s, const std::string& what, const std::string& data_dir) {
  std::string why = "RocksDB cannot open " + what + ": " + s.ToString() + ". ";
  if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
    why +=
        "Another process (a second sluiced?) holds it: stop it, or give this node its own "
        "data directory.";
    return Status::Unavailable(std::move(why));
  }
  why += recovery_hint(data_dir);
  if (s.IsCorruption()) return Status::Corruption(std::move(why));
  return Status::IoError(std::move(why));
}

bool has_database(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "CURRENT", ec);
}

rocksdb::DBOptions db_options(uint64_t write_buffer_bytes) {
  rocksdb::DBOptions o;
  // A hard bound on every memtable together (store.h, kDefaultWriteBufferBytes): stalls on.
  o.write_buffer_manager = std::make_shared<rocksdb::WriteBufferManager>(
      static_cast<size_t>(write_buffer_bytes), nullptr, /*allow_stall=*/true);
  o.create_if_missing = true;
  o.create_missing_column_families = true;
  o.paranoid_checks = true;
  o.max_background_jobs = 2;
  o.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  o.keep_log_file_num = 4;
  o.max_total_wal_size = 256ull << 20;
  o.allow_concurrent_memtable_write = false;  // the counters memtable is a vector (below)
  o.writable_file_max_buffer_size = kFileBufferBytes;
  return o;
}

// The counters' database: default and counters, plus any other family `existing` names (a format
// 1 directory's "overrides", until open has moved it; under the same write buffer bound).
std::vector<rocksdb::ColumnFamilyDescriptor> column_families(
    uint64_t write_buffer_bytes, const std::vector<std::string>& existing = {}) {
  rocksdb::ColumnFamilyOptions counters;
  // Records are small, rewritten every pass and read once at start: compression would cost
  // snapshot and restore time for little space.
  counters.compression = rocksdb::kNoCompression;
  // Half the bound: one memtable fills while the other is flushed.
  counters.write_buffer_size = static_cast<size_t>(write_buffer_bytes / 2);
  // Snapshots only write and restores only scan: a vector memtable appends and sorts once at
  // flush, where the default skip list pays a search per record (a quarter of a snapshot's time).
  counters.memtable_factory = std::make_shared<rocksdb::VectorRepFactory>();
  std::vector<rocksdb::ColumnFamilyDescriptor> out{
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()}, {kCountersCf, counters}};
  for (const std::string& name : existing) {
    if (name != rocksdb::kDefaultColumnFamilyName && name != kCountersCf)
      out.emplace_back(name, rocksdb::ColumnFamilyOptions());
  }
  return out;
}

// The overrides' database: a few small records, each write synced and flushed at once. It has no
// write buffer manager: sharing the counters' one would make an override write wait for a
// counters flush whenever the snapshots filled the bound, the coupling this database removes.
rocksdb::DBOptions overrides_db_options(bool create) {
  rocksdb::DBOptions o;
  o.create_if_missing = create;
  o.create_missing_column_families = true;
  o.paranoid_checks = true;
  o.max_background_jobs = 2;
  o.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  o.keep_log_file_num = 4;
  o.writable_file_max_buffer_size = kFileBufferBytes;
  return o;
}

std::vector<rocksdb::ColumnFamilyDescriptor> overrides_families() {
  rocksdb::ColumnFamilyOptions small;
  small.write_buffer_size = 1u << 20;  // flushed after every write anyway
  return {{rocksdb::kDefaultColumnFamilyName, small}, {kOverridesCf, small}};
}

rocksdb::Slice slice(std::span<const uint8_t> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// ---- overrides as JSON ------------------------------------------------------------------------

Json override_to_json(const rules::Override& o) {
  Json entries = Json::array();
  for (const auto& [k, v] : o.entries)
    entries.push_back(Json::array({k, v}));
  Json limits = Json::array();
  for (const rules::Limit& l : o.limits) {
    limits.push_back(Json{{"name", l.name},
                          {"requests", l.requests},
                          {"window_ms", l.spec.window_ms},
                          {"bucket_ms", l.spec.bucket_ms}});
  }
  Json j{{"domain", o.domain},
         {"entries", std::move(entries)},
         {"limits", std::move(limits)},
         {"plan", o.plan},
         {"expires_at_ms", o.expires_at_ms}};
  if (o.mode) j["mode"] = std::string(rules::to_string(*o.mode));
  return j;
}

// Throws (nlohmann or std::runtime_error) on anything unexpected; the caller reports it.
rules::Override override_from_json(const Json& j) {
  rules::Override o;
  o.domain = j.at("domain").get<std::string>();
  for (const auto& e : j.at("entries"))
    o.entries.emplace_back(e.at(0).get<std::string>(), e.at(1).get<std::string>());
  for (const auto& l : j.at("limits")) {
    rules::Limit lim;
    lim.name = l.at("name").get<std::string>();
    lim.requests = l.at("requests").get<uint64_t>();
    lim.spec.window_ms = l.at("window_ms").get<int64_t>();
    lim.spec.bucket_ms = l.at("bucket_ms").get<int64_t>();
    o.limits.push_back(std::move(lim));
  }
  o.plan = j.at("plan").get<std::string>();
  o.expires_at_ms = j.at("expires_at_ms").get<int64_t>();
  if (j.contains("mode")) {
    o.mode = rules::parse_mode(j.at("mode").get<std::string>());
    if (!o.mode) throw std::runtime_error("unknown mode");
  }
  return o;
}

// A versioned record (cluster/override_table.h): the override's fields plus its version and
// whether it is a tombstone. A record written before versions has none: version 0, a set.
Json record_to_json(const cluster::OverrideRecord& r) {
  Json j = override_to_json(r.value);
  j["version_ms"] = r.version.ms;
  j["version_node"] = r.version.node;
  if (r.deleted) j["deleted"] = true;
  return j;
}

cluster::OverrideRecord record_from_json(const Json& j) {
  cluster::OverrideRecord r;
  r.value = override_from_json(j);
  r.version.ms = j.value("version_ms", int64_t{0});
  r.version.node = j.value("version_node", uint16_t{0});
  r.deleted = j.value("deleted", false);
  return r;
}

// Snapshot records go into a write batch; the caller writes it every kRecordsPerBatch records or
// kBatchBytes, whichever comes first.
class BatchSink : public engine::RecordSink {
 public:
  // Reserved once: grown by doubling, a batch of kBatchBytes would hold up to twice that.
  explicit BatchSink(rocksdb::ColumnFamilyHandle* cf) : batch(kBatchBytes + (16u << 10)), cf_(cf) {}
  void put(std::span<const uint8_t> key, std::span<const uint8_t> value) override {
    if (status_.ok()) status_ = batch.Put(cf_, slice(key), slice(value));
    ++puts;
  }
  void erase(std::span<const uint8_t> key) override {
    if (status_.ok()) status_ = batch.Delete(cf_, slice(key));
    ++deletes;
  }
  const rocksdb::Status& status() const { return status_; }
  rocksdb::WriteBatch batch;
  uint64_t puts = 0;
  uint64_t deletes = 0;

 private:
  rocksdb::ColumnFamilyHandle* cf_;
  rocksdb::Status status_;
};

// One RocksDB database and its column family handles.
struct Instance {
  std::string dir;
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;

  Instance() = default;
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  ~Instance() {
    // Handles before the database (CONVENTIONS.md: RocksDB pitfalls).
    if (db) {
      for (auto* h : handles)
        db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
      db->Close().PermitUncheckedError();
    }
  }

  // Opens the database in `dir`; `what` names it in errors.
  Status open(const rocksdb::DBOptions& options,
              const std::vector<rocksdb::ColumnFamilyDescriptor>& families, const std::string& what,
              const std::string& data_dir) {
    rocksdb::DB* raw = nullptr;
    const rocksdb::Status s = rocksdb::DB::Open(options, dir, families, &handles, &raw);
    if (!s.ok()) return open_error(s, what, data_dir);
    db.reset(raw);
    return {};
  }

  rocksdb::ColumnFamilyHandle* family(std::string_view name) const {
    for (auto* h : handles)
      if (h->GetName() == name) return h;
    return nullptr;
  }

  // Drops a column family for good (the drop is in the manifest when this returns).
  rocksdb::Status drop(rocksdb::ColumnFamilyHandle* h) {
    rocksdb::Status s = db->DropColumnFamily(h);
    if (!s.ok()) return s;
    handles.erase(std::find(handles.begin(), handles.end(), h));
    return db->DestroyColumnFamilyHandle(h);
  }

  // The format marker in the default column family (kFormatKey).
  rocksdb::Status read_format(std::string* out) const {
    return db->Get(rocksdb::ReadOptions(), kFormatKey, out);
  }
  rocksdb::Status read_release(std::string* out) const {
    return db->Get(rocksdb::ReadOptions(), kReleaseKey, out);
  }
  // Synced and flushed, as the format marker is (below).
  rocksdb::Status write_release(std::string_view release) {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    rocksdb::Status s = db->Put(wo, kReleaseKey, rocksdb::Slice(release.data(), release.size()));
    rocksdb::FlushOptions fo;
    fo.wait = true;
    if (s.ok()) s = db->Flush(fo, db->DefaultColumnFamily());
    return s;
  }
  // Synced, and flushed to a table file: otherwise the log holding the marker stays live, and
  // with it every later write of the database, which RocksDB's repair then turns into a table
  // whose sequence numbers overlap the flushed ones (the repair fails).
  rocksdb::Status write_format(const char* format) {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    rocksdb::Status s = db->Put(wo, kFormatKey, format);
    rocksdb::FlushOptions fo;
    fo.wait = true;
    if (s.ok()) s = db->Flush(fo, db->DefaultColumnFamily());
    return s;
  }
};

// A format 1 directory's overrides (column family `legacy` of the counters' database) into the
// overrides' database: afterwards that database's records are exactly the old family's, whatever
// an interrupted earlier attempt left there (keys it wrote that the old family no longer has are
// deleted), in one batch, WAL synced, then flushed. Records are copied as they are: an unreadable
// one is reported by load_override_records as before. Returns how many.
StatusOr<uint64_t> copy_format1_overrides(Instance& from, rocksdb::ColumnFamilyHandle* legacy,
                                          Instance& to, rocksdb::ColumnFamilyHandle* records,
                                          const std::string& data_dir) {
  const std::string failed =
      "moving the overrides of data directory " + data_dir + " into " + to.dir + " failed: ";
  rocksdb::WriteBatch batch;
  rocksdb::Status s;
  {
    std::unique_ptr<rocksdb::Iterator> it(to.db->NewIterator(rocksdb::ReadOptions(), records));
    for (it->SeekToFirst(); it->Valid() && s.ok(); it->Next())
      s = batch.Delete(records, it->key());
    if (s.ok()) s = it->status();
  }
  uint64_t copied = 0;
  {
    std::unique_ptr<rocksdb::Iterator> it(from.db->NewIterator(rocksdb::ReadOptions(), legacy));
    for (it->SeekToFirst(); it->Valid() && s.ok(); it->Next(), ++copied)
      s = batch.Put(records, it->key(), it->value());
    if (s.ok()) s = it->status();
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  if (s.ok()) s = to.db->Write(wo, &batch);
  if (s.ok()) {
    rocksdb::FlushOptions fo;
    fo.wait = true;
    s = to.db->Flush(fo, records);
  }
  if (!s.ok()) return Status::IoError(failed + s.ToString() + ". " + recovery_hint(data_dir));
  return copied;
}

Status override_error(const std::string& ovdir, const char* doing, const rocksdb::Status& s) {
  return Status::IoError(std::string(doing) + " in the overrides database " + ovdir +
                         " failed: " + s.ToString());
}

// A data directory to open: it exists and holds a database, or (with `create`) is made, empty.
// Returns whether it is new, or a Status saying what is wrong and what to do.
StatusOr<bool> prepare_data_dir(const std::string& dir, bool create) {
  std::error_code ec;
  const bool exists = fs::exists(dir, ec);
  if (ec) return Status::IoError("data directory " + dir + ": " + ec.message());
  bool fresh = false;
  if (!exists || (fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) {
    if (!create) {
      return Status::NotFound(
          "data directory " + dir + (exists ? " is empty" : " does not exist") +
          ". On a node's first start, create it with --init-data (or `init_data: true` in the "
          "config). If this node ran before, its counters and overrides were there: check the "
          "path and that its volume is mounted before creating a new one.");
    }
    fs::create_directories(dir, ec);
    if (ec) return Status::IoError("cannot create data directory " + dir + ": " + ec.message());
    fresh = true;
  } else if (!fs::is_directory(dir, ec)) {
    return Status::InvalidArgument("data directory " + dir + " is not a directory");
  } else if (!has_database(dir)) {
    return Status::Corruption("data directory " + dir +
                              " is not empty but holds no RocksDB database (its CURRENT file is "
                              "missing). If it is a Sluice data directory that lost files: " +
                              recovery_hint(dir) +
                              " Otherwise point data_dir at another directory.");
  }
  return fresh;
}

// The counters' database's format marker, into `format`: one this sluiced reads, or why not.
Status check_counters_format(Instance& main, const std::string& dir, std::string& format) {
  const rocksdb::Status f = main.read_format(&format);
  if (f.IsNotFound()) {
    return Status::Corruption(
        "data directory " + dir +
        " holds a RocksDB database that is not Sluice's (no sluice.format key). "
        "Point data_dir at the node's own directory. If it is the node's and only "
        "that key was lost: " +
        recovery_hint(dir));
  }
  if (!f.ok()) {
    return Status::IoError("data directory " + dir + ": reading sluice.format: " + f.ToString() +
                           ". " + recovery_hint(dir));
  }
  if (format != kFormat && format != kFormatShared) {
    return Status::InvalidArgument("data directory " + dir + " has data format " + format +
                                   ", this sluiced reads formats " + kFormatShared + " and " +
                                   kFormat);
  }
  return {};
}

// The release that last opened the counters' database: one within this sluiced's compatibility
// window (base/release.h), or why not, naming both. Absent: a release before 0.3 (0.2). Returns
// the key's value ("" when absent) for open_impl to rewrite when it is not ours.
StatusOr<std::string> check_release(Instance& main, const std::string& dir) {
  std::string text;
  const rocksdb::Status r = main.read_release(&text);
  if (!r.ok() && !r.IsNotFound()) {
    return Status::IoError("data directory " + dir + ": reading sluice.release: " + r.ToString() +
                           ". " + recovery_hint(dir));
  }
  if (r.IsNotFound()) text.clear();
  const std::optional<Release> written =
      text.empty() ? std::optional<Release>(kUnrecordedRelease) : parse_release(text);
  if (!written) {
    return Status::Corruption("data directory " + dir + " names its release as \"" + text +
                              "\", which is not a release (major.minor.patch)");
  }
  if (!within_window(kThisRelease, *written)) {
    return Status::InvalidArgument(
        "data directory " + dir + " was last opened by sluiced " + to_string(*written) +
        (text.empty() ? " (or earlier: it records no release)" : "") + "; this sluiced is " +
        std::string(kThisVersion) + " and restores from releases " + window_text(kThisRelease) +
        " only. Run a release in between on it first, one minor release at a time "
        "(docs/operations.md, \"Rolling upgrade\"), or start this node on an empty data "
        "directory (its counters then start from zero).");
  }
  return text;
}

// The overrides' database's format marker: written when it was just created (`created`), else
// one this sluiced reads, or why not.
Status check_overrides_format(Instance& ov, bool created, const std::string& ov_what,
                              const std::string& dir) {
  std::string ov_format;
  rocksdb::Status f = ov.read_format(&ov_format);
  if (f.IsNotFound() && created) {
    f = ov.write_format(kOverridesFormat);
    if (!f.ok()) return Status::IoError("cannot initialize " + ov_what + ": " + f.ToString());
  } else if (f.IsNotFound()) {
    return Status::Corruption(ov_what +
                              " is a RocksDB database that is not Sluice's (no sluice.format "
                              "key). If only that key was lost: " +
                              recovery_hint(dir));
  } else if (!f.ok()) {
    return Status::IoError(ov_what + ": reading sluice.format: " + f.ToString() + ". " +
                           recovery_hint(dir));
  } else if (ov_format != kOverridesFormat) {
    return Status::InvalidArgument(ov_what + " has format " + ov_format +
                                   ", this sluiced reads format " + kOverridesFormat);
  }
  return {};
}

}  // namespace

struct Store::Db {
  Instance counters_db;   // the data directory
  Instance overrides_db;  // <data directory>/overrides
  rocksdb::ColumnFamilyHandle* counters = nullptr;
  rocksdb::ColumnFamilyHandle* overrides = nullptr;
};

Store::Store(std::string dir, std::unique_ptr<Db> db) : dir_(std::move(dir)), db_(std::move(db)) {}
Store::~Store() = default;

std::string Store::overrides_dir(const std::string& dir) {
  return (fs::path(dir) / kOverridesSubdir).string();
}

StatusOr<std::unique_ptr<Store>> Store::open(const std::string& dir, bool create,
                                             uint64_t write_buffer_bytes) {
  return open_impl(dir, create, write_buffer_bytes, nullptr);
}

StatusOr<std::unique_ptr<Store>> Store::TEST_open_migrating(
    const std::string& dir, const std::function<void(int)>& after_step) {
  return open_impl(dir, false, kDefaultWriteBufferBytes, &after_step);
}

StatusOr<std::unique_ptr<Store>> Store::open_impl(const std::string& dir, bool create,
                                                  uint64_t write_buffer_bytes,
                                                  const std::function<void(int)>* after_step) {
  if (dir.empty()) return Status::InvalidArgument("no data directory given");
  write_buffer_bytes = std::max(write_buffer_bytes, kMinWriteBufferBytes);
  const StatusOr<bool> prepared = prepare_data_dir(dir, create);
  if (!prepared.ok()) return prepared.status();
  const bool fresh = *prepared;

  // ---- the counters' database (the data directory itself)
  auto d = std::make_unique<Db>();
  Instance& main = d->counters_db;
  main.dir = dir;
  const std::string main_what = "data directory " + dir;
  std::vector<std::string> existing;
  if (!fresh) {
    const rocksdb::Status l =
        rocksdb::DB::ListColumnFamilies(db_options(write_buffer_bytes), dir, &existing);
    if (!l.ok()) return open_error(l, main_what, dir);
  }
  if (Status s = main.open(db_options(write_buffer_bytes),
                           column_families(write_buffer_bytes, existing), main_what, dir);
      !s.ok()) {
    return s;
  }
  d->counters = main.family(kCountersCf);
  rocksdb::ColumnFamilyHandle* legacy = main.family(kOverridesCf);  // format 1's overrides
  std::string format = kFormat;
  std::string recorded_release;
  if (!fresh) {
    if (Status s = check_counters_format(main, dir, format); !s.ok()) return s;
    StatusOr<std::string> release = check_release(main, dir);
    if (!release.ok()) return release.status();
    recorded_release = std::move(*release);
  }

  // ---- the overrides' database: created with a new directory, or to move format 1's into. With
  // the marker at 2 it must exist, even while the old family is still there (a kill before the
  // drop): the copy in it is the only complete one, and an empty database in its place would be
  // taken for it.
  const std::string ovdir = overrides_dir(dir);
  const bool ov_create = fresh || format == kFormatShared;
  if (!ov_create && !has_database(ovdir)) {
    return Status::NotFound(
        "data directory " + dir + " (data format " + kFormat +
        ") has no overrides database: " + ovdir +
        " is missing or holds no RocksDB database (its CURRENT file is missing). If it is on "
        "another volume, mount it. If it was lost, `sluiced --repair-data --data-dir " +
        dir +
        "` creates an empty one; then re-apply the overrides from a `sluicectl override list "
        "--json` backup. See docs/operations.md, \"Data directory\".");
  }
  Instance& ov = d->overrides_db;
  ov.dir = ovdir;
  const std::string ov_what = "the overrides database " + ovdir + " of data directory " + dir;
  if (Status s = ov.open(overrides_db_options(ov_create), overrides_families(), ov_what, dir);
      !s.ok()) {
    return s;
  }
  d->overrides = ov.family(kOverridesCf);
  if (Status s = check_overrides_format(ov, ov_create, ov_what, dir); !s.ok()) return s;
  // ---- format 1: move the overrides (store.h states the order and why it is crash-safe). Only
  // while the marker says 1: once it says 2 the copy is complete and may be older than the
  // overrides' database, so a family left by a failed drop is dropped, never copied again.
  if (legacy != nullptr && format == kFormatShared) {
    const StatusOr<uint64_t> moved = copy_format1_overrides(main, legacy, ov, d->overrides, dir);
    if (!moved.ok()) return moved.status();
    spdlog::info("data directory {} (format {}): moved {} override records into {}", dir,
                 kFormatShared, *moved, ovdir);
    if (after_step) (*after_step)(1);
  }
  if (fresh || format != kFormat) {
    const rocksdb::Status w = main.write_format(kFormat);
    if (!w.ok()) {
      return Status::IoError("cannot initialize data directory " + dir + ": " + w.ToString());
    }
    if (legacy != nullptr && after_step) (*after_step)(2);
  }
  if (recorded_release != kThisVersion) {
    const rocksdb::Status w = main.write_release(kThisVersion);
    if (!w.ok()) {
      return Status::IoError("cannot record the release in " + dir + ": " + w.ToString());
    }
    if (!fresh) {
      spdlog::info("data directory {}: last opened by sluiced {}, now by {}", dir,
                   recorded_release.empty() ? to_string(kUnrecordedRelease) + " or earlier"
                                            : recorded_release,
                   kThisVersion);
    }
  }
  if (legacy != nullptr) {
    const rocksdb::Status s = main.drop(legacy);
    if (!s.ok()) {
      // Harmless: the marker says 2, so the family is never read again; the next open retries.
      spdlog::warn("data directory {}: dropping the moved overrides column family failed: {}", dir,
                   s.ToString());
    }
  }
  return std::unique_ptr<Store>(new Store(dir, std::move(d)));
}

Status Store::repair(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::NotFound("data directory " + dir + " does not exist");
  }
  // Families repair finds that the list lacks (format 1's "overrides") are kept, not skipped.
  const rocksdb::Status s =
      rocksdb::RepairDB(dir, db_options(kDefaultWriteBufferBytes),
                        column_families(kDefaultWriteBufferBytes), rocksdb::ColumnFamilyOptions());
  if (!s.ok()) return Status::IoError("RocksDB repair of " + dir + " failed: " + s.ToString());
  const std::string ovdir = overrides_dir(dir);
  const bool ov_exists = has_database(ovdir);
  if (ov_exists) {
    const rocksdb::Status o = rocksdb::RepairDB(
        ovdir, overrides_db_options(false), overrides_families(), rocksdb::ColumnFamilyOptions());
    if (!o.ok()) {
      return Status::IoError("RocksDB repair of the overrides database " + ovdir +
                             " failed: " + o.ToString());
    }
  }
  // Repair may lose a format marker with the default column family's files: write it again.
  Instance main;
  main.dir = dir;
  std::vector<std::string> existing;
  rocksdb::DB::ListColumnFamilies(db_options(kDefaultWriteBufferBytes), dir, &existing)
      .PermitUncheckedError();  // none listed: the open below reports the problem
  if (Status o = main.open(db_options(kDefaultWriteBufferBytes),
                           column_families(kDefaultWriteBufferBytes, existing),
                           "data directory " + dir + " after repair", dir);
      !o.ok()) {
    return o;
  }
  const bool legacy = main.family(kOverridesCf) != nullptr;
  std::string format;
  if (!main.read_format(&format).ok() || (format != kFormat && format != kFormatShared)) {
    format = legacy ? kFormatShared : kFormat;  // format 1 until the move has completed
  }
  if (legacy && !ov_exists) format = kFormatShared;  // the next open moves them
  if (!legacy && !ov_exists) {
    spdlog::warn(
        "repair: {} has no overrides database (a directory of data format {} keeps its "
        "overrides there): created an empty one; re-apply the overrides from a backup",
        dir, kFormat);
  }
  if (ov_exists || !legacy) {
    Instance ov;
    ov.dir = ovdir;
    if (Status o = ov.open(overrides_db_options(true), overrides_families(),
                           "the overrides database " + ovdir + " after repair", dir);
        !o.ok()) {
      return o;
    }
    const rocksdb::Status w = ov.write_format(kOverridesFormat);
    if (!w.ok()) return Status::IoError("after repair of " + ovdir + ": " + w.ToString());
  }
  const rocksdb::Status w = main.write_format(format.c_str());
  if (!w.ok()) return Status::IoError("after repair of " + dir + ": " + w.ToString());
  return {};
}

StatusOr<RestoreResult> Store::restore(engine::Engine& engine, int64_t now_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  // Two scans over halves of the key space (counter ids are uniform), each importing what it
  // reads: the engine takes imports from any thread, and a restore of millions of counters is
  // bound by the import, not by RocksDB.
  // Size the tables once for what is coming (RocksDB's estimate; the first record's window is
  // the common one), instead of growing them through a dozen rehashes.
  {
    uint64_t estimate = 0;
    db_->counters_db.db->GetIntProperty(db_->counters, "rocksdb.estimate-num-keys", &estimate);
    std::unique_ptr<rocksdb::Iterator> first(
        db_->counters_db.db->NewIterator(rocksdb::ReadOptions(), db_->counters));
    first->SeekToFirst();
    if (first->Valid() && estimate > 0) {
      const rocksdb::Slice k = first->key();
      if (const auto spec =
              engine::Engine::record_spec({reinterpret_cast<const uint8_t*>(k.data()), k.size()})) {
        engine.reserve(*spec, estimate);
      }
    }
  }
  constexpr int kParts = 2;
  const char bounds[kParts + 1] = {'\x00', '\x80', '\x00'};
  std::array<RestoreResult, kParts> parts{};
  std::array<rocksdb::WriteBatch, kParts> drops;
  std::array<rocksdb::Status, kParts> status;
  const auto scan = [&](int part) {
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;
    ro.readahead_size = 4u << 20;
    const rocksdb::Slice lower(bounds + part, 1);
    const rocksdb::Slice upper(bounds + part + 1, 1);
    if (part > 0) ro.iterate_lower_bound = &lower;
    if (part + 1 < kParts) ro.iterate_upper_bound = &upper;
    RestoreResult& r = parts[static_cast<size_t>(part)];
    rocksdb::WriteBatch& drop = drops[static_cast<size_t>(part)];
    std::unique_ptr<rocksdb::Iterator> it(db_->counters_db.db->NewIterator(ro, db_->counters));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const rocksdb::Slice k = it->key();
      const rocksdb::Slice v = it->value();
      const auto res =
          engine.import_record({reinterpret_cast<const uint8_t*>(k.data()), k.size()},
                               {reinterpret_cast<const uint8_t*>(v.data()), v.size()}, now_ms);
      switch (res) {
        case engine::ImportResult::kImported:
          ++r.restored;
          break;
        case engine::ImportResult::kExpired:
          ++r.expired;
          drop.Delete(db_->counters, k).PermitUncheckedError();
          break;
        case engine::ImportResult::kMalformed:
          ++r.malformed;
          drop.Delete(db_->counters, k).PermitUncheckedError();
          break;
        case engine::ImportResult::kNoRoom:
          ++r.no_room;
          break;
      }
    }
    status[static_cast<size_t>(part)] = it->status();
  };
  std::thread second(scan, 1);
  scan(0);
  second.join();
  RestoreResult r;
  for (int p = 0; p < kParts; ++p) {
    const auto i = static_cast<size_t>(p);
    if (!status[i].ok()) {
      return Status::IoError("reading counters from " + dir_ + ": " + status[i].ToString() + ". " +
                             recovery_hint(dir_));
    }
    r.restored += parts[i].restored;
    r.expired += parts[i].expired;
    r.malformed += parts[i].malformed;
    r.no_room += parts[i].no_room;
    if (drops[i].Count() > 0) {
      const rocksdb::Status s = db_->counters_db.db->Write(rocksdb::WriteOptions(), &drops[i]);
      if (!s.ok()) spdlog::warn("restore: deleting stale counter records failed: {}", s.ToString());
    }
  }
  if (r.malformed > 0) {
    spdlog::warn("restore: {} unreadable counter records in {} were deleted", r.malformed, dir_);
  }
  r.duration_us = elapsed_us(t0);
  return r;
}

SnapshotResult Store::snapshot(engine::Engine& engine, bool full) {
  std::lock_guard g(snapshot_mu_);
  const auto t0 = std::chrono::steady_clock::now();
  SnapshotResult r;
  r.full = full;
  BatchSink sink(db_->counters);
  rocksdb::WriteOptions wo;  // WAL on, not synced: see the file comment of store.h
  cursor_.restart(full);
  bool done = false;
  while (!done) {
    done = engine.export_step(cursor_, kSlotsPerStep, sink);
    if (sink.batch.Count() < kRecordsPerBatch && sink.batch.GetDataSize() < kBatchBytes && !done)
      continue;
    rocksdb::Status s = sink.status();
    if (s.ok() && sink.batch.Count() > 0) s = db_->counters_db.db->Write(wo, &sink.batch);
    if (!s.ok()) {
      r.ok = false;
      r.error = s.ToString();
      // What this pass took out of the engine's change flags is not stored: write it all again.
      engine.mark_all_changed();
      break;
    }
    r.bytes += sink.batch.GetDataSize();
    sink.batch.Clear();
  }
  r.written = sink.puts;
  r.erased = sink.deletes;
  r.duration_us = elapsed_us(t0);
  return r;
}

StatusOr<std::vector<rules::Override>> Store::load_overrides() {
  StatusOr<std::vector<cluster::OverrideRecord>> records = load_override_records();
  if (!records.ok()) return records.status();
  std::vector<rules::Override> out;
  for (cluster::OverrideRecord& r : *records) {
    if (!r.deleted) out.push_back(std::move(r.value));
  }
  return out;
}

StatusOr<std::vector<cluster::OverrideRecord>> Store::load_override_records() {
  std::vector<cluster::OverrideRecord> out;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->overrides_db.db->NewIterator(rocksdb::ReadOptions(), db_->overrides));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    // nlohmann reports unreadable JSON by throwing: caught here, at the third-party edge.
    try {
      out.push_back(record_from_json(Json::parse(it->value().ToStringView())));
    } catch (const std::exception& e) {
      return Status::Corruption("overrides database " + db_->overrides_db.dir +
                                ": an override record is unreadable (" + e.what() + "). " +
                                recovery_hint(dir_));
    }
  }
  if (!it->status().ok()) {
    return Status::IoError("reading overrides from " + db_->overrides_db.dir + ": " +
                           it->status().ToString() + ". " + recovery_hint(dir_));
  }
  return out;
}

Status Store::put_override(const rules::Override& o) {
  rocksdb::WriteOptions wo;
  wo.sync = true;
  const rocksdb::Status s = db_->overrides_db.db->Put(
      wo, db_->overrides, rules::override_id(o.domain, o.entries), override_to_json(o).dump());
  if (!s.ok()) return override_error(db_->overrides_db.dir, "storing the override", s);
  flush_overrides();
  return {};
}

Status Store::put_override_records(std::span<const cluster::OverrideRecord> records) {
  if (records.empty()) return {};
  rocksdb::WriteBatch batch;
  for (const cluster::OverrideRecord& r : records) {
    const rocksdb::Status s =
        batch.Put(db_->overrides, cluster::record_id(r), record_to_json(r).dump());
    if (!s.ok()) return override_error(db_->overrides_db.dir, "storing overrides", s);
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  const rocksdb::Status s = db_->overrides_db.db->Write(wo, &batch);
  if (!s.ok()) return override_error(db_->overrides_db.dir, "storing overrides", s);
  flush_overrides();
  return {};
}

Status Store::erase_override_records(std::span<const std::string> ids) {
  if (ids.empty()) return {};
  rocksdb::WriteBatch batch;
  for (const std::string& id : ids) {
    const rocksdb::Status s = batch.Delete(db_->overrides, id);
    if (!s.ok()) return override_error(db_->overrides_db.dir, "deleting overrides", s);
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  const rocksdb::Status s = db_->overrides_db.db->Write(wo, &batch);
  if (!s.ok()) return override_error(db_->overrides_db.dir, "deleting overrides", s);
  flush_overrides();
  return {};
}

// Overrides also go to a table file right away: RocksDB's repair can read table files on their
// own, while the log needs the manifest to know its column families.
void Store::flush_overrides() {
  rocksdb::FlushOptions fo;
  fo.wait = true;
  const rocksdb::Status s = db_->overrides_db.db->Flush(fo, db_->overrides);
  if (!s.ok()) {
    spdlog::warn("flushing the overrides database {} failed: {}", db_->overrides_db.dir,
                 s.ToString());
  }
}

Status Store::delete_override(std::string_view domain,
                              std::span<const std::pair<std::string, std::string>> entries) {
  rocksdb::WriteOptions wo;
  wo.sync = true;
  const rocksdb::Status s =
      db_->overrides_db.db->Delete(wo, db_->overrides, rules::override_id(domain, entries));
  if (!s.ok()) return override_error(db_->overrides_db.dir, "deleting the override", s);
  flush_overrides();
  return {};
}

void Store::flush() {
  rocksdb::FlushOptions fo;
  fo.wait = true;
  for (Instance* inst : {&db_->counters_db, &db_->overrides_db}) {
    const rocksdb::Status s = inst->db->Flush(fo, inst->handles);
    if (!s.ok()) spdlog::warn("flushing {} failed: {}", inst->dir, s.ToString());
  }
}

namespace {

uint64_t instance_disk_bytes(const Instance& inst) {
  uint64_t total = 0;
  for (auto* h : inst.handles) {
    uint64_t v = 0;
    if (inst.db->GetIntProperty(h, "rocksdb.total-sst-files-size", &v)) total += v;
  }
  // The WAL files (<number>.log) from the directory listing: DB::GetSortedWalFiles reads the
  // first record of each, a whole snapshot batch, on every /metrics scrape.
  std::error_code ec;
  for (fs::directory_iterator it(inst.dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() != ".log") continue;
    std::error_code size_ec;
    const uint64_t size = it->file_size(size_ec);
    if (!size_ec) total += size;
  }
  return total;
}

}  // namespace

Store::DiskUsage Store::disk_usage() const {
  return {instance_disk_bytes(db_->counters_db), instance_disk_bytes(db_->overrides_db)};
}

uint64_t Store::memtable_bytes() const {
  uint64_t total = 0;
  for (const Instance* inst : {&db_->counters_db, &db_->overrides_db}) {
    for (auto* h : inst->handles) {
      uint64_t v = 0;
      if (inst->db->GetIntProperty(h, "rocksdb.size-all-mem-tables", &v)) total += v;
    }
  }
  return total;
}

Store::MemoryUsage Store::memory_usage() const {
  MemoryUsage u;
  const auto add = [](const Instance& inst, rocksdb::ColumnFamilyHandle* h, const char* property,
                      uint64_t& to) {
    uint64_t v = 0;
    if (inst.db->GetIntProperty(h, property, &v)) to += v;
  };
  for (const Instance* inst : {&db_->counters_db, &db_->overrides_db}) {
    for (auto* h : inst->handles) {
      add(*inst, h, "rocksdb.size-all-mem-tables", u.memtables);
      add(*inst, h, "rocksdb.estimate-table-readers-mem", u.table_readers);
      add(*inst, h, "rocksdb.block-cache-usage", u.block_cache);
    }
  }
  return u;
}

// ---- Snapshotter -----------------------------------------------------------------------------

Snapshotter::Snapshotter(Store& store, engine::Engine& engine, int64_t interval_ms,
                         std::function<int64_t()> clock)
    : store_(store),
      engine_(engine),
      interval_ms_(std::max<int64_t>(interval_ms, 10)),
      clock_(std::move(clock)) {
  thread_ = std::thread([this] { run(); });
}

Snapshotter::~Snapshotter() {
  stop();
}

SnapshotResult Snapshotter::pass(bool full) {
  SnapshotResult r = store_.snapshot(engine_, full);
  std::lock_guard g(mu_);
  ++status_.passes;
  if (!r.ok) {
    ++status_.failures;
    spdlog::error("snapshot to {} failed: {}; every counter will be written again next pass",
                  store_.dir(), r.error);
  }
  status_.last = r;
  status_.last_ms = clock_();
  return r;
}

void Snapshotter::run() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    cv_.wait_for(lk, std::chrono::milliseconds(interval_ms_), [this] { return stopping_; });
    if (stopping_) break;
    lk.unlock();
    pass(false);
    lk.lock();
  }
}

SnapshotResult Snapshotter::snapshot_now(bool full) {
  return pass(full);  // Store::snapshot serializes passes
}

SnapshotResult Snapshotter::stop() {
  std::lock_guard stop_guard(stop_mu_);
  {
    std::lock_guard g(mu_);
    if (stopped_) return final_;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  SnapshotResult r = pass(false);
  store_.flush();  // a clean stop leaves everything in table files
  std::lock_guard g(mu_);
  stopped_ = true;
  final_ = r;
  return r;
}

Snapshotter::Status Snapshotter::status() const {
  std::lock_guard g(mu_);
  return status_;
}

}  // namespace sluice::store
