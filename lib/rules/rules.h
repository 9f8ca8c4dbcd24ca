// Rules: which limits apply to a request, and which counters they count in.
//
// A rules file (YAML, see docs/rules.md) declares domains; a domain holds rules, plans and an
// allowlist. `parse_rules` turns the text into a `RuleSet` or into errors that name the file, the
// line and the field. `Policy::compile` combines a RuleSet with the runtime overrides into an
// immutable, thread-safe snapshot whose `resolve` is the hot path: it maps one request to the
// rules that apply and, per limit, the 64-bit identity of the counter it counts in.
//
// Counter identity (stable across reloads and identical on every node that shares `hash_seed`):
//   key_hash = XXH3(the values of the rule's key entries in rule order, each length-prefixed;
//                   seed = XXH3(domain, rule name, key entry names; hash_seed))
//   counter  = high 32 bits of key_hash | low 32 bits of XXH3(key_hash, window_ms, bucket_ms)
// so a rule that survives a reload keeps its counters, a changed window starts a new counter, and
// a changed limit value (an override, another plan) keeps counting in the same one.
//
// Overrides keep the counts: an override (or plan assignment) whose windows or buckets differ from
// the limits the key was under counts in other counters. The compiled Policy remembers, per key,
// the limit sets it was under before (while their counts can still be in a window), and resolve
// lists their counters (`CarrySource`), from which the engine seeds the new ones the first time it
// uses them after a policy change: the same in reverse when the override is deleted or expires.
//
// Thread safety: RuleSet and Overrides are plain values (no internal locking). A Policy is
// immutable after compile() and may be shared by any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "window/gcra.h"
#include "window/sliding_window.h"

