// The node<->node datagram codec: authenticated envelopes around the cluster messages of
// messages.h, and the replay guard that goes with them. See schema/peer.capnp.
//
// A datagram is `[Envelope: one Cap'n Proto message][HMAC-SHA256 tag, 32 bytes]`. The tag covers
// every message byte and is keyed with HMAC-SHA256(cluster secret, "sluice/peer/v1"), so the raw
// secret is never used as a key for anything but that derivation. A receiver checks size, then
// the tag (constant-time compare), and only then parses anything; every later step (version,
// sender, clock skew, replay, kind, payload bounds) can only drop a datagram of a peer holding the
// secret, which makes those drops bugs or misconfiguration worth counting, not attacks.
//
// The envelope names the sender, its boot id (chosen at the sender's start, e.g. wall-clock ms,
// so a restarted sender is newer), a per-boot sequence number (1, 2, ...), the sender's
// wall-clock send time and the kind of payload. A receiver accepts a datagram once: see
// ReplayGuard. Replay is bounded further by the clock-skew check: a datagram captured now is
// refused everywhere once `max_clock_skew_ms` has passed, including by a receiver that restarted
// and forgot what it had seen.
//
// Every rejection is a PeerError value; no exception leaves open() for any input bytes. Nothing
// here reads the clock: `now_ms` is a parameter.
//
// Thread safety: a PeerCodec belongs to one thread, the one that owns the node's peer socket
// (other threads post their messages to it). Sequence numbers must be unique per (sender, boot),
// so a node seals with exactly one PeerCodec. ReplayGuard is likewise single-threaded.
//
// Allocation: open() allocates nothing once `out` is warm (it has held as many gossip entries,
// sync totals and string bytes before), and seal() allocates nothing once `out` has held a
// datagram as large. Exceptions: the first datagram from a sender adds a ReplayGuard entry;
// rejecting a malformed message allocates (the kj::Exception Cap'n Proto throws) and so does
// rejecting an invalid window spec (window::validate's message). OpenSSL 3.0 allocates its digest
// state on every HMAC init (two blocks of ~100 bytes per tag, measured), which no public OpenSSL
// 3.0 API avoids.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/release.h"
#include "base/status.h"
#include "cluster/messages.h"
#include "cluster/override_table.h"

