// Cluster-wide overrides and plan assignments: a versioned table that every node merges into the
// same state whatever order, or how many times, it receives the entries (docs/architecture.md,
// "Overrides across the cluster"). Pure: no clock, no network, no disk; `now_ms` is a parameter.
//
// Every entry (a rules::Override, or the tombstone of a deleted one) carries a version: the wall
// clock ms of the write and the writing node's id. A write stamps a version above the one it
// replaces (ms = max(now, replaced ms + 1)), so a node's own writes always win over what it has
// seen, even when another node's clock runs ahead. Between two entries of one override the larger
// version wins; at an equal version (a bug, or records written before versions existed, which read
// as version 0) a tombstone wins over a set, then the larger canonical encoding: a total order, so
// merging is commutative, associative and idempotent and every node ends with the same table.
//
// Deletes are tombstones, kept `tombstone_ttl_ms` (24 h by default) after the delete and then
// forgotten; a set with an expiry (expires_at_ms) stops applying at that time like any override
// and is forgotten `tombstone_ttl_ms` after it. Until then the record stays so that a node that
// missed the delete (or the expiry) cannot bring the override back. An entry past that horizon
// is ignored on arrival. The price of a bounded horizon: a node that was cut off for longer than
// the TTL may bring back what was deleted meanwhile (docs/operations.md says so).
//
// Thread safety: none; the node guards its table with NodeState::rules_mu.
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rules/rules.h"

namespace sluice::cluster {

inline constexpr int64_t kDefaultTombstoneTtlMs = 24 * 3'600'000;  // 24 h

struct OverrideVersion {
  int64_t ms = 0;     // the writer's wall clock at the write (never below the replaced ms + 1)
  uint16_t node = 0;  // the writer's node id; 0 for a record written before versions (and a
                      // node without a cluster)
  auto operator<=>(const OverrideVersion&) const = default;
};

struct OverrideRecord {
  rules::Override value;  // a tombstone keeps the domain and entries only
  OverrideVersion version;
  bool deleted = false;
};
// Equal canonical encodings (below): the same override, version and kind; entry order and what a
// tombstone carries beyond its identity do not count.
bool operator==(const OverrideRecord& a, const OverrideRecord& b);

// Bounds of one record, on the wire and for local writes alike (a write the peers would refuse
// is refused where it is made). A descriptor longer than the check path's 256 bytes
// (rules::InputLimits::max_entry_bytes) can never match, so nothing useful is lost.
struct OverrideBounds {
  size_t max_string_bytes = 256;   // domain, entry keys and values, plan, limit names
  size_t max_entries = 32;         // rules::InputLimits::max_descriptors
  size_t max_limits = 8;           // as the admin API
  int64_t max_future_ms = 30'000;  // a version this far past the receiver's clock is refused
};

// Why a record is refused: "" when it is valid. The first word names the reason for counters
// ("too_long", "too_many", "from_future", "invalid"); the rest explains.
std::string check_record(const OverrideRecord& r, int64_t now_ms, const OverrideBounds& b = {});
// The reason's first word, e.g. "too_long" (the counter label).
std::string_view reason_label(std::string_view why);

// The override's id (rules::override_id of its domain and entries).
std::string record_id(const OverrideRecord& r);
// Every field in a fixed order (entries sorted): equal records, equal bytes.
std::string canonical(const OverrideRecord& r);
// True when `a` replaces `b` (both of one id): the total order described above.
bool newer(const OverrideRecord& a, const OverrideRecord& b);

// Two tables with equal digests hold the same records (up to a 64-bit hash collision).
struct OverrideDigest {
  uint32_t count = 0;
  uint64_t hash = 0;  // sum of XXH3(canonical) over the records: independent of order
  friend bool operator==(const OverrideDigest&, const OverrideDigest&) = default;
};

class OverrideTable {
 public:
  explicit OverrideTable(int64_t tombstone_ttl_ms = kDefaultTombstoneTtlMs);

  // The version a write of `id` by `self` at now_ms gets: above any this table holds for it.
  OverrideVersion next_version(std::string_view id, uint16_t self, int64_t now_ms) const;

  // When the record may be forgotten: a tombstone tombstone_ttl_ms after its version, an
  // expiring set tombstone_ttl_ms after it expires, never for a set without expiry.
  int64_t horizon_ms(const OverrideRecord& r) const;

  enum class Offer : uint8_t {
    kNewer,    // replaces what the table holds (or is new): merge it
    kKnown,    // the table holds it or something newer: nothing to do
    kExpired,  // past its horizon: ignored
  };
  // What merge() would do, without doing it (the node persists a kNewer record first).
  Offer offer(const OverrideRecord& r, int64_t now_ms) const;
  // offer(), and on kNewer the record replaces the table's. The record is assumed valid.
  Offer merge(OverrideRecord r, int64_t now_ms);

  const OverrideRecord* find(std::string_view id) const;
  // Removes every record past its horizon; returns their ids.
  std::vector<std::string> forget_expired(int64_t now_ms);

  // Over every record not past its horizon at now_ms.
  OverrideDigest digest(int64_t now_ms) const;
  // The same records, by id.
  std::vector<OverrideRecord> records(int64_t now_ms) const;
  size_t size() const { return by_id_.size(); }
  int64_t tombstone_ttl_ms() const { return ttl_ms_; }

 private:
  int64_t ttl_ms_;
  std::map<std::string, OverrideRecord, std::less<>> by_id_;
};

// ---- the peer message (schema/peer.capnp, OverrideSync) -----------------------------------------

enum class OverrideSyncKind : uint8_t {
  kPush = 0,    // records just written (or merged) on the sender: merge them
  kDigest = 1,  // the sender's digest: answer with kFull when it differs from yours
  kFull = 2,    // the sender's whole table, split over datagrams: merge it
};

struct OverrideSyncMessage {
  uint16_t from = 0;  // the envelope's sender
  OverrideSyncKind kind = OverrideSyncKind::kPush;
  OverrideDigest digest;   // the sender's, when sent (kDigest; first part of kFull)
  bool want_full = false;  // kFull: the sender's table differed; send yours back
  std::vector<OverrideRecord> records;
};

}  // namespace sluice::cluster