namespace sluice::rules {

enum class Mode : uint8_t {
  kEnforce,  // deny over the limit
  kDryRun,   // count and report "would deny", always allow
  kShadow,   // deny, and tell the caller to fail silently (shadow ban)
};
std::string_view to_string(Mode m);
std::optional<Mode> parse_mode(std::string_view s);  // "enforce" | "dry-run" | "shadow"

// How the cluster keeps a rule's counters (docs/architecture.md, "The cluster"). Single node: no
// effect. kLease: the owner decides, as kOwner, and grants the other nodes that see the key's
// traffic slices of its remaining budget, which they answer from without asking (docs/rules.md).
enum class Consistency : uint8_t { kOwner, kGossip, kLease };
// Decided by the key's owner (owner and lease modes): routed, taken over, and fallen back on as
// owner mode is.
inline bool owner_decides(Consistency c) {
  return c != Consistency::kGossip;
}
std::string_view to_string(Consistency c);

// Owner mode: how a node decides a check whose owner did not answer in time (or cannot be sent
// to). kShare: by what it knows, and admitting at most limit / members of its own hits in the
// window, so the nodes deciding alone together stay within the limit; kDeny: denied.
enum class Fallback : uint8_t { kShare, kDeny };
std::string_view to_string(Fallback f);

// How a limit decides (docs/rules.md, "Algorithms").
enum class Algorithm : uint8_t {
  kWindow,  // N requests per sliding window (the rule's estimator)
  kGcra,    // a rate with a burst allowance (window/gcra.h)
  // At most `requests` (max_in_flight) admitted checks hold a lease at once; a lease is held
  // until released or until its time to live (spec.window_ms, lease_ttl) is over
  // (window/concurrency.h).
  kConcurrency,
  // redis-cell's CL.THROTTLE (window/cell.h): not in rules files; a check carries it
  // (CheckRequest::cell) and it replaces every rule of the domain.
  kCell,
};
std::string_view to_string(Algorithm a);

// One limit: "N requests per window", a GCRA rate with a burst, or N leases in flight.
struct Limit {
  std::string name;  // shown to callers; defaults to "<rule>:<N>/<window>" e.g. "per-ip:100/1m"
  uint64_t requests = 0;  // GCRA: the burst, the most admitted at once; concurrency: max_in_flight
  window::WindowSpec
      spec;  // GCRA: window::gcra_window(gcra); concurrency: lease_ttl and its buckets
  Algorithm algorithm = Algorithm::kWindow;
  // A window limit whose bucket is the window's default (no granularity given): its counts carry
  // over from the counter of the older default for one window after a start (window.h,
  // legacy_default_bucket_ms), so an upgrade that changed the default loses none.
  bool default_bucket = false;
  // GCRA only: the rate as written ("10/1s": rate_requests per rate_period_ms), and the spec
  // worked out from it and the burst.
  uint64_t rate_requests = 0;
  int64_t rate_period_ms = 0;
  window::GcraSpec gcra{};
};

// "100/1m", "10/1s", "3000/10m", "500/1d", "20/90s": N per duration (units ms, s, m, h, d).
// An invalid_argument Status gives the reason. bucket_ms 0 = the window's default.
Status parse_limit(std::string_view text, int64_t bucket_ms, Limit& out);
// A GCRA limit: `rate` is "N/duration" (e.g. "10/1s"), `burst` the most admitted at once. An
// invalid_argument Status gives the reason (a zero rate or burst, a refill over 24 days).
Status parse_gcra(std::string_view rate, uint64_t burst, Limit& out);
// A concurrency limit: at most `max_in_flight` leases held at once, each for at most `lease_ttl_ms`
// (plus part of a bucket: window/concurrency.h); bucket_ms 0 = lease_ttl / 10 when that is a
// whole number of ms, else lease_ttl. An invalid_argument Status gives the reason.
Status parse_concurrency(uint64_t max_in_flight, int64_t lease_ttl_ms, int64_t bucket_ms,
                         Limit& out);
// The window a caller is told about a limit (answers, RateLimit headers, Envoy's unit): a window
// limit's window; a GCRA limit's time to refill its whole burst from empty, in ms rounded up.
int64_t reported_window_ms(const Limit& l);
// "1s", "15m", "250ms" -> milliseconds; nullopt when malformed.
std::optional<int64_t> parse_duration_ms(std::string_view text);
// 60000 -> "1m", 1500 -> "1500ms": the shortest exact form.
std::string format_duration(int64_t ms);

struct Condition {
  std::string key;
  std::string value;  // "*" matches any value (the entry must be present)
};

struct Rule {
  std::string name;              // unique within its domain
  std::vector<Condition> match;  // all must hold for the rule to apply
  std::vector<std::string> key;  // descriptor entries forming the counter key, in order;
                                 // the rule applies only when all are present
  std::vector<Limit> limits;     // used when the rule takes no plan
  std::string plan_from;         // descriptor entry naming the plan; "" = no plans
  std::string default_plan;      // plan when the entry is absent or names no known plan
  Mode mode = Mode::kEnforce;
  bool count_denied = false;  // denied requests count against the window too
  window::Estimator estimator = window::Estimator::kWeighted;
  Consistency consistency = Consistency::kOwner;
  Fallback fallback = Fallback::kShare;  // owner and lease modes only
  int line = 0;                          // where it was declared (1-based), for messages
  // Set only by the envoyproxy/ratelimit import (docs/envoy-config.md); the gRPC front acts on
  // them, resolve does not: the rule names whose limits this one replaces, and quota mode.
  std::vector<std::string> replaces;
  bool quota_mode = false;
};

struct Plan {
  std::string name;
  std::vector<Limit> limits;
};

// A descriptor entry whose requests are never limited (nor counted) in its domain.
struct AllowEntry {
  std::string key;
  std::string value;
};

// One node of an envoyproxy/ratelimit descriptor tree (docs/envoy-config.md). Its composite key
// is `key`, or `key_value` when a value is given; '*' in it makes it a wildcard pattern.
struct EnvoyNode {
  std::string key;
  std::string value;  // "" = any value (the key-only default)
  int32_t rule = -1;  // into Domain::rules; -1 = no limit here
  bool unlimited = false;
  int line = 0;
  std::vector<EnvoyNode> children;
};

struct Domain {
  std::string name;
  std::vector<Rule> rules;
  std::vector<Plan> plans;
  std::vector<AllowEntry> allowlist;
  // From an envoyproxy/ratelimit file: rules apply by walking `envoy_tree` (upstream's GetLimit),
  // not by match/key, and requests may repeat an entry key.
  bool envoy = false;
  std::vector<EnvoyNode> envoy_tree;
  std::string source;  // the file it was loaded from (envoy domains), for messages
};

struct RuleSet {
  std::vector<Domain> domains;
};

struct ParseError {
  std::string file;
  int line = 0;       // 1-based; 0 when the error is not tied to a line
  std::string field;  // path of the field, e.g. "domains[0].rules[2].limits[1]"
  std::string message;
  std::string to_string() const;  // "rules.yaml:12: domains[0].rules[2].limits[1]: <message>"
};

struct ParseResult {
  std::optional<RuleSet> rules;    // set iff errors is empty
  std::vector<ParseError> errors;  // every problem found, in file order
};

// Parses and validates rules text. `file` only names the source in errors.
ParseResult parse_rules(std::string_view text, std::string_view file);
// Reads and parses a file; an unreadable file is one error naming it.
ParseResult load_rules_file(const std::string& path);

// envoyproxy/ratelimit config files (docs/envoy-config.md): one domain per file, a directory
// loads every *.yaml / *.yml in it (by name, not recursive); two files with one domain is an error.
struct EnvoyImportOptions {
  bool count_denied = true;  // upstream counts every hit, denied or not
};
ParseResult parse_envoy_rules(std::string_view text, std::string_view file,
                              const EnvoyImportOptions& options);
ParseResult load_envoy_rules(const std::string& path_file_or_dir,
                             const EnvoyImportOptions& options);
// Upstream's units: second .. year (week 7 d, month 30 d, year 365 d), any case; nullopt if none.
std::optional<int64_t> envoy_unit_ms(std::string_view unit);
// The unit name of a window that is one ("minute"), else "".
std::string_view envoy_unit_name(int64_t window_ms);
// Appends `extra`'s domains to `into`; a domain in both is an error naming both sources.
std::vector<ParseError> merge_rule_sets(RuleSet& into, RuleSet extra, std::string_view into_file,
                                        std::string_view extra_file);
// Sluice's rules-file YAML for a RuleSet (`sluicectl rules convert`); envoy domains carry comments
// where the format cannot express the tree walk.
std::string to_rules_yaml(const RuleSet& rules);

// A runtime override for one counter key: new limits, a plan, and/or a mode, optionally expiring.
// It applies to every rule of the domain whose key entries are exactly the override's entries.
struct Override {
  std::string domain;
  std::vector<std::pair<std::string, std::string>> entries;  // key=value, any order
  // Empty = keep the rule's (or plan's) limits. A limit whose spec.bucket_ms is 0 names no
  // granularity: it takes the bucket of the rule's limit with the same window (so it keeps
  // counting in the same counter), else the finest of the rule's buckets that divides its window,
  // else the window's default.
  std::vector<Limit> limits;
  std::string plan;           // "" = keep; else the plan's limits (a plan assignment)
  std::optional<Mode> mode;   // nullopt = keep the rule's mode
  int64_t expires_at_ms = 0;  // 0 = never
};

// The identity of an override: its domain and entries in key order, length-prefixed (so no
// choice of bytes makes two overrides collide). Stores key overrides by it.
std::string override_id(std::string_view domain,
                        std::span<const std::pair<std::string, std::string>> entries);

// The in-memory overrides table (persistence is lib/store's). Not thread-safe: one owner makes
// changes and publishes them by compiling a new Policy.
class Overrides {
 public:
  // Validates (domain and entries non-empty, limits valid, no duplicate entry keys) and stores,
  // replacing any override with the same domain and entries; invalid_argument with the reason.
  Status set(Override o);
  const Override* get(std::string_view domain,
                      std::span<const std::pair<std::string, std::string>> entries) const;
  bool del(std::string_view domain, std::span<const std::pair<std::string, std::string>> entries);
  // Drops overrides that expired at or before now; returns how many.
  size_t prune(int64_t now_ms);
  std::vector<Override> list() const;  // sorted by domain, then entries
  size_t size() const { return by_id_.size(); }