namespace sluice::cluster {

inline constexpr uint16_t kPeerVersion = 1;
inline constexpr size_t kPeerTagBytes = 32;       // HMAC-SHA256
inline constexpr size_t kMinSecretBytes = 16;     // the cluster secret, before derivation
inline constexpr size_t kMaxPeerNameBytes = 255;  // Member::name and Member::host

// What the envelope carries. The reserved kinds are not implemented yet: open() drops them as
// kUnknownKind, and this codec cannot seal them.
enum class PeerKind : uint8_t {
  kMembership = 0,     // MembershipMessage
  kSync = 1,           // SyncBatch
  kForward = 2,        // reserved: a forwarded check batch
  kForwardAnswer = 3,  // reserved: the owner's answers to a forwarded batch
  kHandoff = 4,        // reserved: bulk handoff of a key range
  kOverrides = 5,      // OverrideSyncMessage (override_table.h)
};
std::string_view to_string(PeerKind k);  // "membership", "sync", "forward", ...

// Why a datagram was dropped (open) or could not be built (seal). to_string gives a stable
// snake_case name for /metrics labels.
// New reasons go at the end: tests/fuzz/peer_fuzz.cc names the last one.
enum class PeerError : uint8_t {
  kOk = 0,
  kMalformed,       // not one Cap'n Proto message of the schema (truncated, bad pointers, ...)
  kTooLarge,        // over PeerLimits::max_datagram_bytes
  kBadTag,          // the HMAC tag does not match: wrong secret, or altered in transit
  kWrongVersion,    // envelope version is not kPeerVersion
  kUnknownKind,     // a kind this build does not implement (reserved or newer)
  kFromSelf,        // sender is this node: a reflected datagram, or two nodes share an id
  kClockSkew,       // send time further than max_clock_skew_ms from the receiver's now
  kStaleBoot,       // an older boot id of the sender than one already seen
  kReplayed,        // this (boot, seq) was accepted before
  kTooOld,          // seq is older than the replay window (ReplayGuard::kWindow)
  kTooManyEntries,  // gossip or sync totals over their PeerLimits
  kStringTooLong,   // a name or host over kMaxPeerNameBytes
  kBadField,        // an enum out of range, an empty or unprintable name, a host that is not
                    // an IP literal, a null payload, sync totals both listed and packed, a
                    // packed field out of range (sync_pack.h)
  kBadWindow,       // a sync total whose window spec fails window::validate
  kReleaseOutsideWindow,  // the sender's release is outside this node's compatibility window
                          // (base/release.h): header.release says which it is
};
std::string_view to_string(PeerError e);  // "ok", "malformed", "bad_tag", ...

struct PeerLimits {
  size_t max_datagram_bytes = 65'507;  // the largest UDP payload over IPv4 (~64 KiB)
  size_t max_gossip = 64;              // MembershipMessage::gossip entries
  size_t max_totals = 2'048;           // SyncBatch::totals; 32 bytes each on the wire, so at the
                                       // default datagram size the size binds first (2'043 fit)
  int64_t max_clock_skew_ms = 30'000;  // either way
  size_t max_override_records = 512;   // OverrideSyncMessage::records; a record's strings are
                                       // bounded by OverrideBounds (at most ~19 KB each)
};

// The authenticated header of a datagram.
struct PeerHeader {
  NodeId sender = 0;
  uint64_t boot_id = 0;
  uint64_t seq = 0;
  int64_t sent_ms = 0;
  PeerKind kind = PeerKind::kMembership;
  Release release = kUnrecordedRelease;  // the sender's (major and minor; 0.2 when unrecorded)
};

// The output of open(); reuse one across calls so that decoding stops allocating. Only the
// payload that header.kind names is written; the other keeps whatever it held. Payloads carry no
// sender of their own: `from` is set to header.sender.
struct PeerMessage {
  PeerHeader header;
  MembershipMessage membership;   // header.kind == kMembership
  SyncBatch sync;                 // header.kind == kSync
  OverrideSyncMessage overrides;  // header.kind == kOverrides
};

// Per sender: the newest boot id seen and a sliding window of the last kWindow sequence numbers
// of that boot. Accepts each (boot, seq) once, in any order within the window; a newer boot id
// starts a fresh window, an older one is refused. Memory: ~150 bytes per sender ever accepted.
class ReplayGuard {
 public:
  static constexpr uint64_t kWindow = 1'024;

  // kOk if the datagram is new; else kStaleBoot, kReplayed or kTooOld. Changes nothing.
  PeerError check(NodeId sender, uint64_t boot_id, uint64_t seq) const;
  // Marks (boot, seq) seen; meant for a datagram check() found new (a stale boot or a seq behind
  // the window is ignored).
  void record(NodeId sender, uint64_t boot_id, uint64_t seq);
  // check(), then record() when it is new.
  PeerError admit(NodeId sender, uint64_t boot_id, uint64_t seq);

  // Drops what is known of a sender (e.g. a member removed for good). Its next datagram, of any
  // boot, is accepted as the first one.
  void forget(NodeId sender);
  size_t senders() const { return windows_.size(); }

