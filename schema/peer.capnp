# The node<->node peer protocol: membership and counter sync (docs/protocol.md, "Node to node").
@0x8f7c6f6beed8de66;

# One UDP datagram between nodes is [Envelope as a single-segment message][32-byte tag], the tag
# being HMAC-SHA256 over the message bytes with a key derived from the cluster secret
# (lib/cluster/peer_codec.h). Nothing here is read before the tag has been checked.
#
# Versioning follows check.capnp: fields are only ever added, with new ordinals. `version` names
# the revision of these rules; a receiver drops a datagram of another version (wrong_version).
# `from` of the C++ messages is not carried in payloads: the authenticated envelope's `sender` is
# the only sender there is.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("sluice::schema::peer");

enum Kind {
  membership @0;     # payload: Membership
  sync @1;           # payload: SyncBatch
  # Reserved. Owner-mode checks travel as check requests (check.capnp, `forwarded` set) to the
  # owner's check port, and handoff as SyncBatch with `handoff` set, so no node sends these; a
  # receiver drops them as unknown_kind.
  forward @2;
  forwardAnswer @3;
  handoff @4;
  overrides @5;      # payload: OverrideSync
}

struct Envelope {
  version @0 :UInt16 = 1;
  sender @1 :UInt16;       # NodeId
  bootId @2 :UInt64;       # chosen at the sender's start (wall-clock ms): a restart is newer
  seq @3 :UInt64;          # per boot, from 1, one per datagram
  sentMs @4 :Int64;        # the sender's wall clock when sealing
  kind @5 :Kind;
  payload @6 :AnyPointer;  # the struct `kind` names
  # The sender's release, major x 256 + minor (lib/base/release.h); 0 (absent: a sender before
  # 0.3) is 0.2. A receiver drops a datagram from outside its compatibility window, one minor
  # release either side (release_outside_window). In the first data word, beside version,
  # sender and kind: the envelope's size is what it was without it.
  release @7 :UInt16;
}

enum MemberState {
  alive @0;
  suspect @1;
  dead @2;
  left @3;
}

struct Member {
  id @0 :UInt16;
  name @1 :Text;
  host @2 :Text;
  peerPort @3 :UInt16;
  checkPort @4 :UInt16;
  adminPort @5 :UInt16;
  incarnation @6 :UInt32;
  state @7 :MemberState;
}

enum MembershipKind {
  ping @0;
  ack @1;
  pingReq @2;
  nack @3;
  join @4;
  joinReply @5;
}

struct Membership {
  kind @0 :MembershipKind;
  seq @1 :UInt32;
  target @2 :UInt16;
  gossip @3 :List(Member);
  # A `join` sent as an anti-entropy pull: the sender's view as one digest per bucket (a member
  # is in bucket id mod the list's length; the digest is the wrapping sum of a 64-bit hash of
  # each member's id, incarnation and state), at most 64. The `joinReply` then carries the
  # members of the buckets whose digests differ, and no member at all when every bucket
  # matches. Empty (a join, or a sender older than this field): the reply carries every member,
  # so old and new nodes serve each other.
  viewDigest @4 :List(UInt64);
  # The sender has no record of the recipient: it answered a `ping` or `pingReq` from a member
  # it does not know, and asks for the recipient's record (which the recipient then sends in a
  # `ping`). Only such answers are built as Membership without a digest; a sender older than
  # this field ignores unknown senders instead, and a receiver older than it ignores the field.
  unknownRecipient @5 :Bool;
}

# Membership's first four fields, laid out alike: what a node builds for a message without
# viewDigest, so that such a message does not carry viewDigest's empty pointer (8 bytes). Readers
# read it as a Membership whose viewDigest is empty, as they read a node's older than viewDigest.
# Never read as such; add a field here only with the same field in Membership.
struct MembershipNoDigest {
  kind @0 :MembershipKind;
  seq @1 :UInt32;
  target @2 :UInt16;
  gossip @3 :List(Member);
}

# Cluster-wide overrides and plan assignments (docs/architecture.md, "Overrides across the
# cluster"): versioned records, last writer wins, deletes as tombstones.
enum OverrideSyncKind {
  push @0;    # records just written: merge them
  digest @1;  # the sender's digest (count, hash): answer with `full` when yours differs
  full @2;    # one part of the sender's whole table
}

enum OverrideMode {
  keep @0;     # the rule's mode
  enforce @1;
  dryRun @2;
  shadow @3;
}

struct OverrideEntry {
  key @0 :Text;
  value @1 :Text;
}

struct OverrideLimit {
  name @0 :Text;
  requests @1 :UInt64;
  windowMs @2 :UInt32;
  bucketMs @3 :UInt32;
}

struct OverrideRecord {
  versionMs @0 :Int64;     # the writer's wall clock at the write
  versionNode @1 :UInt16;  # the writer; ties of versionMs go to the larger id
  deleted @2 :Bool;        # a tombstone: domain and entries only
  domain @3 :Text;
  entries @4 :List(OverrideEntry);
  limits @5 :List(OverrideLimit);
  plan @6 :Text;
  mode @7 :OverrideMode;
  expiresAtMs @8 :Int64;   # 0 = never
}

struct OverrideSync {
  kind @0 :OverrideSyncKind;
  count @1 :UInt32;        # the sender's digest: how many records it holds
  hash @2 :UInt64;         # and the sum of XXH3 over their canonical encodings
  wantFull @3 :Bool;       # `full`: the tables differed, send yours back
  records @4 :List(OverrideRecord);
}

# engine::RemoteTotal. Window and bucket fit 32 bits (at most a day in ms): 4 words per total.
struct RemoteTotal {
  counter @0 :UInt64;
  bucket @1 :Int64;
  windowMs @2 :UInt32;
  bucketMs @3 :UInt32;
  node @4 :UInt16;
  total @5 :UInt32;
}

struct SyncBatch {
  handoff @0 :Bool;
  totals @1 :List(RemoteTotal);
  # The newest `sentMs` the sender has received from the receiver (0: none yet), so the receiver
  # knows its own datagrams get through: a member is in reach only both ways (docs/architecture.md,
  # "Members out of reach"). Every node sends at least an empty batch to every member each
  # heartbeat period.
  heardMs @2 :Int64;
  # The totals in their compact form (lib/cluster/sync_pack.h: counter and spec once a run,
  # varints), in place of `totals`: sent only to a member whose datagrams say it is of release 0.3
  # or later (a receiver older than this field would read no totals). A receiver takes the totals
  # of both fields.
  packed @3 :Data;
}

# SyncBatch's first three fields, laid out alike: what a node builds for a batch without `packed`
# (list totals, heartbeats), so that such a batch does not carry packed's empty pointer (8 bytes).
# Never read as such; add a field here only with the same field in SyncBatch.
struct SyncBatchList {
  handoff @0 :Bool;
  totals @1 :List(RemoteTotal);
  heardMs @2 :Int64;
}