 private:
  std::unordered_map<std::string, Override> by_id_;  // id: domain and sorted entries
};

// ---- the hot path ----------------------------------------------------------------------------

struct Descriptor {
  std::string_view key;
  std::string_view value;
};

// A check's own redis-cell limit (window/cell.h: CL.THROTTLE) in place of any rule of its domain.
// The key's state is one arrival time, counted under the domain and all the check's entries (keys
// and values, in order) whatever T and L are, so they may change on every call and the state
// carries over, as in redis-cell. Invalid values (T < 1, L < 1, T x L or T x quantity past int64)
// are refused as kBadLimitOverride. A cell check is not subject to the domain's allowlist.
struct CellCheck {
  int64_t interval_ns = 0;  // T (window::CellParams)
  int64_t limit = 0;        // L = max_burst + 1
  int64_t quantity = 1;     // 0 peeks, below 0 refunds
  // Not a check but a reset (redis `DEL key`): drops the key's state. Decision::allowed says
  // whether there was any (an arrival time not before now: the key existed in redis-cell's terms).
  bool reset = false;
  // The call's time in ns, used when it lies within the batch's millisecond (Engine::check's
  // now_ms); 0 or any other value: now_ms x 10^6.
  int64_t now_ns = 0;
};

// The window spec cell limits' counters live under (one for all, whatever their T and L): a GCRA
// spec of one second, so a key's counter expires (and is swept) one to two seconds after its
// arrival time has passed, when it decides like no state at all.
window::WindowSpec cell_window_spec();

struct CheckRequest {
  std::string_view domain;
  std::span<const Descriptor> descriptors;
  uint64_t hits = 1;  // 0 asks without counting (denied only when already over a limit)
  // The request's own limit (Envoy's per-descriptor `limit`): when set, the check is limited by
  // this many requests per this window instead of any rule, counted under the domain and all its
  // entries. The window must be one of envoy_unit_ms's.
  bool has_limit_override = false;
  uint64_t limit_override_requests = 0;
  int64_t limit_override_window_ms = 0;
  // Not a check but the release of lease `release`, granted for the same domain and entries
  // (engine.h, "Leases"). `hits` is ignored.
  bool is_release = false;
  uint64_t release = 0;
  // Leased quotas (consistency: lease), at the key's owner: node `slice_for` (another member)
  // asks for a slice of `slice_want` hits of the request's lease limits (engine.h, Decision).
  uint32_t slice_want = 0;
  uint16_t slice_for = 0;
  // A redis-cell limit instead of any rule (CellCheck); owned by the caller, like descriptors.
  // `hits` is ignored (the quantity is CellCheck's).
  const CellCheck* cell = nullptr;
};

// Bounds on hostile or mistaken input, enforced by resolve().
struct InputLimits {
  size_t max_descriptors = 32;
  size_t max_entry_bytes = 256;  // a descriptor key or value
  uint64_t max_hits = 1'000'000'000;
};

enum class CheckError : uint8_t {
  kNone,
  kEmptyDomain,
  kUnknownDomain,
  kTooManyDescriptors,
  kEntryTooLong,
  kEmptyDescriptorKey,
  kDuplicateDescriptor,
  // For a cell check (CheckRequest::cell), decided by the engine: a refund a millisecond or more
  // past what the key had in use (window::CellError::kOverRefund), with nothing written.
  kHitsTooLarge,
  // A limit override whose window is not one of the units, or an invalid cell limit.
  kBadLimitOverride,
  // Answers to a release (CheckRequest::is_release), decided by the engine: nothing changed.
  kLeaseUnknown,   // no lease of that id was granted for these entries (or none applies)
  kLeaseExpired,   // the lease's time to live is over
  kLeaseReleased,  // released before
};
std::string_view to_string(CheckError e);

struct CompiledRule;  // private to the part

// One limit a request is subject to.
struct AppliedLimit {
  const Limit* limit;   // owned by the Policy
  uint64_t counter;     // counter identity
  uint32_t spec_index;  // into Policy::window_specs(); equals limit->spec
  uint64_t requests;    // the limit in force: limit->requests, or the request's limit override
};

// A counter the key counted in under a limit set it was under before its current one (an
// override set, changed, deleted or expired). The engine seeds each of the rule's counters from
// these (engine.h, "Overrides keep the counts").
struct CarrySource {
  uint64_t counter;     // counter identity, as AppliedLimit::counter
  uint32_t spec_index;  // into Policy::window_specs()
  uint32_t rule;        // the AppliedRule whose counters it seeds: into Resolution::rules
  uint32_t group;       // one per former limit set: the counters of a group counted the same hits
};

// One rule that applies to a request.
struct AppliedRule {
  const Rule* rule;      // owned by the Policy
  uint32_t stats_index;  // index into the policy's per-rule stats slots
  Mode mode;             // after overrides
  bool overridden;
  uint32_t first_limit;  // into Resolution::limits
  uint32_t num_limits;
};

// The outcome of resolving one request.
struct ResolvedRequest {
  CheckError error = CheckError::kNone;
  bool allowlisted = false;
  uint32_t first_rule = 0;  // into Resolution::rules
  uint32_t num_rules = 0;
  uint32_t first_carry = 0;  // into Resolution::carry, by rule; none for almost every request
  uint32_t num_carry = 0;
};

// Caller-owned scratch that a batch of resolve() calls append to; clear() keeps capacity, so a
// reused Resolution allocates nothing once warm.
struct Resolution {
  std::vector<AppliedRule> rules;
  std::vector<AppliedLimit> limits;
  std::vector<CarrySource> carry;
  void clear() {
    rules.clear();
    limits.clear();
    carry.clear();
  }
};

class Policy {
 public:
  // Compiles rules and the overrides in force. Overrides for unknown domains, or whose entries
  // match no rule's key, are kept in `overrides` but have no effect. `hash_seed` must be the same
  // on every node of a cluster.
  //
  // `previous`: the policy this one replaces, at `now_ms`. Every key whose limits change between
  // the two (an override set, changed to other windows or buckets, deleted, or expired) keeps, in
  // this policy, the limit sets it was under before, for as long as their counts can be in a
  // window; resolve lists their counters as CarrySource. Without it, nothing carries over.
  static std::shared_ptr<const Policy> compile(RuleSet rules, const Overrides& overrides,
                                               uint64_t hash_seed, InputLimits input = {},
                                               const Policy* previous = nullptr,
                                               int64_t now_ms = 0);
  ~Policy();
  Policy(const Policy&) = delete;
  Policy& operator=(const Policy&) = delete;

