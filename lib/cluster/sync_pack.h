// The compact form of a sync batch's totals (schema/peer.capnp, SyncBatch.packed): what a node
// sends a member of release 0.3 or later instead of the list of 32-byte RemoteTotals. A batch
// is mostly runs of totals of one counter (an owner's push of every node's total of a bucket,
// a holder's newest bucket or two), so the counter and its window spec are written once a run,
// and node, bucket and total as varints:
//
//   packed := group+
//   group  := flags:u8 [counter:u64 LE]? [window_ms:uv bucket_ms:uv]? start:sv count:u8 entry+
//   entry  := node:uv [step:sv]? total:uv
//
// uv: unsigned LEB128 (7 bits a byte, low first, at most 10 bytes); sv: an int64 zigzagged
// ((v << 1) ^ (v >> 63)) then uv. `flags` bit 0: the counter follows, bit 1: the window spec
// follows; otherwise the group keeps the previous group's (the first group has both; no other bit
// is set). `start` is the group's first bucket's start in ms (bucket x bucket_ms) less the
// previous group's start (less 0 for the first group). `count` (1..255) entries follow; the
// first entry's bucket is the group's first bucket and carries no step, each later entry's
// `step` is its bucket less the previous entry's. Every total's bucket start lies within
// +-kMaxStartMs, so no sum here overflows.
//
// A total of the list form is 32 bytes and one list word per batch; here an owner's push of ten
// nodes' totals of one bucket is about 16 bytes of group and 3 per node, and a single total about
// 16. The sealed batch's size is known as totals are added (TotalsPacker::cost), so a sender fills
// datagrams up to its byte budget.
//
// Pure and allocation-free (unpack_totals grows `out` only past its capacity).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/remote_total.h"

namespace sluice::cluster {

enum class PeerError : uint8_t;

// A bucket's start (bucket x bucket_ms) a packed total may have: about 146 million years either
// side of the epoch.
inline constexpr int64_t kMaxStartMs = int64_t{1} << 62;

// True when `t` has a packed form: a positive window and bucket (window::validate's rules imply
// it) and a bucket start within +-kMaxStartMs. Windows of any length go (the list form's fields
// are 32 bits: 49.7 days at most).
bool packable(const engine::RemoteTotal& t);

// The encoder's state between totals. add() appends one total's bytes; cost() says how many it
// would append without changing anything, so a sender can stop before its budget. Only packable
// totals may be added.
class TotalsPacker {
 public:
  static constexpr size_t kMaxGroup = 255;

  // The bytes add(t) would append now.
  size_t cost(const engine::RemoteTotal& t) const;
  // Appends `t`: writes its bytes at base + bytes() (and updates the group's count at base + its
  // offset) when `base` is not null, else only counts them. Returns the bytes appended. One base
  // (or null) for every add between clear()s.
  size_t add(const engine::RemoteTotal& t, uint8_t* base);
  size_t bytes() const { return bytes_; }
  size_t totals() const { return totals_; }
  void clear() { *this = TotalsPacker{}; }

 private:
  bool same_group(const engine::RemoteTotal& t) const;
  size_t group_bytes(const engine::RemoteTotal& t) const;

  size_t bytes_ = 0;
  size_t totals_ = 0;
  bool any_ = false;
  uint64_t counter_ = 0;
  int64_t window_ms_ = 0, bucket_ms_ = 0;
  int64_t start_ms_ = 0;  // the current group's start
  int64_t bucket_ = 0;    // the last entry's bucket
  size_t count_at_ = 0;   // offset of the current group's count
  size_t group_count_ = 0;
};

// Packs all of `totals` (each packable) into `out` (resized to fit exactly).
void pack_totals(std::span<const engine::RemoteTotal> totals, std::vector<uint8_t>& out);
// The bytes pack_totals would write.
size_t packed_bytes(std::span<const engine::RemoteTotal> totals);

// Appends the totals of `in` to `out`, at most `max_totals` in all (out's earlier entries count).
// kOk, kMalformed (truncated, a varint too long, a count of 0), kBadField (flags, a first group
// without counter or spec, a bucket start out of range or not a multiple of bucket_ms, a node or
// total over 16 or 32 bits), kBadWindow (a spec window::validate refuses) or kTooManyEntries. On
// an error `out` holds what was decoded before it.
PeerError unpack_totals(std::span<const uint8_t> in, size_t max_totals,
                        std::vector<engine::RemoteTotal>& out);

}  // namespace sluice::cluster
