// Persistence of a node in RocksDB: counter snapshots and runtime overrides
// (docs/architecture.md, "Persistence").
//
// Layout of a data directory (data format 2): two RocksDB databases, so that a snapshot pass never
// waits for an override's fsync, nor an override for a snapshot's write (with one database, a pass
// joined the synced write group of the overrides and a kill during that wait lost up to 270 ms of
// counting at a 50 ms interval; docs/bench-log/2026-11-25-override-store.md).
//   <dir>           the counters' database:
//     default       "sluice.format" -> "2" (written at creation; a database without it is not ours)
//                   "sluice.release" -> "0.3.0", the release that last opened it (below)
//     counters      engine records (engine.h, "counters as records"): key 16 bytes, the state
//   <dir>/overrides the overrides' database, with its own WAL, lock and LOG:
//     default       "sluice.format" -> "1"
//     overrides     rules::override_id -> the override as JSON (readable with RocksDB's `ldb`),
//                   with its cluster version and, for a delete kept as a tombstone, "deleted":
//                   true (cluster/override_table.h); a record without a version reads as version 0
//
// Format 1 (before) kept the overrides in a column family "overrides" of the counters' database.
// Open moves them into <dir>/overrides, in this order, each step durable before the next: the
// records are written to the overrides' database (WAL synced, then flushed), the marker becomes
// "2" (synced and flushed), the old column family is dropped. A crash before the marker leaves
// format 1, and the next open copies again: the overrides' database is made exactly the old
// family (what an interrupted copy left there is replaced, not merged), so nothing is duplicated
// and nothing deleted comes back. A crash after the marker leaves a complete copy, and the next
// open only drops the old family, never copies it again (the node may have changed overrides
// since). A format 2 directory is refused by a sluiced that reads only format 1, rather than
// opened without its overrides.
//
// Counters are written by snapshots: each pass writes the counters changed since the previous
// pass (Engine::export_step) and deletes the ones the engine dropped, in batches, with the WAL on
// but not synced (a killed process loses nothing the OS has; a power cut may lose the last pass).
// Overrides are written with the WAL synced before the call returns: an acknowledged override
// survives kill -9 and power loss alike.
//
// Releases: open refuses a directory that a release outside this build's compatibility window
// last opened (base/release.h: one minor release either side), with an error naming both
// releases, and then records this build's release. A directory without the key was last opened
// by a release before 0.3, taken as 0.2. Those releases leave the key as it is: a directory
// rolled back from 0.3 to 0.2 still names 0.3 (a 0.4 would take it for 0.3's; upgrading one
// minor release at a time, as the window asks, never meets that). The data format above changes
// only with what a release reads; the release key is what lets an upgrade or a rollback that
// skips a release be refused rather than misread.
//
// A directory is never reset silently: a missing or empty directory is created only when the
// caller asks (first start, `sluiced --init-data`); a directory that is not a Sluice database, or
// that RocksDB finds corrupt, is an error naming the directory (or the overrides' database in it)
// and the way to recover (docs/operations.md, "Data directory").
//
// Errors: every fallible operation returns a Status (or a StatusOr), with the message for the
// operator (lib/base/status.h); nothing here throws for an expected failure.
//
// Threads: a Store may be used from several threads (RocksDB is thread-safe; the snapshot cursor
// is guarded). `Snapshotter` runs snapshots on its own thread, never on a check thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "cluster/override_table.h"
#include "engine/engine.h"
#include "rules/rules.h"

namespace sluice::store {

struct SnapshotResult {
  bool ok = true;
  std::string error;     // when !ok: what RocksDB said
  bool full = false;     // every counter was written, not only the changed ones
  uint64_t written = 0;  // records put
  uint64_t erased = 0;   // records deleted (counters the engine dropped)
  uint64_t bytes = 0;    // bytes of the write batches (keys, values, batch framing)
  int64_t duration_us = 0;
};

struct RestoreResult {
  uint64_t restored = 0;
  uint64_t expired = 0;    // every bucket had left its window: deleted
  uint64_t malformed = 0;  // unreadable records: logged and deleted
  uint64_t no_room = 0;    // the memory cap left no room
  int64_t duration_us = 0;
};

// Memory for the write buffers (RocksDB memtables) of every column family together. It is a hard
// bound: a write that finds it reached waits until a flush has made room (RocksDB's
// WriteBufferManager with stalls). Only the snapshot thread and operator writes ever write, never
// a check thread, so the wait costs no check. The counters' column family flushes at half of it,
// so one memtable fills while the other is written out. Without a bound, the counters' 64 MiB
// write buffers (two of them) came on top of memory_cap_mb: a key spray under a 32 MiB cap ran
// sluiced at 132 MiB RSS, 75 MiB of it memtables (docs/bench-log/2026-11-24-soak-and-key-spray.md).
inline constexpr uint64_t kDefaultWriteBufferBytes = 64ull << 20;
inline constexpr uint64_t kMinWriteBufferBytes = 256ull << 10;
// Memory: what a snapshot pass and RocksDB use beside the memtables while they write does not
// grow with the number of counters: a write batch (at most 256 KiB of records, its buffer reserved
// once), one 64 KiB buffer per file being written (the WAL, a flush's and a compaction's table
// file), the vector memtables' index of their entries, the blocks a compaction reads, the readers
// of open table files. A node sets aside up to kWorkingBytes of memory_cap_mb for it (node.h,
// store_working_bytes; measured in docs/operations.md, "Memory under a key spray").
inline constexpr uint64_t kWorkingBytes = 2ull << 20;

class Store {
 public:
  // Opens the database in `dir`. With `create`, a directory that does not exist or is empty
  // becomes a new database; without it, that is an error (a data directory that vanished, or a
  // volume that is not mounted, must not look like a first start). `write_buffer_bytes` bounds
  // the memtables (above; at least kMinWriteBufferBytes). A failure says what is wrong with the
  // directory and how to recover: not_found (missing, empty, or without its overrides'
  // database), corruption (not a Sluice database, or RocksDB finds it corrupt), unavailable
  // (another process holds it), io_error, invalid_argument (no directory, an unknown format).
  static StatusOr<std::unique_ptr<Store>> open(
      const std::string& dir, bool create, uint64_t write_buffer_bytes = kDefaultWriteBufferBytes);
  // Runs RocksDB's repair on `dir` and on its overrides' database (keeps every record it can
  // read). An overrides' database that is missing from a format 2 directory is created empty
  // (logged: its overrides are lost).
  static Status repair(const std::string& dir);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& dir() const { return dir_; }

