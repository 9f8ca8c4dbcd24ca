# The client <-> node check protocol (docs/protocol.md).
#
# Versioning: fields are only ever added, with new ordinals, so an old reader skips what it does
# not know and a new reader sees defaults in an old message. `version` says which revision of
# these rules the sender followed; a node answers `unsupportedVersion` only for a major version it
# cannot serve.
@0xed0130d469a7a423;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("sluice::schema");

struct Entry {
  key @0 :Text;
  value @1 :Text;
}

struct Check {
  domain @0 :Text;
  entries @1 :List(Entry);
  hits @2 :Int64 = 1;   # signed so that a negative cost is seen and refused, not wrapped
  limitOverride @3 :LimitOverride;  # absent: the rules decide
  release @4 :Release;              # present: not a check but the release of a lease
  cellLimit @5 :CellLimit;          # present: redis-cell's CL.THROTTLE instead of any rule
}

# A check's own redis-cell limit (docs/protocol.md, "Cell limits"): a GCRA of interval T and
# limit L (max_burst + 1) instead of any rule, counted under the domain and all the check's
# entries whatever T and L are. `hits` is ignored. T >= 1, L >= 1, T x L and T x quantity within
# Int64, else the check is answered `malformed`.
struct CellLimit {
  intervalNs @0 :Int64;    # T
  limit @1 :Int64;         # L
  quantity @2 :Int64 = 1;  # 0 peeks, below 0 refunds
  reset @3 :Bool;          # not a check: drop the key's state; `allowed` answers whether it held any
}

# Gives back a lease a concurrency limit granted (docs/protocol.md, "Leases"). It travels as a
# Check with the same domain and entries as the check that acquired the lease, so it reaches the
# same owner, and is answered by a Decision: `ok` when it freed the lease's slot; `leaseReleased`
# when the lease was released before; `leaseExpired` when its time to live is over (a lease id
# carries its expiry in whole seconds in its high 32 bits: an id the node does not hold whose
# time has passed, forged or not, is `leaseExpired` too); `leaseUnknown` when no lease of that id
# was granted for these entries (forged, mistyped, other entries, or granted by a node that has
# since restarted). Only `ok` changes anything. `hits` is ignored.
struct Release {
  lease @0 :UInt64;
}

# A check's own limit (Envoy's per-descriptor `limit`): this many requests per this window
# instead of any rule. A pointer, not two fields, so a check without one costs 8 bytes more, not
# 16. The window is one of second, minute, hour, day, week (7 d), month (30 d), year (365 d) in
# ms, and requests at most 2^40; otherwise the check is answered `malformed`.
struct LimitOverride {
  requests @0 :UInt64;
  windowMs @1 :Int64;
}

struct CheckRequest {
  version @0 :UInt16 = 1;
  id @1 :UInt64;              # echoed in the answer; TCP answers may come back in any order
  checks @2 :List(Check);
  padding @3 :Data;           # UDP: room the client gives the answer (no amplification)
  forwarded @4 :Bool;         # sent by a node to a key's owner: decide here, never forward again
  redirected @5 :Bool;        # with forwarded: sent on by a key's owner that has just joined to
                              # the owner before it, which decides it whatever its own ring says
  slices @6 :SliceAsk;        # with forwarded: leased quotas (consistency: lease) asked or returned
}

# Leased quotas (`consistency: lease`, docs/architecture.md "Leased quotas"): between nodes only,
# honoured under the cluster's tag. A node that is not a key's owner asks the owner for a slice of
# the key's remaining budget, answers checks from it without a round trip, and gives back what
# it did not use.
struct SliceAsk {
  node @0 :UInt16;                # the node asking (and returning): the slices are its
  wants @1 :List(UInt32);         # per check of the request: hits wanted for its lease limits
  returns @2 :List(SliceReturn);  # slices given back: their owner counts `used`, frees the rest
}

struct SliceReturn {
  counter @0 :UInt64;  # the limit's counter id, as both nodes compute it
  id @1 :UInt64;       # the slice's id, from its SliceGrant
  used @2 :UInt32;     # hits the node admitted from it
  uses @3 :List(UInt32);  # the same per step after the request that got the slice was sent:
                          # uses[i] within [i, i + 1) x stepMs of it (at most 256)
  stepMs @4 :UInt32;
}

# A slice granted with the answer to check `check`: `hits` more hits of each of its lease limits,
# usable for `ttlMs` from when the node sent the request (never after: the owner counts it as
# held until then).
struct SliceGrant {
  check @0 :UInt32;
  hits @1 :UInt32;
  ttlMs @2 :UInt32;
  id @3 :UInt64;
}

enum Mode {
  enforce @0;
  dryRun @1;
  shadow @2;
}

enum Code {
  ok @0;
  # per check
  emptyDomain @1;
  unknownDomain @2;
  tooManyEntries @3;
  entryTooLong @4;
  emptyEntryKey @5;
  duplicateEntry @6;
  hitsTooLarge @7;
  negativeHits @8;
  noRoom @9;               # the node's memory cap left no room: allowed, not counted
  # per request
  malformed @10;           # not a Cap'n Proto message of this schema, or over its limits
  tooManyChecks @11;
  unsupportedVersion @12;
  tooLarge @13;
  # per check, answering a release
  leaseUnknown @14;
  leaseExpired @15;
  leaseReleased @16;       # already released: nothing changed
}

struct LimitStatus {
  name @0 :Text;
  limit @1 :UInt64;
  windowMs @2 :Int64;
  remaining @3 :UInt64;
  resetMs @4 :Int64;
  retryAfterMs @5 :Int64;  # 0 unless exceeded; -1 = never (cost above the limit)
  mode @6 :Mode;
  exceeded @7 :Bool;
  resetNsShort @8 :Int32;  # cell limits: how far short of resetMs x 10^6 the exact reset (the
                           # key's arrival time - now) is, in ns, 0..999999; 0 for other limits
}

struct Decision {
  code @0 :Code;
  allowed @1 :Bool;
  wouldDeny @2 :Bool;
  shadow @3 :Bool;
  allowlisted @4 :Bool;
  limits @5 :List(LimitStatus);
  lease @6 :UInt64;        # granted by the concurrency limits that admitted the check; 0 = none
}

struct CheckAnswer {
  version @0 :UInt16 = 1;
  id @1 :UInt64;
  code @2 :Code;             # request-level: ok, or why no decision was made
  decisions @3 :List(Decision);
  truncated @4 :Bool;        # limit details were dropped to keep a UDP answer within budget
  slices @5 :List(SliceGrant);  # between nodes only: slices granted (SliceAsk)
}