 private:
  struct Window {
    uint64_t boot_id = 0;
    uint64_t top = 0;  // the largest seq seen in this boot
    std::array<uint64_t, kWindow / 64>
        seen{};  // bit (seq % kWindow), for seq in (top-kWindow, top]
  };
  std::unordered_map<NodeId, Window> windows_;
};

// The size a node keeps its sync datagrams within (DeltaSync's batches): one Ethernet frame's
// payload even over IPv6 inside a VXLAN overlay (1500 - 50 - 40 - 8 = 1402 bytes). A datagram
// that is never fragmented arrives whole or not at all; a fragmented one is lost with any of its
// fragments, and bulk totals sent as datagrams of tens of KB overflowed busy receivers' socket
// buffers. Receivers still accept any sync datagram up to PeerLimits::max_datagram_bytes.
inline constexpr size_t kSyncDatagramBytes = 1'400;

// How many totals one sealed SyncBatch of at most `datagram_bytes` holds (at least 1), and the
// size of a sealed SyncBatch of `totals` totals, in the list form.
size_t sync_totals_within(size_t datagram_bytes);
size_t sync_datagram_bytes(size_t totals);
// The same for the compact form (SyncBatch::compact): how many packed bytes (sync_pack.h,
// TotalsPacker::bytes) one sealed batch of at most `datagram_bytes` holds, and the size of a
// sealed batch of `packed` bytes.
size_t sync_packed_within(size_t datagram_bytes);
size_t sync_packed_datagram_bytes(size_t packed);
// True when a node of release `r` reads SyncBatch.packed (0.3 and later): a sender sets
// SyncBatch::compact only for such a receiver.
inline bool reads_packed_sync(const Release& r) {
  return r.major > 0 || r.minor >= 3;
}

// How many of `records`, from the first, one OverrideSyncMessage datagram holds under `limits`
// (at least 1 for any record within OverrideBounds at the default datagram size).
size_t fit_overrides(std::span<const OverrideRecord> records, const PeerLimits& limits);

class PeerCodec {
 public:
  // Ok when `secret` can key a cluster, else invalid_argument with a sentence saying why not (for
  // config checks).
  static Status check_secret(std::string_view secret);

  // `self` and `boot_id` go into every sealed envelope; sequence numbers start at 1. Throws
  // std::invalid_argument with check_secret()'s sentence for a secret under kMinSecretBytes, or
  // for limits that cannot hold an envelope; std::runtime_error if OpenSSL cannot set up
  // HMAC-SHA256.
  PeerCodec(std::string_view secret, NodeId self, uint64_t boot_id, PeerLimits limits = {});
  ~PeerCodec();
  PeerCodec(const PeerCodec&) = delete;
  PeerCodec& operator=(const PeerCodec&) = delete;

  // Seal a message into `out` (its contents replaced) with the next sequence number and `now_ms`
  // as the send time. The payload is validated with the receiver's rules first, so a message the
  // peers would drop is refused here with the same reason (out is then cleared and no sequence
  // number is used). `from` is not sent: the receiver takes the envelope's sender, self().
  PeerError seal(const MembershipMessage& m, int64_t now_ms, std::vector<uint8_t>& out);
  PeerError seal(const SyncBatch& b, int64_t now_ms, std::vector<uint8_t>& out);
  // Records over what one datagram holds are refused (kTooLarge): split with fit_overrides().
  PeerError seal(const OverrideSyncMessage& m, int64_t now_ms, std::vector<uint8_t>& out);

  // Checks and decodes one datagram received at `now_ms`. On kOk the datagram was recorded in the
  // replay guard (it will not be accepted again) and `out` holds it. On any other value nothing
  // was recorded and `out` holds unspecified (valid) contents.
  PeerError open(std::span<const uint8_t> datagram, int64_t now_ms, PeerMessage& out);

  NodeId self() const;
  uint64_t boot_id() const;
  uint64_t last_seq() const;  // of the last datagram sealed; 0 before the first
  const PeerLimits& limits() const;
  ReplayGuard& replay_guard();

  // Appends this cluster's tag over `bytes` to `bytes` (owner-mode checks forwarded to another
  // node's check port carry it, so a client cannot claim to be a node).
  void sign(std::vector<uint8_t>& bytes);
  // True when `datagram` is bytes followed by this cluster's tag over them (constant time).
  bool verify(std::span<const uint8_t> datagram);

  // Test hook: `out` = message + this codec's tag over it, so tests can put arbitrary bytes
  // (crafted pointers, out-of-range enums, other versions) under a valid tag.
  void TEST_sign(std::span<const uint8_t> message, std::vector<uint8_t>& out);
  // Test hook: seal as release `r` and judge senders as `r` would (kThisRelease by default), so
  // tests can be a node of another release.
  void TEST_set_release(Release r);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::cluster