  // Loads every stored counter into `engine` (records still inside their windows at now);
  // deletes expired and unreadable ones. An error when the scan itself fails.
  StatusOr<RestoreResult> restore(engine::Engine& engine, int64_t now_ms);

  // One snapshot pass (see the file comment). On a failed write the engine is told to mark every
  // counter changed, so the next pass writes everything again: nothing is skipped for good.
  SnapshotResult snapshot(engine::Engine& engine, bool full = false);

  // Every stored override (tombstones left out). An error on a failed scan or an unreadable
  // record.
  StatusOr<std::vector<rules::Override>> load_overrides();
  // Every stored record, tombstones included. Errors as load_overrides.
  StatusOr<std::vector<cluster::OverrideRecord>> load_override_records();
  // Writes (replaces) records in one batch, WAL synced; ok once they are durable.
  Status put_override_records(std::span<const cluster::OverrideRecord> records);
  // Erases records by id (cluster::record_id) in one batch, WAL synced.
  Status erase_override_records(std::span<const std::string> ids);
  // Writes (replaces) one override as a version-0 record, WAL synced.
  Status put_override(const rules::Override& o);
  // Deletes one override, WAL synced.
  Status delete_override(std::string_view domain,
                         std::span<const std::pair<std::string, std::string>> entries);

  // Writes every memtable of both databases to table files and waits (a clean stop calls it).
  void flush();

  // Bytes on disk (SST files plus live WAL files) of each database.
  struct DiskUsage {
    uint64_t counters = 0;
    uint64_t overrides = 0;
    uint64_t total() const { return counters + overrides; }
  };
  DiskUsage disk_usage() const;
  uint64_t disk_bytes() const { return disk_usage().total(); }
  // Bytes the memtables of both databases hold now, flushing ones included
  // (rocksdb.size-all-mem-tables): at most the write buffer bound of open(), plus one batch. The
  // overrides' memtable is outside that bound; every override write flushes it, so it holds at
  // most one batch.
  uint64_t memtable_bytes() const;

  // What RocksDB holds in memory now for both databases, by RocksDB's own accounting (its DB
  // properties): the memtables (as memtable_bytes), the readers of open table files (their index
  // and filter blocks), and the block caches. Reading it takes no lock a snapshot pass waits on.
  struct MemoryUsage {
    uint64_t memtables = 0;
    uint64_t table_readers = 0;
    uint64_t block_cache = 0;
    uint64_t total() const { return memtables + table_readers + block_cache; }
  };
  MemoryUsage memory_usage() const;

  // The overrides' database of a data directory.
  static std::string overrides_dir(const std::string& dir);

  // Test hook: opens an existing directory like open(dir, false), calling `after_step` after each
  // durable step of a format 1 migration (1: records written to the overrides' database, 2: the
  // marker says "2"); an exception from it (the test's simulated crash) stops the open there, as
  // a crash would.
  static StatusOr<std::unique_ptr<Store>> TEST_open_migrating(
      const std::string& dir, const std::function<void(int)>& after_step);

  struct Db;

 private:
  Store(std::string dir, std::unique_ptr<Db> db);
  static StatusOr<std::unique_ptr<Store>> open_impl(const std::string& dir, bool create,
                                                    uint64_t write_buffer_bytes,
                                                    const std::function<void(int)>* after_step);
  void flush_overrides();
  std::string dir_;
  std::unique_ptr<Db> db_;
  std::mutex snapshot_mu_;  // one snapshot pass at a time (it owns the cursor)
  engine::ExportCursor cursor_;
};

// Runs Store::snapshot every `interval_ms` on its own thread, on demand, and once more at stop().
class Snapshotter {
 public:
  struct Status {
    int64_t last_ms = 0;  // when the last pass finished (clock of the constructor), 0 = never
    SnapshotResult last;
    uint64_t passes = 0;
    uint64_t failures = 0;
  };

  Snapshotter(Store& store, engine::Engine& engine, int64_t interval_ms,
              std::function<int64_t()> clock);
  ~Snapshotter();  // stop()
  Snapshotter(const Snapshotter&) = delete;
  Snapshotter& operator=(const Snapshotter&) = delete;

  // Runs a pass now (waits for one in progress first) and returns its result.
  SnapshotResult snapshot_now(bool full = false);
  // Stops the thread after a final pass; idempotent. Returns that pass's result.
  SnapshotResult stop();
  Status status() const;

 private:
  SnapshotResult pass(bool full);
  void run();

  Store& store_;
  engine::Engine& engine_;
  int64_t interval_ms_;
  std::function<int64_t()> clock_;
  std::mutex stop_mu_;     // one stop() at a time (it joins the thread)
  mutable std::mutex mu_;  // guards status_, stopping_, stopped_, final_
  std::condition_variable cv_;
  Status status_;
  bool stopping_ = false;
  bool stopped_ = false;
  SnapshotResult final_;
  std::thread thread_;
};

}  // namespace sluice::store