  // Appends what applies to `req` at now (overrides expire by now) to `out`, with the counters
  // of the limit sets the key was under before (CarrySource: only for keys whose override changed
  // within a window). Never allocates once `out` is warm; never throws.
  ResolvedRequest resolve(const CheckRequest& req, int64_t now_ms, Resolution& out) const;
  // The same, into `res` (the engine's batch: a ResolvedRequest returned through the stack and
  // copied into place was read back in wider pieces than it was written, which the store buffer
  // cannot forward).
  void resolve(const CheckRequest& req, int64_t now_ms, Resolution& out,
               ResolvedRequest& res) const;

  // Envoy domains (Domain::envoy): the rule upstream's tree walk reaches for `entries` (nullptr:
  // none), `unlimited` set when it reaches an unlimited node. Counts nothing; never allocates.
  const Rule* envoy_rule(std::string_view domain, std::span<const Descriptor> entries,
                         bool& unlimited) const;
  bool is_envoy_domain(std::string_view domain) const;
  // Whether any rule of the domain has `replaces` or `quota_mode` (the front pre-walks only then).
  bool domain_has_replaces(std::string_view domain) const;

  const RuleSet& rules() const;
  const InputLimits& input_limits() const;
  uint64_t hash_seed() const;
  // Per-rule stats slots: one per rule of every domain, in declaration order; names are
  // "<domain>/<rule>"; then one per domain for requests with a limit override,
  // "<domain>/limit-override"; then one per domain for cell checks, "<domain>/cell". Stable for
  // the life of the Policy.
  size_t num_stats_slots() const;
  std::string_view stats_name(uint32_t index) const;
  // Every distinct window spec any limit (rules, plans, overrides) uses, and the specs of the
  // older default buckets their counts carry from after a start (Limit::default_bucket).
  std::span<const window::WindowSpec> window_specs() const;

  struct Impl;

 private:
  explicit Policy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The counter identity for the given key values of a rule (used by resolve, and by tools that
// inspect a key): key_hash then mixed with the spec.
uint64_t key_hash(uint64_t hash_seed, std::string_view domain, const Rule& rule,
                  std::span<const std::string_view> values);
uint64_t counter_id(uint64_t key_hash, const window::WindowSpec& spec);
// The counter of one limit of the key (a GCRA limit's mixes its rate and burst as well).
uint64_t counter_id(uint64_t key_hash, const Limit& limit);
// What places a counter on the cluster's hash ring: the part of its id that every window of the
// same key shares.
inline uint64_t routing_key(uint64_t counter) {
  return counter >> 32;
}

}  // namespace sluice::rules
